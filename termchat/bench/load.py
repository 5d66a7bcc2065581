"""Decode speed beside busy processes: termchat and llama.cpp, same run.

    python -m termchat.bench.load [--busy 0,1,2] [--profiles local,local-plain] [--max-tokens 64] [--fixed-threads]

Users run termchat beside builds, browsers and indexers; on a 2-core machine
that is the usual case. For each engine (one at a time) and each load level,
the bench starts that many `python -c "while True: pass"` processes, waits a
second, and decodes one prompt of each of code, extraction and chat, greedy.
Each level takes the next prompt of each category (the n-th level the n-th
prompt), so suffix decoding's cache cannot carry a reply from one level to
the next; every engine gets the same prompts at each level. It prints decode
tok/s (median of the three) per level and the share of the quiet figure each
keeps.

`--fixed-threads` adds a column for the first profile with the thread count
fixed at start (TERMCHAT_ADAPTIVE_THREADS=0, vllm_ext/threads.py): what
termchat did before the engine followed the load. Beside a busy process it
decodes at about 1 tok/s, so that column takes minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager

from termchat.bench.peers import (
    llama_cpp_model,
    llama_cpp_speed,
    profile_specs,
    termchat_profile,
)
from termchat.bench.prompt_sets import builtin
from termchat.progress import engine_start_line

CATEGORIES = ("code", "extraction", "chat")
BUSY = [sys.executable, "-c", "while True: pass"]


@contextmanager
def busy(count: int):
    """`count` processes that spin on a core each, for as long as the block runs."""
    procs = [subprocess.Popen(BUSY) for _ in range(count)]
    try:
        time.sleep(1.0 if procs else 0.0)
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def prompts_for(level: int):
    """The level-th prompt of each category (distinct prompts per level)."""
    by_category: dict[str, list] = {c: [] for c in CATEGORIES}
    for p in builtin():
        if p.category in by_category:
            by_category[p.category].append(p)
    return [by_category[c][level % len(by_category[c])] for c in CATEGORIES]


def termchat_levels(spec: str, levels: list[int], max_tokens: int, env: dict | None = None) -> list[float | None]:
    from termchat.engine.client import Sampling, complete_sync
    from termchat.engine.connect import open_engine

    profile = termchat_profile(spec)
    if env:
        profile = dataclasses.replace(profile, env={**profile.env, **env})
    engine = open_engine(profile, progress=engine_start_line(), attach=False)
    try:
        complete_sync(engine, [{"role": "user", "content": "Say hi."}], Sampling(temperature=0.0, max_tokens=8))  # warm-up
        medians = []
        for i, level in enumerate(levels):
            with busy(level):
                speeds = [complete_sync(engine, [{"role": "user", "content": p.text}], Sampling(temperature=0.0, max_tokens=max_tokens)).stats.decode_tokens_per_s
                          for p in prompts_for(i)]
            medians.append(_median(speeds))
            print(f"  {spec}{' ' + str(env) if env else ''}, {level} busy: {_cell(medians[-1])} tok/s", file=sys.stderr, flush=True)
        return medians
    finally:
        engine.stop()


def llama_cpp_levels(levels: list[int], max_tokens: int) -> list[float | None] | None:
    llm = llama_cpp_model()
    if llm is None:
        return None
    medians = []
    for i, level in enumerate(levels):
        with busy(level):
            medians.append(_median([llama_cpp_speed(llm, p.text, max_tokens) for p in prompts_for(i)]))
        print(f"  llama.cpp, {level} busy: {_cell(medians[-1])} tok/s", file=sys.stderr, flush=True)
    return medians


def _median(speeds) -> float | None:
    known = [s for s in speeds if s]
    return statistics.median(known) if known else None


def _cell(value: float | None) -> str:
    return f"{value:.1f}" if value else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m termchat.bench.load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", default="0,1,2", help="numbers of busy processes, comma-separated; the first is the reference (0: quiet)")
    parser.add_argument("--profiles", default="local,local-plain", help="built-in profiles (NAME or NAME:FORMAT), comma-separated")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--fixed-threads", action="store_true", help="also the first profile with its thread count fixed at start")
    args = parser.parse_args(argv)
    try:
        levels = [int(n) for n in args.busy.split(",")]
    except ValueError:
        parser.error("--busy takes whole numbers, comma-separated")
    if not levels or min(levels) < 0 or max(levels) > 2 * (os.cpu_count() or 1):
        parser.error(f"--busy takes 0 to {2 * (os.cpu_count() or 1)} processes")
    names = profile_specs(parser, args.profiles)
    rows: dict[str, list[float | None] | None] = {}
    for name in names:
        print(f"termchat {name} ...", file=sys.stderr, flush=True)
        rows[f"termchat {name}"] = termchat_levels(name, levels, args.max_tokens)
    if args.fixed_threads:
        print(f"termchat {names[0]}, threads fixed ...", file=sys.stderr, flush=True)
        rows[f"termchat {names[0]}, threads fixed at start"] = termchat_levels(names[0], levels, args.max_tokens, {"TERMCHAT_ADAPTIVE_THREADS": "0"})
    print("llama.cpp ...", file=sys.stderr, flush=True)
    rows["llama.cpp Q4_1"] = llama_cpp_levels(levels, args.max_tokens)
    from termchat.bench.command import machine_line
    from termchat.bench.roofline import read_bandwidth

    print("\n" + machine_line(read_bandwidth()))
    print(f"decode tokens/s, T=0, {args.max_tokens} tokens, median of one prompt each of {', '.join(CATEGORIES)} per level "
          f"(distinct prompts per level); busy = `python -c \"while True: pass\"` processes\n")
    head = [f"{n} busy" for n in levels] + [f"kept with {n} busy" for n in levels[1:]]
    print("| engine | " + " | ".join(head) + " |")
    print("|---" * (len(head) + 1) + "|")
    for label, medians in rows.items():
        if medians is None:
            print(f"| {label} | not installed here (pip install 'termchat[peers]') |")
            continue
        kept = [f"{m / medians[0]:.0%}" if m and medians[0] else "-" for m in medians[1:]]
        print(f"| {label} | " + " | ".join([_cell(m) for m in medians] + kept) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
