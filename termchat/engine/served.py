"""State files of running engines (`termchat serve`, and warm engines:
warm.py), so that `ask`, the TUI and the tests attach to a running engine
instead of starting their own.

The file holds the engine's API key: 0600 in a 0700 folder. A file that is
damaged, points off this machine, or names a pid that is not this user's vLLM
server is removed, and a fresh engine is started instead. It also holds the
fingerprint of the settings the engine was started with: a profile edited
since does not attach to the stale engine.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from termchat import paths
from termchat.engine import warm
from termchat.engine.command import SERVER_MODULE, server_command
from termchat.engine.endpoint import EngineState, is_loopback
from termchat.engine.process import ManagedEngine
from termchat.profiles import Profile


def is_our_engine(pid: object) -> bool:
    """Is `pid` a live vLLM server of this user? (a recycled pid, or another
    user's process, must not count as a running `termchat serve`)"""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    proc = Path(f"/proc/{pid}")
    try:
        if proc.stat().st_uid != os.getuid():
            return False
        return SERVER_MODULE.encode() in (proc / "cmdline").read_bytes()
    except OSError:
        return False


def state_file(profile_name: str) -> Path:
    return warm.serve_dir() / f"{profile_name}.json"


def fingerprint(profile: Profile) -> str:
    """What the engine was started with: its command line (port aside) and environment."""
    settings = [server_command(profile, "PORT"), sorted(profile.env.items())]
    return hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:16]


def write_state(engine: ManagedEngine, keep_alive: float | None = None) -> Path:
    """Make the engine findable; `keep_alive` marks a warm engine (None: `termchat serve`'s)."""
    path = state_file(engine.profile.name)
    paths.private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # holds the API key
    state = {
        "base_url": engine.base_url, "api_key": engine.api_key, "pid": engine.pid, "model": engine.model_name, "log": str(engine.log_path),
        "method": engine.profile.method, "fingerprint": fingerprint(engine.profile), "keep_alive": keep_alive,
    }
    with os.fdopen(fd, "w") as handle:
        json.dump(state, handle)
    return path


def remove_state(profile_name: str) -> None:
    state_file(profile_name).unlink(missing_ok=True)


def find_served(profile: Profile, lease: bool = False) -> ManagedEngine | None:
    """A running engine of this profile, started with its current settings:
    up and answering, or (a warm engine) still starting. With `lease`, this
    process takes a lease on a warm one (warm.py), before checking that it
    has not just expired."""
    path = state_file(profile.name)
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        state = None
    fields = ("base_url", "api_key", "model", "log")
    if not isinstance(state, dict) or not all(isinstance(state.get(k), str) for k in fields) or not is_loopback(state["base_url"]):
        if path.exists():
            path.unlink(missing_ok=True)  # empty, damaged or not ours: a fresh start is the answer
        return None
    pid = state.get("pid")
    if not is_our_engine(pid):
        path.unlink(missing_ok=True)
        if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0:
            warm.remove_leases(pid)  # an engine that died: its leases hold nothing
        return None
    keep_alive = state.get("keep_alive")
    if state.get("fingerprint") != fingerprint(profile):  # the profile changed since it started
        if isinstance(keep_alive, (int, float)) and not warm.live_leases(pid):
            for stale in warm.running_engines(path.parent):
                if stale.pid == pid:
                    warm.stop_engine(stale)
        return None
    engine = ManagedEngine(profile=profile, base_url=state["base_url"], api_key=state["api_key"], model_name=state["model"], pid=pid, log_path=Path(state["log"]), owned=False)
    if lease and isinstance(keep_alive, (int, float)):
        engine.lease = warm.take_lease(pid)
        if warm.read_state(path) != state:  # expired (or replaced) as the lease was taken
            warm.drop_lease(engine.lease)
            return None
    if engine.health_now():
        return engine
    if engine.lease is not None and engine.alive():  # a warm engine still starting: wait for it
        engine.state = EngineState.STARTING
        return engine
    warm.drop_lease(engine.lease)
    return None

