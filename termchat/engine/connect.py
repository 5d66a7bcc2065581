"""The engine for a profile, ready to answer: remote, attached to a running
`termchat serve`, or started here. The one place that chooses."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from termchat.engine.endpoint import Engine, remote_engine
from termchat.engine.process import ManagedEngine, Progress
from termchat.engine.served import find_served
from termchat.profiles import Profile


async def open_engine_async(
    profile: Profile,
    progress: Progress | None = None,
    launched: Callable[[ManagedEngine], None] | None = None,
    attach: bool = True,
    timeout: float = 600.0,
) -> Engine:
    """The engine for a profile, ready to answer: remote, attached to a running
    `termchat serve`, or started here.

    Run it on the main thread's event loop: the engine is launched from that
    thread so that it dies with termchat (PDEATHSIG). `launched` hears of a
    started engine at once, so the caller can stop it while it warms up."""
    if profile.is_remote:
        return remote_engine(profile)
    if attach:
        served = await asyncio.to_thread(find_served, profile)
        if served is not None:
            return served
    engine = ManagedEngine.launch(profile)
    if launched is not None:
        launched(engine)
    await engine.wait_ready_async(timeout=timeout, progress=progress)
    return engine


def open_engine(profile: Profile, progress: Progress | None = None, attach: bool = True, timeout: float = 600.0) -> Engine:
    """open_engine_async for callers without an event loop; an engine that
    does not get ready is stopped."""
    started: list[ManagedEngine] = []
    try:
        async def once() -> Engine:
            engine = await open_engine_async(profile, progress, started.append, attach, timeout)
            await engine.close()  # its client belongs to this loop, which ends here
            return engine

        return asyncio.run(once())
    except BaseException:
        for engine in started:
            engine.stop()
        raise
