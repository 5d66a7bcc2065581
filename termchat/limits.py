"""Limits where data enters: one rule per kind, written down once.

Everything termchat reads from outside (a server's replies, a state file, a
config or project file, a line typed or piped, a folder a store keeps) has a
size, a depth and a type limit here, checked before it is parsed, so nothing
from outside can make termchat recurse, grow without bound or hang. Past a
limit, one line names it (`Refused`, a ValueError).

- JSON: at most JSON_DEPTH levels of [ and {, found by a scan that does not
  recurse, before `json` (which recurses, and raises RecursionError at about
  1,000) sees the text.
- TOML: at most TOML_DEPTH levels of [ and {, at most TOML_KEY_PARTS parts in
  a dotted key or table header (tomllib handles 50,000 parts quadratically:
  46 s), and at most the caller's size.
- HTTP bodies read whole: at most their kind's size (read_body), streamed, so
  an endless body costs no more than that.
- Files: regular files only, opened without blocking on a FIFO, at most their
  kind's size (read_file).
- Folders walked: at most WALK_DEPTH levels and WALK_ENTRIES entries (walk),
  without recursion.
Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

JSON_DEPTH = 64  # vLLM's chunks nest 6 deep; state files 4
TOML_DEPTH = 32  # a termchat config nests 4 deep
TOML_KEY_PARTS = 32
LINE = 8 << 20  # one line of a server's stream, characters (SSE; client.SSELines)
ERROR_BODY = 64 << 10  # an HTTP error's body, bytes
METRICS_BODY = 8 << 20  # a /metrics page (vLLM's: about 100 KB)
MODELS_BODY = 1 << 20  # /v1/models
CONFIG_FILE = 1 << 20  # a config file, bytes
PROJECT_FILE = 64 << 10  # a project's .termchat.toml
STATE_FILE = 1 << 20  # termchat's own state and records (ui.json, approvals, bench records, formats.json)
UNDO_FILE = 64 << 20  # an undo record holds a file's old bytes (apply's own limit is lower)
MANIFEST_FILE = 1 << 20  # an Ollama manifest
CLASSIFY_LINE = 1 << 20  # one line of `termchat classify`'s input
WALK_DEPTH = 16  # folders below a store's root (Ollama: 4, LM Studio: 3, the HF cache: 5)
WALK_ENTRIES = 100_000


class Refused(ValueError):
    """Input past one of the limits above; str() is one line naming it."""


def _megabytes(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n / 1024:g} KiB"


# ---- depth ---------------------------------------------------------------------------------

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = re.compile(r"[^\[\]{}]+")


def _max_depth(skeleton: str) -> int:
    depth = deepest = 0
    for char in skeleton:
        if char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
        else:
            depth -= 1
    return deepest


def json_loads(text: str | bytes, what: str = "the JSON", depth: int = JSON_DEPTH):
    """json.loads, after checking the nesting without recursion; Refused (a
    ValueError) when it nests deeper than `depth`, ValueError when it is not JSON."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    if text.count("[") + text.count("{") > depth:  # cannot nest deeper otherwise: skip the scan
        if _max_depth(_BRACKETS.sub("", _JSON_STRING.sub("", text))) > depth:
            raise Refused(f"{what} nests deeper than {depth} levels, termchat's limit")
    try:
        return json.loads(text)
    except RecursionError:  # a backstop: the scan above keeps this from happening
        raise Refused(f"{what} nests deeper than {depth} levels, termchat's limit") from None


_TOML_SKIP = re.compile(r'"""(?:[^\\]|\\.)*?"""|\'\'\'.*?\'\'\'|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*', re.S)
_TOML_DOTTED = re.compile(r'(?:(?:[\w-]+|"")[ \t]*\.[ \t]*){%d,}' % TOML_KEY_PARTS)  # a key or table name of that many parts


def toml_loads(text: str, what: str = "the TOML file", limit: int = CONFIG_FILE) -> dict:
    """tomllib.loads within the TOML limits above; Refused past them
    (tomllib.TOMLDecodeError, a ValueError, for text that is not TOML)."""
    import tomllib

    if len(text) > limit:
        raise Refused(f"{what} is {_megabytes(len(text))}, over termchat's limit of {_megabytes(limit)}")
    skeleton = _TOML_SKIP.sub('""', text)
    if _max_depth(_BRACKETS.sub("", _TOML_SKIP.sub("", skeleton))) > TOML_DEPTH:
        raise Refused(f"{what} nests tables or arrays deeper than {TOML_DEPTH} levels, termchat's limit")
    if _TOML_DOTTED.search(skeleton):
        raise Refused(f"{what} has a dotted key or table name of more than {TOML_KEY_PARTS} parts, termchat's limit")
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise Refused(f"{what} nests tables or arrays deeper than {TOML_DEPTH} levels, termchat's limit") from None


# ---- sizes ---------------------------------------------------------------------------------


async def read_body(response, limit: int, what: str = "the body") -> bytes:
    """An httpx response's body, streamed, at most `limit` bytes; Refused past it."""
    parts, size = [], 0
    async for data in response.aiter_bytes():
        size += len(data)
        if size > limit:
            raise Refused(f"{what} is over {_megabytes(limit)}, termchat's limit")
        parts.append(data)
    return b"".join(parts)


def read_file(path: str | os.PathLike, limit: int, what: str | None = None, follow: bool = True) -> bytes:
    """The bytes of a regular file, at most `limit`; never blocks on a FIFO or
    reads a device. OSError (FileNotFoundError, IsADirectoryError...) for what
    cannot be opened; Refused for what is not a regular file or is too big.
    `follow=False`: a symlink is not followed (termchat's own files)."""
    what = what or str(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if not follow and exc.errno == 40:  # ELOOP: a symlink where termchat's own file belongs
            raise Refused(f"{what} is a symbolic link, not a file termchat wrote") from None
        raise
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(21, "Is a directory", str(path))
        if not stat.S_ISREG(info.st_mode):
            raise Refused(f"{what} is not a regular file (a FIFO, a device or a socket)")
        if info.st_size > limit:
            raise Refused(f"{what} is {_megabytes(info.st_size)}, over termchat's limit of {_megabytes(limit)}")
        data = os.read(fd, limit + 1)
        while len(data) <= limit:  # os.read may return less than asked
            more = os.read(fd, limit + 1 - len(data))
            if not more:
                break
            data += more
        if len(data) > limit:
            raise Refused(f"{what} grew past termchat's limit of {_megabytes(limit)} while read")
        return data
    finally:
        os.close(fd)


# ---- folders -------------------------------------------------------------------------------


def walk(root: Path, depth: int = WALK_DEPTH, entries: int = WALK_ENTRIES) -> Iterator[Path]:
    """Every file below `root` (symlinked files included, symlinked folders not
    entered), breadth first, at most `depth` folders down and `entries` entries
    seen in all; no recursion, so a folder nested 1,100 deep costs nothing."""
    queue, seen = [(Path(root), 0)], 0
    while queue:
        folder, level = queue.pop(0)
        try:
            with os.scandir(folder) as it:
                children = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        for entry in children:
            seen += 1
            if seen > entries:
                return
            try:
                if entry.is_dir(follow_symlinks=False):
                    if level + 1 < depth:
                        queue.append((Path(entry.path), level + 1))
                elif entry.is_file():
                    yield Path(entry.path)
            except OSError:
                continue
