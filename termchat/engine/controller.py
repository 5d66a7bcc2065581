"""The engine of the current profile, for a front-end: start, stop, switch, restart.

The TUI and the REPL both hold one; it keeps the rule that matters for
memory (the old engine is gone before the new one starts, unless it stays
warm within the memory budget: warm.py) and the rule that matters for Ctrl+C
and quitting while an engine warms up (the controller knows a launched engine
at once, so `stop` reaches it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from termchat.engine.connect import open_engine_async
from termchat.engine.endpoint import Engine, EngineState
from termchat.engine.process import ManagedEngine
from termchat.errors import UserError
from termchat.profiles import Profile


class EngineController:
    def __init__(self, on_progress: Callable[[ManagedEngine], None] | None = None):
        self.engine: Engine | None = None
        self.on_progress = on_progress  # hears of start-up progress, about twice a second

    @property
    def state(self) -> EngineState:
        return self.engine.state if self.engine is not None else EngineState.NOT_STARTED

    @property
    def ready(self) -> bool:
        return self.engine is not None and self.engine.state == EngineState.READY

    async def start(self, profile: Profile) -> Engine:
        """The profile's engine, ready (raises UserError with what went wrong).

        Cancelled (a switch, a quit), it leaves a launched engine in `self.engine`
        for the canceller's `stop()`: stopping it here would race with the start
        that follows, and the old engine must be gone before the new one starts."""
        launched_here: list[ManagedEngine] = []

        def launched(engine: ManagedEngine) -> None:
            launched_here.append(engine)
            self.engine = engine  # so that a switch or quit stops it while it warms up

        def progress(line: str) -> None:
            if self.on_progress is not None and isinstance(self.engine, ManagedEngine):
                self.on_progress(self.engine)

        try:
            self.engine = await open_engine_async(profile, progress=progress, launched=launched, keep_warm=True)
        except UserError:
            for engine in launched_here:  # died or never got ready: nothing of it stays
                if self.engine is engine:
                    self.engine = None
                await asyncio.to_thread(engine.stop)
            raise
        return self.engine

    async def stop(self, kill: bool = False) -> None:
        """Leave the engine (off the event loop: it may wait for the processes
        to end). A warm one stays for keep_alive, unless `kill` (a restart)."""
        engine, self.engine = self.engine, None
        if engine is not None:
            await engine.close()
            await asyncio.to_thread(engine.stop if kill else engine.release)

    def stop_now(self) -> None:
        """For exits, where there is no loop left to wait on."""
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.release()

    async def switch(self, profile: Profile, kill: bool = False) -> Engine:
        """Leave the old engine, then open the new one (with `kill`, a restart)."""
        await self.stop(kill)
        return await self.start(profile)

    async def alive_after(self, seconds: float = 1.0) -> bool:
        """Is the engine still up after a broken reply? (a killed engine's socket
        can close a moment before its process is seen to end)"""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while self.engine is not None and self.engine.alive():
            if loop.time() > end:
                return True
            await asyncio.sleep(0.1)
        return False

    def mark_failed(self) -> None:
        if self.engine is not None:
            self.engine.state = EngineState.FAILED
