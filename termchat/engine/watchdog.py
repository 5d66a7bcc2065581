"""The engine's own watchdog: a thread in a warm engine's process that ends
the engine once no lease has had a live holder for `keep_alive` seconds (as
Ollama's keep_alive). So the end never depends on the front-end that started
it, and a front-end killed with SIGKILL holds the engine no longer than
keep_alive. While leased, the watchdog touches the engine's state file: its
mtime is "last used".

This module runs in the engine process (guarded_server starts it): the
standard library and termchat's paths, numbers, proc and state only. The
front-ends' side of warm engines is registry.py.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from termchat.engine import state

WARM_ENV = "TERMCHAT_WARM"  # {"serve": folder, "keep_alive": s}: the engine process runs a watchdog
POLL_S = 1.0


class Watchdog:
    """Ends this engine once no lease has had a live holder for `keep_alive` s.

    Expiry cannot race with a front-end that is attaching: the state file is
    first moved aside (no new front-end finds the engine), the leases are read
    once more, and a lease taken meanwhile puts the state file back. A
    front-end takes its lease first and then checks that the state file is
    still there (registry.find_served)."""

    def __init__(self, folder: Path, keep_alive: float, pid: int | None = None):
        self.folder, self.keep_alive = folder, keep_alive
        self.pid = pid or os.getpid()
        self.last_used = time.monotonic()

    def state_files(self) -> list[Path]:
        return [p for p in state.state_files(self.folder) if state.is_mine(p, self.pid)]

    def tick(self, now: float | None = None) -> bool:
        """One look; True when the engine should end now."""
        now = time.monotonic() if now is None else now
        if state.live_leases(self.pid, self.folder):
            self.last_used = now
            for path in self.state_files():
                os.utime(path, follow_symlinks=False)  # "last used", for `termchat ps`
            return False
        if now - self.last_used < self.keep_alive:
            return False
        aside = []
        for path in self.state_files():
            moved = path.with_suffix(".expiring")
            os.replace(path, moved)
            aside.append((moved, path))
        if state.live_leases(self.pid, self.folder):  # a front-end attached as it expired
            for moved, path in aside:
                os.replace(moved, path)
            self.last_used = now
            return False
        for moved, _ in aside:
            moved.unlink(missing_ok=True)
        return True

    def run(self) -> None:
        while not self.tick():
            time.sleep(POLL_S)
        state.remove_leases(self.pid, self.folder)
        pgid = os.getpgid(0)
        os.killpg(pgid, signal.SIGTERM)  # the server shuts down as on `termchat stop`
        time.sleep(20)
        os.killpg(pgid, signal.SIGKILL)


def settings(raw: str) -> tuple[Path, float] | None:
    """WARM_ENV's value, checked: a folder and a finite keep-alive in seconds."""
    from termchat import numbers

    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("serve"), str):
        return None
    keep = numbers.real(data.get("keep_alive"), 0.0, state.MAX_KEEP_ALIVE_S)
    return None if keep is None else (Path(data["serve"]), keep)


def start_from_env() -> None:
    """In the engine process: keep-alive if the launcher asked for it."""
    raw = os.environ.pop(WARM_ENV, "")
    if not raw:
        return
    checked = settings(raw)
    if checked is None:
        print(f"termchat: ignoring {WARM_ENV}={raw[:200]!r}: not a serve folder and a finite keep-alive", file=sys.stderr)
        return
    dog = Watchdog(*checked)
    threading.Thread(target=dog.run, name="termchat-keep-alive", daemon=True).start()
