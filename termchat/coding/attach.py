"""`/file PATH`: a text file as a fenced block with its language.

Binary files and files over MAX_BYTES are refused with a message that says
why and what to do; the prompt being written is kept by the callers.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pygments.lexers import get_lexer_for_filename
from pygments.util import ClassNotFound

from termchat.errors import UserError
from termchat.sanitize import NOT_UTF8, decoded

MAX_BYTES = 256 * 1024


def fenced_file(path_text: str, max_bytes: int = MAX_BYTES) -> tuple[str, str]:
    """The file as a fenced block, and a notice ("" when none): a file that
    is not valid UTF-8 is attached with U+FFFD where its bytes were not."""
    path = Path(path_text).expanduser()
    data = read_regular_file(path, max_bytes)
    if b"\x00" in data:
        raise UserError(f"/file: {path} is a binary file; only text files can be attached")
    text, replaced = decoded(data)
    notice = f"{path.name} {NOT_UTF8}" if replaced else ""
    try:
        language = get_lexer_for_filename(path.name, text).aliases[0]
    except (ClassNotFound, IndexError):
        language = ""
    fence = "````" if "```" in text else "```"
    return f"{path.name}:\n{fence}{language}\n{text.rstrip()}\n{fence}\n", notice


def read_regular_file(path: Path, max_bytes: int) -> bytes:
    """At most max_bytes of a regular file. Devices (/dev/zero), FIFOs and
    sockets are refused: opened without blocking, checked with fstat on the
    open descriptor (no race with a swapped path), read no further than the
    limit plus one byte, so nothing can freeze the UI or fill the memory."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise UserError(f"/file: {path} does not exist") from None
    except IsADirectoryError:
        raise UserError(f"/file: {path} is a folder; give a file") from None
    except OSError as exc:
        raise UserError(f"/file: cannot open {path}: {exc.strerror}") from None
    try:
        # checked on the descriptor before wrapping it: os.fdopen refuses a
        # folder with IsADirectoryError (on Linux a folder opens read-only)
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise UserError(f"/file: {path} is a folder; give a file")
        if not stat.S_ISREG(info.st_mode):
            raise UserError(f"/file: {path} is not a regular file (a device, a pipe or a socket); only text files can be attached")
        if info.st_size > max_bytes:
            raise UserError(_too_big(path, info.st_size, max_bytes))
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        try:
            data = handle.read(max_bytes + 1)
        except OSError as exc:
            raise UserError(f"/file: cannot read {path}: {exc.strerror}") from None
    if len(data) > max_bytes:  # it grew since fstat
        raise UserError(_too_big(path, len(data), max_bytes))
    return data


def _too_big(path: Path, size: int, max_bytes: int) -> str:
    return f"/file: {path} is {size / 1024:.0f} KiB, over the {max_bytes // 1024} KiB limit; attach a smaller file or the part you need"
