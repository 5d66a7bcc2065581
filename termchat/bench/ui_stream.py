"""Benchmark: how fast the chat view absorbs a streamed reply, and first paint.

    python -m termchat.bench.ui_stream [--tokens 4000] [--pace 80]

The CPU engine cannot send tokens faster than ~40/s, so a scripted stand-in
for the engine (`scripted_reply`, named as such) feeds a 4,000-token reply
with several code blocks into the real chat view (TermchatApp, headless
120x40), one step at a time, as fast as the view takes them. Prints the steps
absorbed per second, the time per step over the last 1,000 tokens against the
first 1,000 (flat cost per step keeps this near 1.0), and the time from
starting `termchat` in a terminal to its first painted screen.

At the engine's pace (`--pace` steps a second, as a fast profile sends them)
it then measures the CPU the view takes from the cores the engine decodes on:
prose with short code blocks, and one long code fence (which Textual
highlights and draws whole at every update), each paced (ui/widgets/message.py,
Pacer) and unpaced (an update per step, as Textual's own MarkdownStream). Prints the share of
a core and the updates a second. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pty
import re
import select
import statistics
import sys
import tempfile
import time

from termchat.engine.stats import Step

PARAGRAPH = (
    "Speculative decoding lets a small proposer guess several tokens that the large model then checks in one "
    "forward pass. When the guesses are right, the reply arrives faster; when they are wrong, the work is wasted. "
)
CODE = '''```python
def moving_average(values, window):
    """Average of each run of `window` values."""
    if window <= 0:
        raise ValueError("window must be positive")
    total = sum(values[:window])
    averages = [total / window]
    for index in range(window, len(values)):
        total += values[index] - values[index - window]
        averages.append(total / window)
    return averages
```
'''


def scripted_reply(tokens: int) -> list[str]:
    """A stand-in for a recorded engine reply: prose, lists and code blocks,
    cut into token-sized pieces (words and punctuation, ~4 characters)."""
    pieces: list[str] = []
    section = 0
    while len(pieces) < tokens:
        section += 1
        text = f"\n## Part {section}\n\n" + PARAGRAPH * 3 + "\n\n- first point\n- second point\n\n" + CODE + "\n" + PARAGRAPH + "\n"
        pieces.extend(re.findall(r"\s*\S{1,6}|\s+", text))
    return pieces[:tokens]


def scripted_code(tokens: int) -> list[str]:
    """A stand-in reply that is one long Python fence (a module written whole)."""
    methods = "\n".join(f'    def method_{i}(self, value):\n        """Return item {i} plus value."""\n        return self.items[{i}] + value\n' for i in range(tokens // 10 + 1))
    return re.findall(r"\s*\S{1,6}|\s+", "```python\nclass Items:\n" + methods + "```\n")[:tokens]


async def paced(pieces: list[str], pace: float, unpaced: bool) -> dict:
    """Feed `pieces` at `pace` steps a second; the process's CPU share and the widget's updates.

    `unpaced`: the pacer's limits lifted (no share, no interval, no wait for
    the screen), so the view updates at every step, as Textual's own
    MarkdownStream does and as termchat did before the pacer."""
    from textual.widgets import Markdown

    from termchat.ui.app import TermchatApp
    from termchat.ui.widgets import message
    from termchat.ui.widgets.message import MessageView

    updates = 0
    append, limits, drawn = Markdown.append, (message.VIEW_SHARE, message.UPDATE_EVERY_S), MessageView._drawn

    def counted(self, markdown):
        nonlocal updates
        updates += 1
        return append(self, markdown)

    async def not_waited(self) -> None:
        return None

    Markdown.append = counted
    if unpaced:
        message.VIEW_SHARE, message.UPDATE_EVERY_S, MessageView._drawn = 1e9, (0.0, 0.0), not_waited
    try:
        app = TermchatApp(start_engine=False, resume=False)
        async with app.run_test(size=(120, 40)) as pilot:
            view = MessageView("assistant", "scripted stand-in engine")
            await app.query_one("#chat").mount(view)
            await pilot.pause()
            updates, wall, cpu = 0, time.monotonic(), time.process_time()
            for number, piece in enumerate(pieces):
                await asyncio.sleep(max(0.0, wall + number / pace - time.monotonic()))
                await view.append(Step(piece, (number,), time.monotonic()))
            wall, cpu = time.monotonic() - wall, time.process_time() - cpu
            await view.finish(None)
            shown = view.body.source
    finally:
        Markdown.append, MessageView._drawn = append, drawn
        message.VIEW_SHARE, message.UPDATE_EVERY_S = limits
    return {"core": cpu / wall, "updates_per_s": updates / wall, "whole": shown.rstrip() == "".join(pieces).rstrip()}


async def absorb(tokens: int) -> dict:
    from termchat.ui.app import TermchatApp
    from termchat.ui.widgets.message import MessageView

    pieces = scripted_reply(tokens)
    app = TermchatApp(start_engine=False, resume=False)
    times: list[float] = []
    async with app.run_test(size=(120, 40)) as pilot:
        chat = app.query_one("#chat")
        view = MessageView("assistant", "scripted stand-in engine")
        await chat.mount(view)
        await pilot.pause()
        started = time.perf_counter()
        for number, piece in enumerate(pieces):
            t0 = time.perf_counter()
            await view.append(Step(piece, (number,), t0))
            times.append(time.perf_counter() - t0)
        await view.finish(None)  # waits until everything written is rendered
        await pilot.pause()
        total = time.perf_counter() - started
        blocks = len(view.code_blocks())
    first, last = statistics.mean(times[:1000]), statistics.mean(times[-1000:])
    return {"steps": len(pieces), "seconds": total, "steps_per_s": len(pieces) / total, "first_ms": first * 1e3, "last_ms": last * 1e3, "ratio": last / first, "code_blocks": blocks}


def first_paint(timeout: float = 30.0) -> float:
    """Seconds from exec of `termchat` in a pseudo-terminal to the status bar on screen.

    The profile is a remote endpoint on a closed local port, so no engine is
    started: this measures the UI alone."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as handle:
        handle.write('[profiles.paint]\nendpoint = "http://127.0.0.1:9/v1"\nmodel = "m"\n')
        config = handle.name
    pid, fd = pty.fork()
    if pid == 0:  # child
        os.environ.update({"TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"})
        os.execv(sys.executable, [sys.executable, "-m", "termchat.cli", "--config", config, "--profile", "paint"])
    started = time.perf_counter()
    screen = b""
    try:
        while time.perf_counter() - started < timeout:
            ready, _, _ = select.select([fd], [], [], 0.05)
            if ready:
                try:
                    screen += os.read(fd, 65536)
                except OSError:
                    break
                if b"paint" in screen and b"Help" in screen:
                    return time.perf_counter() - started
        return float("nan")
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.unlink(config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=5, help="repetitions; medians are reported (a shared machine is noisy)")
    parser.add_argument("--paint-runs", type=int, default=3)
    parser.add_argument("--pace", type=float, default=80.0, help="steps a second for the CPU-share part; 0 skips it")
    parser.add_argument("--pace-tokens", type=int, default=800)
    args = parser.parse_args(argv)
    from termchat.bench.command import machine_line

    print(machine_line())
    results = [asyncio.run(absorb(args.tokens)) for _ in range(args.runs)]
    paints = [first_paint() for _ in range(args.paint_runs)]

    def median(key: str) -> float:
        return statistics.median(r[key] for r in results)

    def listing(key: str, spec: str) -> str:
        return ", ".join(format(r[key], spec) for r in results)

    print(f"chat view, scripted stand-in engine, {results[0]['steps']} steps, {results[0]['code_blocks']} code blocks, headless 120x40, median of {args.runs} runs")
    print(f"  absorbed: {median('steps_per_s'):.0f} steps/s (runs: {listing('steps_per_s', '.0f')}; final render included)")
    print(f"  time per step: first 1000 {median('first_ms'):.3f} ms, last 1000 {median('last_ms'):.3f} ms, ratio {median('ratio'):.2f} (runs: {listing('ratio', '.2f')})")
    print(f"first paint of `termchat` in a pseudo-terminal: median {statistics.median(paints):.2f} s of {len(paints)} ({', '.join(f'{p:.2f}' for p in paints)})")
    if args.pace > 0:
        print(f"at the engine's pace, {args.pace:g} steps/s, {args.pace_tokens} steps, headless 120x40 (drawn, not written out):")
        print(f"  {'reply':<28} {'stream':<10} {'core':>6} {'updates/s':>10}  text whole")
        for name, pieces in (("prose, short code blocks", scripted_reply(args.pace_tokens)), ("one long code fence", scripted_code(args.pace_tokens))):
            for unpaced in (True, False):
                r = asyncio.run(paced(pieces, args.pace, unpaced))
                print(f"  {name:<28} {'unpaced' if unpaced else 'paced':<10} {r['core']:>6.2f} {r['updates_per_s']:>10.1f}  {'yes' if r['whole'] else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
