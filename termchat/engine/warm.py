"""Warm engines: an engine termchat starts outlives the front-end that started
it, until nobody has used it for its profile's `keep_alive` seconds (as
Ollama's keep_alive). Relaunching, switching back, or `termchat ask` attach to
it instead of paying a cold start.

Who uses an engine is a lease: one file per front-end under
`state/serve/leases/ENGINE_PID/`, named by the front-end's pid and holding
that process's start time (so a recycled pid holds nothing). The engine's own
watchdog (a thread in the engine process, started by guarded_server) ends the
engine once no lease has had a live holder for `keep_alive` seconds; so the
end never depends on the front-end that started it, and a front-end killed
with SIGKILL holds the engine no longer than keep_alive. While leased, the
watchdog touches the engine's state file: its mtime is "last used".

This module is imported by the engine process: the standard library and
termchat.paths only.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from termchat import paths

WARM_ENV = "TERMCHAT_WARM"  # {"serve": folder, "keep_alive": s}: the engine process runs a watchdog
POLL_S = 1.0


def serve_dir() -> Path:
    return paths.state_dir() / "serve"


def lease_dir(engine_pid: int, folder: Path | None = None) -> Path:
    return (folder or serve_dir()) / "leases" / str(engine_pid)


# ---- processes ---------------------------------------------------------------------------


def stat_fields(pid: int | str) -> list[str]:
    """/proc/PID/stat after the command name (which may hold spaces and
    parentheses): [0] state, [1] parent, [2] process group, [11]/[12] user and
    system ticks, [19] start time; [] when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def started_at(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field
    22): with the pid, it names one process, never a later one given the same pid."""
    fields = stat_fields(pid)
    return fields[19] if len(fields) > 19 and fields[0] != "Z" else None


def rss_bytes(pgid: int) -> int:
    """Resident memory of a process group (the engine and any helper it started)."""
    from termchat.engine.process import group_members

    total = 0
    for pid in group_members(pgid):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
    return total


def cpu_seconds(pgid: int) -> float:
    """User + system CPU time of a process group so far (to show an idle engine uses none)."""
    from termchat.engine.process import group_members

    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in group_members(pgid):
        fields = stat_fields(pid)
        if len(fields) > 12:
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def memory_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


# ---- leases ------------------------------------------------------------------------------


def take_lease(engine_pid: int, folder: Path | None = None) -> Path:
    """This process uses the engine: a 0600 file in a 0700 folder."""
    where = paths.private_dir(lease_dir(engine_pid, folder))
    path = where / f"{os.getpid()}.{secrets.token_hex(4)}"  # PID.TAG: one per holder, even two in one process
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(started_at(os.getpid()) or "")
    return path


def drop_lease(path: Path | None) -> None:
    if path is not None:
        path.unlink(missing_ok=True)


def live_leases(engine_pid: int, folder: Path | None = None) -> list[int]:
    """The pids that hold a lease on the engine and still run; stale lease files are removed."""
    live = []
    try:
        entries = list(lease_dir(engine_pid, folder).iterdir())
    except OSError:
        return []
    for entry in entries:
        try:
            pid, start = int(entry.name.split(".")[0]), entry.read_text().strip()
        except (OSError, ValueError):
            entry.unlink(missing_ok=True)
            continue
        if start and started_at(pid) == start:
            live.append(pid)
        else:
            entry.unlink(missing_ok=True)
    return live


# ---- the engine's watchdog (runs in the engine process) ---------------------------------


def read_state(path: Path) -> dict | None:
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def state_is_mine(path: Path, pid: int) -> bool:
    state = read_state(path)
    return state is not None and state.get("pid") == pid


class Watchdog:
    """Ends this engine once no lease has had a live holder for `keep_alive` s.

    Expiry cannot race with a front-end that is attaching: the state file is
    first moved aside (no new front-end finds the engine), the leases are read
    once more, and a lease taken meanwhile puts the state file back. A
    front-end takes its lease first and then checks that the state file is
    still there (served.find_served)."""

    def __init__(self, folder: Path, keep_alive: float, pid: int | None = None):
        self.folder, self.keep_alive = folder, keep_alive
        self.pid = pid or os.getpid()
        self.last_used = time.monotonic()

    def state_files(self) -> list[Path]:
        return [p for p in self.folder.glob("*.json") if state_is_mine(p, self.pid)]

    def tick(self, now: float | None = None) -> bool:
        """One look; True when the engine should end now."""
        now = time.monotonic() if now is None else now
        if live_leases(self.pid, self.folder):
            self.last_used = now
            for state in self.state_files():
                os.utime(state)  # "last used", for `termchat ps`
            return False
        if now - self.last_used < self.keep_alive:
            return False
        aside = []
        for state in self.state_files():
            moved = state.with_suffix(".expiring")
            os.replace(state, moved)
            aside.append((moved, state))
        if live_leases(self.pid, self.folder):  # a front-end attached as it expired
            for moved, state in aside:
                os.replace(moved, state)
            self.last_used = now
            return False
        for moved, _ in aside:
            moved.unlink(missing_ok=True)
        return True

    def run(self) -> None:
        while not self.tick():
            time.sleep(POLL_S)
        remove_leases(self.pid, self.folder)
        pgid = os.getpgid(0)
        os.killpg(pgid, signal.SIGTERM)  # the server shuts down as on `termchat stop`
        time.sleep(20)
        os.killpg(pgid, signal.SIGKILL)


def forget(engine_pid: int, folder: Path | None = None) -> None:
    """An engine about to be stopped: its state file and leases go first."""
    folder = folder or serve_dir()
    for path in folder.glob("*.json"):
        if state_is_mine(path, engine_pid):
            path.unlink(missing_ok=True)
    remove_leases(engine_pid, folder)


def remove_leases(engine_pid: int, folder: Path | None = None) -> None:
    where = lease_dir(engine_pid, folder)
    for entry in where.glob("*"):
        entry.unlink(missing_ok=True)
    try:
        where.rmdir()
    except OSError:
        pass


def start_watchdog_from_env() -> None:
    """In the engine process: keep-alive if the launcher asked for it."""
    raw = os.environ.pop(WARM_ENV, "")
    if not raw:
        return
    settings = json.loads(raw)
    dog = Watchdog(Path(settings["serve"]), float(settings["keep_alive"]))
    threading.Thread(target=dog.run, name="termchat-keep-alive", daemon=True).start()


# ---- what `termchat ps` shows ------------------------------------------------------------


@dataclass
class WarmEngine:
    profile: str
    model: str
    method: str
    pid: int
    port: int
    rss: int  # bytes
    users: int  # front-ends holding it now
    idle_s: float  # since last used (0 while used)
    keep_alive: float | None  # None: `termchat serve` (ends when serve ends)
    state_path: Path

    @property
    def left_s(self) -> float | None:
        return None if self.keep_alive is None else max(0.0, self.keep_alive - self.idle_s)


def running_engines(folder: Path | None = None) -> list[WarmEngine]:
    """Engines of this user that termchat knows of (warm ones and `termchat serve`)."""
    from termchat.engine.served import is_our_engine

    found = []
    folder = folder or serve_dir()
    for path in sorted(folder.glob("*.json")):
        state = read_state(path)
        if state is None or not is_our_engine(state.get("pid")):
            continue
        pid = state["pid"]
        users = len(live_leases(pid, folder))
        keep = state.get("keep_alive")
        idle = 0.0 if users else max(0.0, time.time() - path.stat().st_mtime)
        port = int(str(state.get("base_url", "")).rsplit(":", 1)[-1].split("/")[0] or 0)
        found.append(WarmEngine(path.stem, str(state.get("model", "?")), str(state.get("method") or "plain"), pid, port, rss_bytes(pid), users, idle, float(keep) if isinstance(keep, (int, float)) else None, path))
    return found


def stop_engine(engine: WarmEngine) -> None:
    """End a warm (or served) engine: its state first, so nobody attaches to it meanwhile."""
    from termchat.engine.process import ManagedEngine

    forget(engine.pid, engine.state_path.parent)
    ManagedEngine(profile=None, base_url="", api_key=None, model_name=engine.model, pid=engine.pid, owned=True).stop()  # type: ignore[arg-type]


def make_room(budget_share: float = 0.5, keep: str | None = None) -> list[WarmEngine]:
    """Before a new engine starts: end idle warm engines, longest idle first,
    while they and the new engine (estimated as the largest of them) would use
    more than `budget_share` of the memory there would be without them. The
    ended ones."""
    engines = [e for e in running_engines() if e.profile != keep]
    if not engines:
        return []
    total = sum(e.rss for e in engines)
    budget = budget_share * (memory_available() + total)
    estimate = max(e.rss for e in engines)
    ended = []
    for engine in sorted((e for e in engines if e.users == 0 and e.keep_alive is not None), key=lambda e: -e.idle_s):
        if total + estimate <= budget:
            break
        stop_engine(engine)
        total -= engine.rss
        ended.append(engine)
    return ended
