"""Applying a reply's code to files: see the change, write it whole, undo it.

A code block becomes the new content of one file; a block that is a unified
diff is applied as a patch to the files it names (and refused, saying which
hunk and why, when it does not fit). Nothing is written before the user has
seen the diff and said yes. Writes are atomic and keep the file's mode; the
contents they replace go on an undo stack in the state folder, so `/undo`
works after a restart too.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from termchat import limits, paths

from termchat.coding import project
from termchat.errors import UserError
from termchat.files import write_atomically

MAX_FILE_BYTES = 2 * 1024 * 1024  # a file to change is read whole, and shown as a diff
UNDO_KEEP = 20


class PatchError(UserError):
    """A patch that does not apply to the file as it is."""


@dataclass(frozen=True)
class Change:
    path: Path  # absolute
    old: str | None  # None: the file does not exist yet
    new: str
    mode: int = 0o644

    def diff(self, root: Path | None = None) -> str:
        name = _shown(self.path, root)
        return "".join(difflib.unified_diff((self.old or "").splitlines(True), self.new.splitlines(True), f"a/{name}" if self.old is not None else "/dev/null", f"b/{name}"))

    @property
    def unchanged(self) -> bool:
        return self.old == self.new


def _shown(path: Path, root: Path | None) -> str:
    try:
        return str(path.relative_to(root)) if root else str(path)
    except ValueError:
        return str(path)


def _read(path: Path) -> tuple[str | None, int]:
    """A file's text and mode (None if it does not exist), or a UserError saying why not."""
    if not path.exists():
        if not path.parent.is_dir():
            raise UserError(f"the folder {path.parent} does not exist; create it first")
        return None, 0o644
    if not path.is_file():
        raise UserError(f"{path} is not a regular file")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise UserError(f"{path} is {size // 1024} KiB; /apply changes files up to {MAX_FILE_BYTES // 1024 // 1024} MiB")
    try:  # bytes decoded as they are: no newline translation, so CRLF and CR survive
        return path.read_bytes().decode("utf-8"), path.stat().st_mode & 0o7777
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text; /apply changes text files only") from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None


def newline_of(text: str | None) -> str:
    """The file's line ending: the most frequent of CRLF, lone CR and LF (LF for a new file)."""
    if not text:
        return "\n"
    crlf = text.count("\r\n")
    counts = {"\r\n": crlf, "\r": text.count("\r") - crlf, "\n": text.count("\n") - crlf}
    return max(counts, key=lambda ending: (counts[ending], ending == "\n"))


def with_newline(code: str, newline: str) -> str:
    """`code` (from a reply: LF) with the file's line endings."""
    if newline == "\n":
        return code
    return code.replace("\r\n", "\n").replace("\r", "\n").replace("\n", newline)


# ---- patches ------------------------------------------------------------------------------

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def is_patch(code: str, language: str = "") -> bool:
    """A unified diff: what `diff -u` and `git diff` write."""
    if language.lower() in ("diff", "patch", "udiff"):
        return True
    return bool(re.search(r"^@@ -\d+(,\d+)? \+\d+(,\d+)? @@", code, re.M) and re.search(r"^\+\+\+ ", code, re.M))


def split_patch(patch: str) -> list[tuple[str | None, str]]:
    """(target path, its hunks) per file of a patch; path None when the patch names none."""
    files: list[tuple[str | None, list[str]]] = []
    lines = patch.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = _header_path(line[4:]), _header_path(lines[i + 1][4:])
            files.append((new or old, []))
            i += 2
            continue
        if HUNK.match(line) and not files:
            files.append((None, []))
        if files:
            files[-1][1].append(line)
        i += 1
    return [(path, "\n".join(body)) for path, body in files if any(HUNK.match(b) for b in body)]


def _header_path(text: str) -> str | None:
    name = text.split("\t")[0].strip()
    if name == "/dev/null":
        return None
    return name[2:] if name.startswith(("a/", "b/")) else name


def apply_patch(old: str, hunks: str, name: str) -> str:
    """`old` with the hunks applied; a hunk may sit a few lines off (the file
    moved a little), but its context and removed lines must match exactly.

    The file keeps its bytes: context lines are taken from the file as they
    are, added lines get the file's line ending, and `\\ No newline at end
    of file` after a line means that line ends the file without one."""
    lines = old.splitlines(keepends=True)
    newline = newline_of(old)
    out: list[str] = []
    position = 0
    parsed = _hunks(hunks)
    if not parsed:
        raise PatchError(f"the patch for {name} has no hunks")
    marked = "\n\\ " in "\n" + hunks
    for number, (start, body) in enumerate(parsed, start=1):
        before = [text for tag, text, _ in body if tag in " -"]
        at = _find(lines, before, max(start - 1, 0), position)
        if at is None:
            raise PatchError(f"hunk {number} of the patch (at line {start} of {name}) does not match the file: it was written for another version. Nothing was written; ask for the whole file instead")
        out += lines[position:at]
        source = iter(lines[at : at + len(before)])
        for tag, text, no_newline in body:
            original = next(source) if tag in " -" else ""
            if tag == " ":
                out.append(text + ("" if no_newline else original[len(text):]))
            elif tag == "+":
                out.append(text + ("" if no_newline else newline))
        position = at + len(before)
    out += lines[position:]
    # a line that lost its ending (the old last line, or one marked) and is no longer last gets one
    result = "".join(piece if piece.endswith(("\n", "\r")) or i == len(out) - 1 else piece + newline for i, piece in enumerate(out))
    # a patch without the markers (a model's, often) keeps the file's missing last newline
    if not marked and old and not old.endswith(("\n", "\r")) and position >= len(lines) and result.endswith(newline):
        result = result[: -len(newline)]
    return result


def _hunks(text: str) -> list[tuple[int, list[tuple[str, str, bool]]]]:
    """(first old line, [(tag, text, no newline after it)]) per hunk."""
    hunks: list[tuple[int, list[tuple[str, str, bool]]]] = []
    for line in text.splitlines():
        header = HUNK.match(line)
        if header:
            hunks.append((int(header.group(1)), []))
        elif hunks and line.startswith(("+", "-", " ")):
            hunks[-1][1].append((line[0], line[1:], False))
        elif hunks and line.startswith("\\") and hunks[-1][1]:  # "\ No newline at end of file"
            tag, text, _ = hunks[-1][1][-1]
            hunks[-1][1][-1] = (tag, text, True)
        elif hunks and line == "":  # an empty context line whose space an editor removed
            hunks[-1][1].append((" ", "", False))
    return hunks


def _find(lines: list[str], wanted: list[str], guess: int, earliest: int) -> int | None:
    """Where `wanted` stands in `lines`, nearest to `guess`, not before `earliest`."""
    plain = [line.rstrip("\r\n") for line in lines]
    for offset in range(0, len(lines) + 1):
        for at in (guess - offset, guess + offset) if offset else (guess,):
            if earliest <= at <= len(lines) - len(wanted) and plain[at : at + len(wanted)] == wanted:
                return at
    return None


# ---- planning and writing -------------------------------------------------------------------


def plan(code: str, language: str, path: str | None, cwd: Path, confined: bool = False) -> list[Change]:
    """The changes applying this block would make (nothing is written).

    A path the user typed may go anywhere (`~` works). Paths from the model
    stay inside `cwd`, out of `.git` and off termchat's own files (a
    `.termchat.toml`, its config and state): with `confined` (the fix loop,
    which writes without a diff) for every path, and always for the file
    names in a patch's headers. A patch naming one file twice is applied in
    order, so what is written is what the diff shows."""

    def target(name: str, from_model: bool) -> Path:
        given = Path(name).expanduser()
        file = (given if given.is_absolute() else cwd / given).resolve()
        root = cwd.resolve()
        if from_model and (not file.is_relative_to(root) or ".git" in file.relative_to(root).parts):
            raise UserError(f"the reply would write {file}, outside {root} (or in .git); nothing written. /apply it yourself to see the diff" if confined else f"the patch names {name}, outside {root} (or in .git); nothing written. /apply N PATH applies one file's patch where you say")
        if from_model and _termchat_reads(file):
            raise UserError(f"the reply would write {file}, which termchat itself reads (its settings or state); nothing written")
        return file

    if is_patch(code, language):
        planned: dict[Path, Change] = {}
        files = split_patch(code)
        for name, hunks in files:
            given = path if path and len(files) == 1 else None
            if not (given or name):
                raise UserError("this patch names no file; give one: /apply N PATH")
            file = target(given, confined) if given else target(name, True)
            if file in planned:  # the same file again: its hunks apply to the text so far
                earlier = planned[file]
                planned[file] = Change(file, earlier.old, apply_patch(earlier.new, hunks, name or given), earlier.mode)
                continue
            old, mode = _read(file)
            planned[file] = Change(file, old, apply_patch(old or "", hunks, given or name), mode)
        if not planned:
            raise PatchError("this block looks like a patch but has no hunks (@@ -a,b +c,d @@)")
        return list(planned.values())
    if not path:
        raise UserError("give the file to write: /apply [N] PATH")
    file = target(path, confined)
    old, mode = _read(file)
    return [Change(file, old, with_newline(code, newline_of(old)), mode)]


def _termchat_reads(file: Path) -> bool:
    """Is this a file termchat reads (a project file, its settings, its state)?"""
    if file.name == project.PROJECT_FILE:
        return True
    folders = (paths.config_dir(), paths.state_dir(), paths.data_dir(), paths.cache_dir())
    return any(file == folder.resolve() or folder.resolve() in file.parents for folder in folders)


# Before the user has said yes, nothing the repository names may run: `git status`
# runs clean filters (and textconv, fsmonitor, hooks) from .git/config. So the state
# comes from plumbing that runs none: the index's and HEAD's blob ids (ls-files,
# ls-tree) against the file's bytes hashed unfiltered (hash-object --no-filters).
# A file whose checkout is filtered (autocrlf, lfs) may read as modified: a word
# of caution, never a program of the repository's.
_SAFE_GIT = ["git", "--no-pager", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "--no-optional-locks"]


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run([*_SAFE_GIT, *args], cwd=cwd, capture_output=True, text=True, timeout=5, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def git_status(path: Path) -> str:
    """The file's state in git, in words ("" outside a work tree)."""
    cwd = path.parent
    if _git(["rev-parse", "--is-inside-work-tree"], cwd) is None:
        return ""
    staged = _git(["ls-files", "--stage", "--", path.name], cwd)
    if staged is None:
        return ""
    if not staged.strip():
        return "git: not tracked" if path.exists() else ""
    index_blob = staged.split()[1]
    head = _git(["ls-tree", "HEAD", "--", path.name], cwd)
    head_blob = head.split()[2] if head and head.strip() else None
    worktree = _git(["hash-object", "--no-filters", "--", path.name], cwd) if path.exists() else None
    modified = worktree is None or worktree.strip() != index_blob
    if head_blob is None:
        return "git: added" + (" and modified" if modified else "")
    if head_blob != index_blob:
        return "git: staged and modified" if modified else "git: staged"
    return "git: modified, not staged" if modified else "git: unchanged since the last commit"


class UndoStack:
    """What /apply replaced, newest last: one JSON file per apply in the state
    folder, one stack per project (the git root, else the folder /apply and
    /undo run in), so /undo in one project never restores another's file."""

    def __init__(self, folder: Path | None = None, keep: int = UNDO_KEEP):
        self.fixed = folder
        self.keep = keep

    @property
    def folder(self) -> Path:
        if self.fixed is not None:
            return self.fixed
        top = project.root(Path.cwd())
        return paths.state_dir() / "undo" / hashlib.sha256(str(top).encode()).hexdigest()[:16]

    def _entries(self) -> list[Path]:
        return sorted(self.folder.glob("*.json")) if self.folder.is_dir() else []

    def push(self, changes: list[Change]) -> Path:
        folder = self.folder
        paths.private_dir(folder)
        record = [{"path": str(c.path), "old": c.old, "mode": c.mode, "new_sha": _sha(c.new)} for c in changes]
        name = folder / f"{time.time_ns()}.json"
        paths.write_private(name, json.dumps(record).encode())
        for old in self._entries()[: -self.keep]:
            old.unlink(missing_ok=True)
        return name

    def undo(self) -> str:
        """Restore the files of the last apply; what was done, in words.

        Never raises anything but a UserError: a record it cannot read is
        dropped (the one before becomes the last); one it cannot apply (a
        file changed since, became a folder, cannot be written) is kept, and
        the message says which."""
        entries = self._entries()
        if not entries:
            raise UserError("nothing to undo: no /apply yet")
        entry = entries[-1]
        try:
            raw = paths.read_private(entry, limits.UNDO_FILE)  # not through a link, never blocking on a FIFO
            if raw is None:
                raise ValueError("not a regular file of termchat's, or too big")
            record = limits.json_loads(raw, f"the undo record {entry.name}")
            if not isinstance(record, list) or not record:
                raise TypeError("not a list of files")
            # a record is data: its mode is a file's permission bits only, never setuid, setgid or sticky
            items = [(Path(i["path"]), i["old"], int(i["mode"]) & 0o777, str(i["new_sha"])) for i in record]
            if any(old is not None and not isinstance(old, str) for _, old, _, _ in items):
                raise TypeError("old text is not a string")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            entry.unlink(missing_ok=True)
            raise UserError(f"the last /undo record ({entry.name}) could not be read ({type(exc).__name__}); it was dropped and nothing was restored; /undo again restores the apply before it") from None
        for path, _, _, new_sha in items:
            if path.is_symlink() or (path.exists() and not path.is_file()):
                raise UserError(f"{path} is no longer a regular file; nothing was restored (the undo is kept: /undo again once {path.name} is a file)")
            try:
                now = path.read_bytes() if path.exists() else None
            except OSError as exc:
                raise UserError(f"cannot read {path} ({exc.strerror}); nothing was restored (the undo is kept)") from None
            if now is not None and hashlib.sha256(now).hexdigest() != new_sha:
                raise UserError(f"{path} changed after /apply; undoing would lose those edits. Nothing was restored (the undo is kept)")
        for path, old, mode, _ in items:
            try:
                if old is None:
                    path.unlink(missing_ok=True)
                else:
                    write_atomically(path, old, mode)
            except OSError as exc:
                raise UserError(f"could not restore {path}: {exc.strerror or exc} (the undo is kept)") from None
        entry.unlink(missing_ok=True)
        names = ", ".join(path.name for path, *_ in items)
        return f"undone: {names} restored" + (f" ({len(entries) - 1} earlier applies can be undone)" if len(entries) > 1 else "")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write(changes: list[Change], undo: UndoStack) -> str:
    """Write the changes (atomically, keeping modes) and remember them for /undo.

    All or nothing: each file must still be what the diff was made from, and
    if one write fails, the files already written get their old bytes back
    and the undo record goes, so a failed /apply leaves no trace."""
    for change in changes:
        try:
            now = change.path.read_bytes().decode("utf-8") if change.path.exists() else None
        except (OSError, UnicodeDecodeError):
            now = ""
        if now != change.old:
            raise UserError(f"{change.path} changed since the diff was made; nothing written. /apply again to see the new diff")
    try:
        record = undo.push(changes)
    except OSError as exc:
        raise UserError(f"could not keep the undo record ({exc.strerror or exc}); nothing written") from None
    done: list[Change] = []
    for change in changes:
        try:
            write_atomically(change.path, change.new, change.mode)
        except OSError as exc:
            if _restore(done):
                record.unlink(missing_ok=True)
                raise UserError(f"could not write {change.path}: {exc.strerror or exc}; nothing was changed") from None
            raise UserError(f"could not write {change.path}: {exc.strerror or exc}, nor restore the files written before it; /undo restores them") from None
        done.append(change)
    return ", ".join(f"{c.path.name} ({'created' if c.old is None else 'changed'})" for c in changes) + "; /undo restores"


def _restore(changes: list[Change]) -> bool:
    """Put back what `changes` replaced; whether all of it went back."""
    ok = True
    for change in reversed(changes):
        try:
            if change.old is None:
                change.path.unlink(missing_ok=True)
            else:
                write_atomically(change.path, change.old, change.mode)
        except OSError:
            ok = False
    return ok
