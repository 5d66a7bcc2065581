"""Running engines, as the front-ends see them: `termchat serve`'s and warm
ones (an engine termchat starts outlives the front-end that started it, until
nobody has used it for its profile's `keep_alive`: watchdog.py). `ask`, the
TUI and the tests attach to a running engine of the same settings instead of
starting their own; `termchat ps` lists them and `stop` ends them.

A state file (state.py) that is damaged, points off this machine, or names a
pid that is not this user's vLLM server started at the recorded time is
removed, and a fresh engine is started instead: its pid is never waited on
or signalled. The file also holds the fingerprint of the settings the engine
was started with: a profile edited since does not attach to the stale engine.

One live engine is recorded per profile, from its launch on: a record is
written only where none names a live engine (write_state), so `termchat
serve` and a front-end starting at the same moment never hide each other's
engine from `ps` and `stop`. Serve refuses a profile whose engine is served
or in use (and replaces an idle warm one); a front-end waits for a starting
one instead of starting a second.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from termchat.engine import proc, state
from termchat.engine.command import SERVER_MODULE, server_command
from termchat.engine.endpoint import EngineState
from termchat.profiles import Profile, is_loopback
from termchat.engine.process import ManagedEngine


def is_our_engine(record: state.EngineRecord) -> bool:
    """Is the recorded process a live vLLM server of this user, the very one
    that was recorded (a recycled pid, or another user's process, is not)?"""
    return record.is_running() and proc.owner(record.pid) == os.getuid() and SERVER_MODULE.encode() in proc.cmdline(record.pid)


def state_file(profile_name: str) -> Path:
    return state.serve_dir() / f"{profile_name}.json"


def fingerprint(profile: Profile) -> str:
    """What the engine was started with: its command line (port aside) and environment."""
    settings = [server_command(profile, "PORT"), sorted(profile.env.items())]
    return hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:16]


def write_state(engine: ManagedEngine, keep_alive: float | None = None) -> state.EngineRecord | None:
    """Make the engine findable, from its launch on; `keep_alive` marks a warm
    engine (None: `termchat serve`'s). Never over a live engine's record, so
    that no engine goes unseen by `ps` and `stop`: that record is returned
    (and nothing written); None once written. An empty, damaged or stale
    file is replaced."""
    path = state_file(engine.profile.name)
    record = state.EngineRecord(
        base_url=engine.base_url, api_key=engine.api_key or "", pid=engine.pid, started=proc.started_at(engine.pid) or "",
        model=engine.model_name, log=str(engine.log_path), method=engine.profile.method or "plain",
        fingerprint=fingerprint(engine.profile), keep_alive=keep_alive,
    )
    for _ in range(3):
        if state.write_record(path, record, replace=False):
            return None
        there = live_record(engine.profile.name)
        if there is not None:
            return there
    raise OSError(f"could not write {path}")


def live_record(profile_name: str) -> state.EngineRecord | None:
    """The record of a live engine of this profile, whatever its settings; a
    file that names none is removed."""
    path = state_file(profile_name)
    record = state.read_record(path)
    if record is not None and is_loopback(record.base_url) and is_our_engine(record):
        return record
    if os.path.lexists(path):
        state.remove_entry(path)  # empty, damaged, stale or not ours
    if record is not None and not record.is_running():
        state.remove_leases(record.pid)  # an engine that died: its leases hold nothing
    return None


def in_the_way(profile: Profile, record: state.EngineRecord) -> str:
    """Why a second engine of this profile does not start, and what to do."""
    users = len(state.live_leases(record.pid))
    whose = "`termchat serve`" if record.keep_alive is None else f"a front-end, kept warm, used by {users} now"
    name = profile.name
    if record.fingerprint != fingerprint(profile):
        return (f"profile '{name}' still has an engine of its earlier settings (pid {record.pid}, started by {whose}): "
                f"`termchat stop {name}` ends it, then start again")
    return (f"profile '{name}' already has an engine (pid {record.pid} at {record.base_url}, started by {whose}): "
            f"`termchat ask --profile {name}` uses it; `termchat stop {name}` ends it")


def remove_state(profile_name: str, pid: int) -> None:
    """The profile's record, if it is this engine's."""
    path = state_file(profile_name)
    if state.is_mine(path, pid):
        path.unlink(missing_ok=True)


def find_served(profile: Profile, lease: bool = False, starting: bool = False) -> ManagedEngine | None:
    """A running engine of this profile, started with its current settings:
    up and answering, or still starting (a warm engine this process leases,
    or with `starting` any). With `lease`, this process takes a lease on a
    warm one, before checking that it has not just expired."""
    path = state_file(profile.name)
    record = live_record(profile.name)
    if record is None:
        return None
    if record.fingerprint != fingerprint(profile):  # the profile changed since it started
        if record.keep_alive is not None and not state.live_leases(record.pid):
            for stale in running_engines(path.parent):
                if stale.pid == record.pid:
                    stop_engine(stale)
        return None
    engine = ManagedEngine(profile=profile, base_url=record.base_url, api_key=record.api_key, model_name=record.model, pid=record.pid, log_path=Path(record.log), owned=False)
    if lease and record.keep_alive is not None:
        engine.lease = state.take_lease(record.pid)
        if state.read_record(path) != record:  # expired (or replaced) as the lease was taken
            state.drop_lease(engine.lease)
            return None
    if engine.health_now():
        return engine
    if (engine.lease is not None or starting) and engine.alive():  # still starting: wait for it
        engine.state = EngineState.STARTING
        return engine
    state.drop_lease(engine.lease)
    return None


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
    found = []
    folder = folder or state.serve_dir()
    for path, record in state.records(folder):
        if not is_our_engine(record):
            continue
        users = len(state.live_leases(record.pid, folder))
        try:
            idle = 0.0 if users else max(0.0, time.time() - os.lstat(path).st_mtime)
        except OSError:
            continue
        found.append(WarmEngine(path.stem, record.model, record.method, record.pid, record.port, proc.rss_bytes(record.pid), users, idle, record.keep_alive, path))
    return found


def stop_engine(engine: WarmEngine) -> None:
    """End a warm (or served) engine: its state first, so nobody attaches to it meanwhile."""
    state.forget(engine.pid, engine.state_path.parent)
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
    budget = budget_share * (proc.memory_available() + total)
    estimate = max(e.rss for e in engines)
    ended = []
    for engine in sorted((e for e in engines if e.users == 0 and e.keep_alive is not None), key=lambda e: -e.idle_s):
        if total + estimate <= budget:
            break
        stop_engine(engine)
        total -= engine.rss
        ended.append(engine)
    return ended
