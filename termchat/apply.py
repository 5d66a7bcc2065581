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

from termchat import paths
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
    try:
        return path.read_text(encoding="utf-8"), path.stat().st_mode & 0o7777
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text; /apply changes text files only") from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None


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
    moved a little), but its context and removed lines must match exactly."""
    lines = old.splitlines(keepends=True)
    out: list[str] = []
    position = 0
    parsed = _hunks(hunks)
    if not parsed:
        raise PatchError(f"the patch for {name} has no hunks")
    for number, (start, body) in enumerate(parsed, start=1):
        before = [text for tag, text in body if tag in " -"]
        after = [text for tag, text in body if tag in " +"]
        at = _find(lines, before, max(start - 1, 0), position)
        if at is None:
            raise PatchError(f"hunk {number} of the patch (at line {start} of {name}) does not match the file: it was written for another version. Nothing was written; ask for the whole file instead")
        out += lines[position:at]
        out += [text + "\n" for text in after]
        position = at + len(before)
    out += lines[position:]
    result = "".join(out)
    if old and not old.endswith("\n") and position >= len(lines) and result.endswith("\n"):
        result = result[:-1]
    return result


def _hunks(text: str) -> list[tuple[int, list[tuple[str, str]]]]:
    hunks: list[tuple[int, list[tuple[str, str]]]] = []
    for line in text.splitlines():
        header = HUNK.match(line)
        if header:
            hunks.append((int(header.group(1)), []))
        elif hunks and line.startswith(("+", "-", " ")):
            hunks[-1][1].append((line[0], line[1:]))
        elif hunks and line == "":  # an empty context line whose space an editor removed
            hunks[-1][1].append((" ", ""))
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

    `confined`: the paths come from the model, not the user (the fix loop
    writes without showing a diff), so each must stay inside `cwd` and out of
    `.git`; that is checked before any file is read."""

    def target(name: str) -> Path:
        file = (cwd / name).expanduser().resolve()
        root = cwd.resolve()
        if confined and (not file.is_relative_to(root) or ".git" in file.relative_to(root).parts):
            raise UserError(f"the reply would write {file}, outside {root} (or in .git); nothing written. /apply it yourself to see the diff")
        return file

    if is_patch(code, language):
        changes = []
        files = split_patch(code)
        for name, hunks in files:
            name = path if path and len(files) == 1 else name
            if not name:
                raise UserError("this patch names no file; give one: /apply N PATH")
            file = target(name)
            old, mode = _read(file)
            changes.append(Change(file, old, apply_patch(old or "", hunks, name), mode))
        if not changes:
            raise PatchError("this block looks like a patch but has no hunks (@@ -a,b +c,d @@)")
        return changes
    if not path:
        raise UserError("give the file to write: /apply [N] PATH")
    file = target(path)
    old, mode = _read(file)
    return [Change(file, old, code, mode)]


def git_status(path: Path) -> str:
    """The file's state in git, in words ("" outside a work tree)."""
    try:
        done = subprocess.run(["git", "status", "--porcelain", "--", path.name], cwd=path.parent, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    if done.returncode != 0:
        return ""
    code = done.stdout[:2]
    if not code.strip():
        return "git: unchanged since the last commit" if path.exists() else ""
    return "git: " + {"??": "not tracked", " M": "modified, not staged", "M ": "staged", "MM": "staged and modified", "A ": "added"}.get(code, code.strip())


class UndoStack:
    """What /apply replaced, newest last: one JSON file per apply in the state folder."""

    def __init__(self, folder: Path | None = None, keep: int = UNDO_KEEP):
        self.folder = folder or paths.state_dir() / "undo"
        self.keep = keep

    def _entries(self) -> list[Path]:
        return sorted(self.folder.glob("*.json")) if self.folder.is_dir() else []

    def push(self, changes: list[Change]) -> None:
        paths.private_dir(self.folder)
        record = [{"path": str(c.path), "old": c.old, "mode": c.mode, "new_sha": _sha(c.new)} for c in changes]
        name = self.folder / f"{time.time_ns()}.json"
        write_atomically(name, json.dumps(record), 0o600)
        for old in self._entries()[: -self.keep]:
            old.unlink(missing_ok=True)

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
            record = json.loads(entry.read_text())
            if not isinstance(record, list) or not record:
                raise TypeError("not a list of files")
            items = [(Path(i["path"]), i["old"], int(i["mode"]), str(i["new_sha"])) for i in record]
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
    """Write the changes (atomically, keeping modes) and remember them for /undo."""
    undo.push(changes)
    for change in changes:
        try:
            write_atomically(change.path, change.new, change.mode)
        except OSError as exc:
            raise UserError(f"could not write {change.path}: {exc.strerror or exc}") from None
    return ", ".join(f"{c.path.name} ({'created' if c.old is None else 'changed'})" for c in changes) + "; /undo restores"
