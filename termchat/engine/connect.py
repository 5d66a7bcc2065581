"""The engine for a profile, ready to answer: remote, attached to a running
`termchat serve`, or started here. The one place that chooses."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from termchat.engine import registry, state
from termchat.engine.endpoint import Engine, EngineState, remote_engine
from termchat.engine.process import ManagedEngine, Progress
from termchat.errors import UserError
from termchat.profiles import Profile


async def open_engine_async(
    profile: Profile,
    progress: Progress | None = None,
    launched: Callable[[ManagedEngine], None] | None = None,
    attach: bool = True,
    timeout: float = 600.0,
    keep_warm: bool = False,
) -> Engine:
    """The engine for a profile, ready to answer: remote, attached to a running
    `termchat serve` or warm engine, or started here.

    With `keep_warm` (the front-ends) and the profile's keep_alive above 0,
    an engine started here is warm (watchdog.py): it outlives this process, and
    this process holds a lease on it until `release()`. Run it on the main
    thread's event loop: an engine that is not warm is launched from that
    thread so that it dies with termchat (PDEATHSIG). `launched` hears of a
    started engine at once, so the caller can stop it while it warms up."""
    if profile.is_remote:
        return remote_engine(profile)
    keep_alive = profile.keep_alive_s if keep_warm and attach else 0.0
    for _ in range(2):
        if attach:
            served = await asyncio.to_thread(registry.find_served, profile, keep_alive > 0, True)
            if served is not None:
                if served.state == EngineState.STARTING:  # started by `termchat serve` or another front-end moments ago
                    try:
                        await served.wait_ready_async(timeout=timeout, progress=progress)
                    except BaseException:
                        served.release()  # its lease, if any; whoever started it reports its failure
                        raise
                return served
        if keep_alive > 0:
            await asyncio.to_thread(registry.make_room, keep=profile.name)
        engine = ManagedEngine.launch(profile, keep_alive=keep_alive)
        if keep_alive > 0:
            engine.lease = state.take_lease(engine.pid)  # before the engine's watchdog first looks
            # findable while it starts: a second front-end waits for it
            there = registry.write_state(engine, keep_alive)
            if there is not None:  # another engine of the profile was recorded meanwhile: that one is used, if it can be
                await asyncio.to_thread(engine.stop)
                if there.fingerprint != registry.fingerprint(profile):
                    raise UserError(registry.in_the_way(profile, there))
                continue
        if launched is not None:
            launched(engine)
        await engine.wait_ready_async(timeout=timeout, progress=progress)
        return engine
    raise UserError(f"profile '{profile.name}': another engine of it started at the same moment twice, and went; try again")


def open_engine(profile: Profile, progress: Progress | None = None, attach: bool = True, timeout: float = 600.0, keep_warm: bool = False) -> Engine:
    """open_engine_async for callers without an event loop; an engine that
    does not get ready is stopped."""
    started: list[ManagedEngine] = []
    try:
        async def once() -> Engine:
            engine = await open_engine_async(profile, progress, started.append, attach, timeout, keep_warm)
            await engine.close()  # its client belongs to this loop, which ends here
            return engine

        return asyncio.run(once())
    except BaseException:
        for engine in started:
            engine.stop()
        raise
