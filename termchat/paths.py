"""Where termchat keeps things: the XDG folders via platformdirs.

TERMCHAT_HOME overrides all of them (one folder with config/, cache/, data/,
state/ inside), which tests use to stay out of the user's real folders.
"""

from __future__ import annotations

import os
import secrets
import stat
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
    if path.is_symlink():
        raise OSError(f"{path} is a symbolic link, not a folder termchat made; remove it")
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
    """0600 for a regular file others could read; never opens it (see
    private_file), and never changes what a symlink points at."""
    try:
        info = os.lstat(path)
    except OSError:
        return
    if stat.S_ISREG(info.st_mode) and info.st_mode & 0o077:
        os.chmod(path, 0o600)


def private_file(path: Path) -> Path:
    """Create `path` empty with mode 0600 if it does not exist (tighten it if it does),
    so that whatever writes it next (SQLite, a log, a history file) starts private.

    An existing file is only chmod-ed, never opened: closing any descriptor of
    a file drops every POSIX lock this process holds on it, and SQLite's locks
    are POSIX locks (opening and closing the database file beside a live
    connection corrupts it)."""
    private_dir(path.parent)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600))
    except FileExistsError:
        if not is_plain_file(path):
            raise OSError(f"{path} is not a regular file of termchat's (a link, a FIFO or a folder); remove it") from None
        tighten(path)
    return path


def read_private(path: Path, limit: int = 1 << 20) -> bytes | None:
    """The bytes of a file termchat wrote in one of its private folders, or
    None: a symlink is not followed, and a FIFO, a device or a folder by that
    name is not read (opening a FIFO would hang), nor a file over `limit`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        return os.read(fd, limit + 1)[:limit]
    except OSError:
        return None
    finally:
        os.close(fd)


def read_json(path: Path, limit: int | None = None):
    """A JSON file termchat wrote itself (state, records), read as read_private
    does and parsed within limits.JSON_DEPTH: its value, or None when it is
    missing, a link, a FIFO, too big, nested too deep or not JSON."""
    from termchat import limits

    raw = read_private(path, limits.STATE_FILE if limit is None else limit)
    if raw is None:
        return None
    try:
        return limits.json_loads(raw, str(path))
    except ValueError:
        return None


def write_private(path: Path, data: bytes, replace: bool = True) -> bool:
    """Write a private file whole (0600): to a new file beside it, renamed over
    it, so a symlink or another file planted at `path` is replaced, never
    followed or written through, and an existing file's looser mode goes.
    With `replace` False, only where nothing is at `path` (linked into place,
    so of two writers one wins): False when something was."""
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), 0o600)  # whatever the umask
            handle.write(data)
        if replace:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: checked, then renamed (two writers could both win)
            if os.path.lexists(path):
                return False
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return True
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def is_plain_file(path: Path) -> bool:
    """A regular file, not behind a symlink."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False
