"""The project the user works in: its root, its `.termchat.toml`, and which of
its commands the user has approved.

The root is the git work tree's top folder, else the current folder. Only
the root's `.termchat.toml` is read: a file planted in a parent folder (say
`/tmp/.termchat.toml`, writable by every local user) is not the project's.
A `test_command` from that file came with the repository, not from the user,
so it runs only once the user has seen it and said yes; the approval is kept
per file and command (as direnv keeps `.envrc` approvals) in the private
state folder, and asked again when either changes. The project's own Python
(`.venv/bin/python`) is code from the repository too: it runs `/test`'s
pytest only once approved, per interpreter and content.

A project root that another user owns is refused, as git's `safe.directory`
refuses it: its commands, settings and interpreter are that user's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tomllib
from pathlib import Path

from termchat import limits, paths
from termchat.errors import UserError
from termchat.sanitize import inert, one_line

PROJECT_FILE = ".termchat.toml"


def root(cwd: Path) -> Path:
    """The git work tree's root above (or at) `cwd`, else `cwd` itself."""
    cwd = cwd.resolve()
    for folder in (cwd, *cwd.parents):
        if (folder / ".git").exists():
            return folder
    return cwd


def owned_root(cwd: Path) -> Path:
    """The project root, or a UserError when another user owns it (or its .git)."""
    top = root(cwd)
    for path in (top, top / ".git"):
        try:
            owner = path.lstat().st_uid
        except OSError:
            continue
        if owner != os.getuid():
            raise UserError(
                f"the project root {inert(str(top))} belongs to another user (uid {owner}): termchat runs none of its commands "
                "or interpreters, as git refuses such a folder (safe.directory). Work in a folder of your own, or give the command yourself (/test COMMAND)"
            )
    return top


def test_command(cwd: Path) -> tuple[str, Path] | None:
    """`test_command` from the project root's `.termchat.toml`, and that file."""
    file = owned_root(cwd) / PROJECT_FILE
    if not file.is_file():
        return None
    try:
        text = limits.read_file(file, limits.PROJECT_FILE, str(file)).decode("utf-8")
        value = limits.toml_loads(text, str(file), limits.PROJECT_FILE).get("test_command")
    except limits.Refused as exc:
        raise UserError(f"{exc}; termchat reads no test command from it") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"{file}: {one_line(str(exc), 200)}; fix the file (test_command = \"...\")") from None
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{file}: test_command must be a non-empty string")
    return value, file


def interpreter(folder: Path) -> tuple[str, Path | None]:
    """The project's own Python: its `.venv` or `venv`, else the one on PATH
    (bare `pytest` may be another environment's, and does not put the root on
    sys.path: a module at the root and tests in tests/ fail to import). With
    it, the file to approve first when it came with the project (None: the
    user's own, from PATH)."""
    for name in (".venv", "venv"):
        candidate = folder / name / "bin" / "python"
        if candidate.is_file():
            return str(candidate), candidate
    return shutil.which("python3") or shutil.which("python") or sys.executable, None


# ---- approvals ----------------------------------------------------------------------------


def _approvals_file() -> Path:
    return paths.state_dir() / "approved-commands.json"


def _key(file: Path, command: str) -> str:
    """One approval: the file, the command, and for an interpreter what it is
    (the program it resolves to and its bytes: a swapped binary asks again)."""
    what = ""
    if file.name != PROJECT_FILE:
        try:  # a FIFO or a device planted as the interpreter is never read (nor run: not approvable)
            what = hashlib.sha256(limits.read_file(file, limits.UNDO_FILE << 2, str(file))).hexdigest()
        except (OSError, limits.Refused):
            what = "unreadable"
    return hashlib.sha256(f"{file.resolve()}\0{command}\0{what}".encode()).hexdigest()


def _approvals() -> set[str]:
    value = paths.read_json(_approvals_file())  # not through a link, never blocking on a FIFO
    return {key for key in value if isinstance(key, str)} if isinstance(value, list) else set()


def approved(file: Path, command: str) -> bool:
    """Has the user said yes to running `command` from `file`, as it is now?"""
    return _key(file, command) in _approvals()


def approve(file: Path, command: str) -> None:
    keys = sorted(_approvals() | {_key(file, command)})
    paths.write_private(_approvals_file(), json.dumps(keys).encode())


def approval_question(file: Path, command: str) -> str:
    """What the user is asked (the command is the file's text: shown inert)."""
    if file.name != PROJECT_FILE:
        target = file.resolve()
        also = f" (it is {inert(str(target))})" if target != file.absolute() else ""
        return (
            f"/test would run the project's own Python, {inert(str(file))}{also}:\n\n    {inert(command)}\n\n"
            "It came with the project folder, not from you. Run it (now and until it changes)?"
        )
    return f"{inert(str(file))} asks to run its test command:\n\n    {inert(command)}\n\nIt came with the project, not from you. Run it (now and until it changes)?"
