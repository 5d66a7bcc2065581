"""Writing the user's files: whole or not at all.

A file is written to a temporary name in its own folder and renamed over the
old one, so a crash, a full disk or a second writer never leaves half a file.
Used for exports (0600: a conversation is private) and for `/apply` (the
file keeps its mode).
"""

from __future__ import annotations

import os
from pathlib import Path

from termchat.errors import UserError


def write_atomically(path: Path, text: str, mode: int = 0o600) -> None:
    """Replace `path` with `text` in one rename; raises OSError."""
    temporary = path.with_name(f".{path.name}.termchat-{os.getpid()}")
    try:
        fd = os.open(temporary, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, mode)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
        os.chmod(temporary, mode)  # the umask may have taken bits the old file had
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_export(path: str | Path, text: str, force: bool = False) -> Path:
    """Write an export (0600: it is a private conversation); one clear error otherwise."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise UserError(f"{path} is a folder; give a file name")
    if path.exists() and not force:
        raise UserError(f"{path} exists; choose another name, or overwrite it with --force")
    if not path.parent.is_dir():
        raise UserError(f"the folder {path.parent} does not exist; create it or choose another place")
    try:
        write_atomically(path, text if text.endswith("\n") else text + "\n", 0o600)
    except OSError as exc:
        raise UserError(f"could not write {path}: {exc.strerror or exc}") from None
    return path
