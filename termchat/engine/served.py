"""`termchat serve` state files, so that `ask`, the TUI and the tests attach to
a running engine instead of starting their own.

The file holds the engine's API key: 0600 in a 0700 folder. A file that is
damaged, points off this machine, or names a pid that is not this user's vLLM
server is removed, and a fresh engine is started instead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from termchat import paths
from termchat.engine.command import SERVER_MODULE
from termchat.engine.endpoint import is_loopback
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
    return paths.state_dir() / "serve" / f"{profile_name}.json"


def write_state(engine: ManagedEngine) -> Path:
    path = state_file(engine.profile.name)
    paths.private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # holds the API key
    with os.fdopen(fd, "w") as handle:
        json.dump({"base_url": engine.base_url, "api_key": engine.api_key, "pid": engine.pid, "model": engine.model_name, "log": str(engine.log_path)}, handle)
    return path


def remove_state(profile_name: str) -> None:
    state_file(profile_name).unlink(missing_ok=True)


def find_served(profile: Profile) -> ManagedEngine | None:
    """A `termchat serve` of this profile that is up and answering, if any."""
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
    if not is_our_engine(state.get("pid")):
        path.unlink(missing_ok=True)
        return None
    engine = ManagedEngine(profile=profile, base_url=state["base_url"], api_key=state["api_key"], model_name=state["model"], pid=state["pid"], log_path=Path(state["log"]), owned=False)
    return engine if engine.health_now() else None
