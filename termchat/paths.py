"""Where termchat keeps things: the XDG folders via platformdirs.

TERMCHAT_HOME overrides all of them (one folder with config/, cache/, data/,
state/ inside), which tests use to stay out of the user's real folders.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "termchat"


def _home() -> Path | None:
    value = os.environ.get("TERMCHAT_HOME")
    return Path(value) if value else None


def config_dir() -> Path:
    home = _home()
    return home / "config" if home else Path(platformdirs.user_config_dir(APP))


def data_dir() -> Path:
    home = _home()
    return home / "data" if home else Path(platformdirs.user_data_dir(APP))


def state_dir() -> Path:
    home = _home()
    return home / "state" if home else Path(platformdirs.user_state_dir(APP))


def cache_dir() -> Path:
    home = _home()
    return home / "cache" if home else Path(platformdirs.user_cache_dir(APP))


def models_dir() -> Path:
    """Converted models. TERMCHAT_MODELS overrides this folder alone, so a
    throw-away TERMCHAT_HOME (tests) can share the already-converted model."""
    models = os.environ.get("TERMCHAT_MODELS")
    return Path(models) if models else cache_dir() / "models"


def logs_dir() -> Path:
    return state_dir() / "logs"


def private_dir(path: Path) -> Path:
    """A folder only the user can enter (0700), created if needed; tightened if it exists.

    Conversations, logs and state are private: other local users must not
    read them. So are the folders created on the way to it, and termchat's
    own state and data folders that hold it (mkdir gives parents the umask's
    mode: the state folder was 0755 with 0700 folders inside)."""
    created = []
    folder = path
    while not folder.exists() and folder != folder.parent:
        created.append(folder)
        folder = folder.parent
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    own = [root for root in (state_dir(), data_dir()) if path == root or root in path.parents]
    for folder in [*created, *own]:
        if folder.stat().st_mode & 0o077:
            folder.chmod(0o700)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)
    return path


def tighten(path: Path) -> None:
    """0600 for a file others could read; never opens it (see private_file)."""
    if path.exists() and path.stat().st_mode & 0o077:
        path.chmod(0o600)


def private_file(path: Path) -> Path:
    """Create `path` empty with mode 0600 if it does not exist (tighten it if it does),
    so that whatever writes it next (SQLite, a log, a history file) starts private.

    An existing file is only chmod-ed, never opened: closing any descriptor of
    a file drops every POSIX lock this process holds on it, and SQLite's locks
    are POSIX locks (opening and closing the database file beside a live
    connection corrupts it)."""
    private_dir(path.parent)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        tighten(path)
    return path
