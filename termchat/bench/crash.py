"""Benchmark: what does `kill -9` of termchat lose?

    python -m termchat.bench.crash [--runs 20]

Starts `termchat serve` (one engine for every run), then runs `termchat ask`
20 times, kills it with SIGKILL at a random moment of its reply, and compares
what was on screen (its stdout) with what the history database holds. Prints
per run: user message kept or lost, reply characters lost, and those
characters as seconds of that reply. The goal: 0 messages and at most one
second of reply lost each time. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import random
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time

PROMPT = "Tell me a long story about a lighthouse keeper, her cat and a storm, in at least six paragraphs."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    home = tempfile.mkdtemp(prefix="termchat-crash-")
    env = {**os.environ, "TERMCHAT_HOME": home}
    from termchat import paths

    env["TERMCHAT_MODELS"] = str(paths.models_dir())
    serve = subprocess.Popen([sys.executable, "-m", "termchat.cli", "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    os.environ.update(TERMCHAT_HOME=home, TERMCHAT_MODELS=env["TERMCHAT_MODELS"])
    from termchat.engine.registry import find_served
    from termchat.profiles import builtin_profiles
    from termchat.chat.store import Store

    try:
        deadline = time.monotonic() + 400
        while find_served(builtin_profiles()["local"]) is None:
            if time.monotonic() > deadline or serve.poll() is not None:
                print("termchat serve did not start", file=sys.stderr)
                return 1
            time.sleep(1)
        rows = []
        for run in range(args.runs):
            before = {c.id for c in Store().conversations()}
            kill_after = rng.uniform(0.3, 6.0)  # seconds into the reply
            proc = subprocess.Popen([sys.executable, "-m", "termchat.cli", "ask", "--temperature", "0.8", "--seed", str(run), "--max-tokens", "600", PROMPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            screen, first = b"", None
            while True:
                ready, _, _ = select.select([proc.stdout], [], [], 0.02)
                if ready:
                    chunk = os.read(proc.stdout.fileno(), 65536)
                    if not chunk:
                        break
                    screen += chunk
                    first = first or time.monotonic()
                if first and time.monotonic() - first >= kill_after:
                    break
            elapsed = time.monotonic() - (first or time.monotonic())
            os.kill(proc.pid, signal.SIGKILL)
            screen += proc.stdout.read()
            proc.wait()
            shown = screen.decode("utf-8", "replace")
            new = [c for c in Store().conversations() if c.id not in before]
            messages = Store().messages(new[0].id) if new else []
            user_kept = any(m.role == "user" and m.content == PROMPT for m in messages)
            saved = next((m.content for m in messages if m.role == "assistant"), "")
            lost = len(shown) - len(saved) if shown.startswith(saved) else len(shown)
            rate = len(shown) / elapsed if elapsed > 0 else 0.0
            seconds = lost / rate if rate else 0.0
            rows.append((user_kept, lost, seconds, len(shown)))
            print(f"run {run + 1:2}: killed {elapsed:4.1f} s into the reply; shown {len(shown):5} chars; saved {len(saved):5}; lost {lost:4} chars = {seconds:.2f} s; user message {'kept' if user_kept else 'LOST'}", flush=True)
        lost_messages = sum(not r[0] for r in rows)
        worst = max(r[2] for r in rows)
        print(f"\n{args.runs} kills: user messages lost {lost_messages}; reply lost per kill: median {statistics.median(r[2] for r in rows):.2f} s, worst {worst:.2f} s ({max(r[1] for r in rows)} chars)")
        return 0
    finally:
        os.killpg(serve.pid, signal.SIGINT)
        serve.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
