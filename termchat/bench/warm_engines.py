"""What warm engines save: relaunch and switch times, idle cost, expiry.

    python -m termchat.bench.warm_engines [--runs 2] [--keep-alive 120]

All in a throw-away TERMCHAT_HOME, with `local-plain` as profile A and
`local` as profile B (the built-ins, keep_alive set), the real engine:

- *launch to ready*: a new Python process that opens the TUI (headless,
  Textual's run_test) and waits until its engine is ready, timed from before
  the process starts, so interpreter start-up and imports count. Cold (no
  engine running: what every launch cost before keep-alive) against warm
  (the engine the previous launch left), alternated, in one run;
- *switch*: in one TUI, A -> B (cold) -> A (warm) -> B (warm), each until
  the status bar is ready on the new profile;
- an idle warm engine's CPU time over 30 s and its resident memory;
- expiry: keep_alive 10 s, seconds from the last front-end leaving to no
  process of the engine left.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from termchat.profiles import Config, builtin_profiles


def profiles(keep_alive: float) -> Config:
    built = builtin_profiles()
    return Config({"a": replace(built["local-plain"], name="a", keep_alive=keep_alive), "b": replace(built["local"], name="b", keep_alive=keep_alive)}, default_profile="a")


async def tui(config: Config, first: str, then: list[str]) -> list[float]:
    """Seconds to ready: the TUI on `first`, then each switch in `then`."""
    from termchat.chat.store import Store
    from termchat.ui.app import TermchatApp

    async def ready(app, name: str, started: float) -> float:
        while not (app.engines.ready and app.engines.engine.profile.name == name):
            if time.monotonic() - started > 600:
                raise SystemExit(f"profile {name} did not get ready in 600 s")
            await asyncio.sleep(0.02)
        return time.monotonic() - started

    with tempfile.TemporaryDirectory() as folder:
        app = TermchatApp(config=config, profile=first, resume=False, store=Store(Path(folder) / "h.db"))
        started = time.monotonic()
        async with app.run_test(size=(120, 40)):
            times = [await ready(app, first, started)]
            for name in then:
                started = time.monotonic()
                await app.chat_screen.switch_profile(name)
                times.append(await ready(app, name, started))
            app.exit()
    return times


def launch_to_ready(keep_alive: float) -> float:
    """A new process that opens the TUI on profile A; seconds until its engine is ready."""
    code = f"import asyncio; from termchat.bench.warm_engines import profiles, tui; asyncio.run(tui(profiles({keep_alive}), 'a', []))"
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", code], check=True, timeout=900)
    return time.monotonic() - started  # the process also quit, within a few ms of ready


def stop_all() -> None:
    from termchat.engine import registry

    for engine in registry.running_engines():
        registry.stop_engine(engine)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m termchat.bench.warm_engines", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--keep-alive", type=float, default=120.0)
    args = parser.parse_args(argv)
    from termchat import models, paths
    from termchat.engine import proc, registry

    models_dir = str(paths.models_dir())
    with tempfile.TemporaryDirectory(prefix="termchat-warm-") as home:
        os.environ["TERMCHAT_HOME"], os.environ["TERMCHAT_MODELS"] = home, models_dir
        models.prepare(quiet=True)
        cold, hot = [], []
        try:
            for run in range(args.runs):
                stop_all()
                cold.append(launch_to_ready(args.keep_alive))
                hot.append(launch_to_ready(args.keep_alive))
                print(f"run {run + 1}: launch to ready cold {cold[-1]:.1f} s, warm {hot[-1]:.2f} s", file=sys.stderr, flush=True)
            stop_all()
            switches = asyncio.run(tui(profiles(args.keep_alive), "a", ["b", "a", "b"]))
            print(f"switches: {json.dumps([round(s, 2) for s in switches])}", file=sys.stderr, flush=True)
            engine = next(e for e in registry.running_engines() if e.profile == "a")
            time.sleep(5)  # the last request's after-effects
            before = proc.cpu_seconds(engine.pid)
            time.sleep(30)
            idle_cpu = proc.cpu_seconds(engine.pid) - before
            rss = proc.rss_bytes(engine.pid)
            stop_all()
            asyncio.run(tui(profiles(10), "a", []))
            left = time.monotonic()
            pid = next(e.pid for e in registry.running_engines() if e.profile == "a")
            from termchat.engine.proc import group_members

            while group_members(pid) and time.monotonic() - left < 120:
                time.sleep(0.2)
            expiry = time.monotonic() - left
        finally:
            stop_all()
    print(f"\nwarm engines, {args.runs} runs, keep_alive {args.keep_alive:g} s (A = local-plain, B = local)")
    print(f"{'':40}{'cold':>8}{'warm':>8}{'ratio':>8}")
    c, h = statistics.median(cold), statistics.median(hot)
    print(f"{'launch to ready (new process, TUI), s':40}{c:8.1f}{h:8.2f}{h / c:8.3f}")
    print(f"{'switch A->B cold, B->A warm, s':40}{switches[1]:8.1f}{switches[2]:8.2f}{switches[2] / switches[1]:8.3f}")
    print(f"{'switch A->B warm, s':40}{'':8}{switches[3]:8.2f}")
    print(f"first launch to ready in that TUI: {switches[0]:.1f} s")
    print(f"idle warm engine: {idle_cpu:.2f} s of CPU in 30 s ({idle_cpu / 30:.2%} of one core), resident memory {rss / 2**30:.2f} GB")
    print(f"expiry with keep_alive 10 s: no process left {expiry:.1f} s after the TUI quit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
