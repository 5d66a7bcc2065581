"""The private serve folder: one state file per running engine, one lease
file per front-end using it. The one reader and writer of both.

    state/serve/PROFILE.json          an engine: where it listens, its API key, its pid and start time
    state/serve/leases/PID/HOLDER     a front-end uses engine PID: the holder's start time

Only regular files termchat wrote count: symlinks are never followed (a
symlinked lease folder is removed, not emptied), FIFOs and folders by those
names are skipped, every write is a new 0600 file renamed into place. A pid
counts only with its recorded start time: a recycled pid is never waited on
or signalled. The standard library, termchat.paths and termchat.numbers
only: the engine process reads this for its watchdog.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

from termchat import numbers, paths
from termchat.engine import proc

STATE_LIMIT = 64 * 1024  # bytes: a state file is a few hundred
MAX_KEEP_ALIVE_S = 7 * 24 * 3600.0


def serve_dir() -> Path:
    return paths.state_dir() / "serve"


def lease_dir(engine_pid: int, folder: Path | None = None) -> Path:
    return (folder or serve_dir()) / "leases" / str(engine_pid)


@dataclass(frozen=True)
class EngineRecord:
    """What a state file says of one running engine, checked as it is read."""

    base_url: str
    api_key: str
    pid: int
    started: str  # the pid's start time (/proc): with it, the pid names one process
    model: str
    log: str
    method: str = "plain"
    fingerprint: str = ""
    keep_alive: float | None = None  # seconds; None: `termchat serve`'s (ends when serve ends)

    @property
    def port(self) -> int:
        try:
            return int(self.base_url.rsplit(":", 1)[-1].split("/")[0])
        except ValueError:
            return 0

    def is_running(self) -> bool:
        """The recorded process is still the one with that pid."""
        return proc.is_running(self.pid, self.started)


def parse_record(raw: bytes | None) -> EngineRecord | None:
    """A state file's bytes as a record, or None when anything in it is off."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    texts = ("base_url", "api_key", "model", "log", "started")
    if not all(isinstance(data.get(k), str) for k in texts):
        return None
    pid = numbers.count(data.get("pid"), high=2**22)
    if not pid or isinstance(data.get("pid"), float):
        return None
    keep = data.get("keep_alive")
    if keep is not None:
        keep = numbers.real(keep, 0.0, MAX_KEEP_ALIVE_S)
        if keep is None:
            return None
    method = data.get("method") if isinstance(data.get("method"), str) else "plain"
    fingerprint = data.get("fingerprint") if isinstance(data.get("fingerprint"), str) else ""
    return EngineRecord(data["base_url"], data["api_key"], pid, data["started"], data["model"], data["log"], method or "plain", fingerprint, keep)


def read_record(path: Path) -> EngineRecord | None:
    return parse_record(paths.read_private(path, STATE_LIMIT))


def write_record(path: Path, record: EngineRecord, replace: bool = True) -> bool:
    """0600 (it holds the API key), whole, never through a symlink. With
    `replace` False, only where no file is: False when one was."""
    return paths.write_private(path, json.dumps(asdict(record)).encode(), replace=replace)


def state_files(folder: Path | None = None) -> list[Path]:
    """The regular *.json files of the serve folder (no symlink, FIFO or folder)."""
    folder = folder or serve_dir()
    try:
        return sorted(p for p in folder.glob("*.json") if paths.is_plain_file(p))
    except OSError:
        return []


def records(folder: Path | None = None) -> list[tuple[Path, EngineRecord]]:
    found = []
    for path in state_files(folder):
        record = read_record(path)
        if record is not None:
            found.append((path, record))
    return found


def is_mine(path: Path, pid: int) -> bool:
    record = read_record(path)
    return record is not None and record.pid == pid


# ---- leases ------------------------------------------------------------------------------


def remove_entry(entry: Path) -> None:
    """Remove what sits at `entry` without following it: a symlink goes, not its target."""
    try:
        mode = os.lstat(entry).st_mode
    except OSError:
        return
    try:
        if stat.S_ISDIR(mode):
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    except OSError:
        pass


def _real_dir(where: Path) -> bool:
    """A real folder (not a symlink to one); anything else there is removed."""
    try:
        mode = os.lstat(where).st_mode
    except OSError:
        return False
    if stat.S_ISDIR(mode):
        return True
    remove_entry(where)
    return False


def take_lease(engine_pid: int, folder: Path | None = None) -> Path:
    """This process uses the engine: a 0600 file in a 0700 folder."""
    where = lease_dir(engine_pid, folder)
    if where.is_symlink() or (where.exists() and not where.is_dir()):
        remove_entry(where)
    paths.private_dir(where)
    path = where / f"{os.getpid()}.{secrets.token_hex(4)}"  # PID.TAG: one per holder, even two in one process
    paths.write_private(path, (proc.started_at(os.getpid()) or "").encode())
    return path


def drop_lease(path: Path | None) -> None:
    if path is not None:
        remove_entry(path)


def live_leases(engine_pid: int, folder: Path | None = None) -> list[int]:
    """The pids that hold a lease on the engine and still run; stale lease
    files, and anything in the folder that is not a lease file, are removed."""
    where = lease_dir(engine_pid, folder)
    if not _real_dir(where):
        return []
    live = []
    try:
        entries = list(where.iterdir())
    except OSError:
        return []
    for entry in entries:
        raw = paths.read_private(entry, 64)
        try:
            pid = int(entry.name.split(".")[0])
            start = raw.decode("ascii").strip() if raw is not None else ""
        except (ValueError, UnicodeDecodeError):
            pid, start = 0, ""
        if pid > 0 and proc.is_running(pid, start):
            live.append(pid)
        else:
            remove_entry(entry)
    return live


def remove_leases(engine_pid: int, folder: Path | None = None) -> None:
    """An engine's lease folder goes; a symlink there is removed, never emptied."""
    remove_entry(lease_dir(engine_pid, folder))


def forget(engine_pid: int, folder: Path | None = None) -> None:
    """An engine about to be stopped: its state file and leases go first."""
    for path in state_files(folder):
        if is_mine(path, engine_pid):
            path.unlink(missing_ok=True)
    remove_leases(engine_pid, folder)
