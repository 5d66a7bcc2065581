"""Eager against compiled (torch.compile) engines: start-up time and decode speed.

    python -m termchat.bench.startup [--profile local] [--rounds 3]

Starts the profile's engine eager, then compiled, `--rounds` times in turn
(so the host's drift falls on both alike). The first compiled start compiles
when vLLM's compile cache (~/.cache/vllm) has nothing for these settings,
later ones load it. After two warm-up requests each engine answers the same
6 prompts (4 code, 2 chat) at T=0, 200 tokens at most. Prints seconds to
ready (and whether the compiled model was compiled or loaded), the median
decode tok/s of each variant, and how many greedy replies of the compiled
engine equal the eager engine's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from termchat.bench.prompt_sets import builtin
from termchat.bench.runner import warm_up
from termchat.engine.client import Sampling, complete_sync
from termchat.engine.connect import open_engine
from termchat.engine.process import LOADED_COMPILED
from termchat.errors import UserError
from termchat.profiles import load_config


def run(profile, prompts: list[str]) -> tuple[float, str, list]:
    """Start, warm up, answer; stop. (seconds to ready, vLLM's log, replies)"""
    started = time.monotonic()
    engine = open_engine(profile, attach=False, timeout=900)
    ready = time.monotonic() - started
    try:
        log = engine.log_path.read_text(errors="replace") if engine.log_path else ""
        warm_up(engine)
        replies = [complete_sync(engine, [{"role": "user", "content": p}], Sampling(temperature=0.0, max_tokens=200)) for p in prompts]
    finally:
        engine.stop()
    return ready, log, replies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="local")
    parser.add_argument("--config")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    try:
        profile = load_config(args.config).get(args.profile)
    except UserError as exc:  # one line, as the CLI says it
        parser.error(str(exc))
    variants = {
        "eager": replace(profile, engine_args={**profile.engine_args, "enforce_eager": True}),
        "compiled": replace(profile, engine_args={k: v for k, v in profile.engine_args.items() if k != "enforce_eager"}),
    }
    prompts = [p.text for p in builtin(["code"])][:4] + [p.text for p in builtin(["chat"])][:2]
    ready: dict[str, list[float]] = {name: [] for name in variants}
    speeds: dict[str, list[float]] = {name: [] for name in variants}
    texts: dict[str, list[str]] = {}
    for number in range(args.rounds):
        for name, variant in variants.items():
            seconds, log, replies = run(variant, prompts)
            how = "" if name == "eager" else (" (loaded from vLLM's compile cache)" if LOADED_COMPILED in log else " (compiled)")
            if name == "eager" or number > 0 or LOADED_COMPILED in log:  # a first compile is reported, not averaged
                ready[name].append(seconds)
            speeds[name] += [r.stats.decode_tokens_per_s for r in replies if r.stats.decode_tokens_per_s]
            texts.setdefault(name, [r.text for r in replies])
            median = statistics.median(r.stats.decode_tokens_per_s for r in replies if r.stats.decode_tokens_per_s)
            print(f"round {number + 1} {name}: ready in {seconds:.0f} s{how}, decode median {median:.1f} tok/s", flush=True)
    eager, compiled = statistics.median(speeds["eager"]), statistics.median(speeds["compiled"])
    same = sum(a == b for a, b in zip(texts["eager"], texts["compiled"]))
    loaded = f"{statistics.median(ready['compiled']):.0f} s (cache loaded)" if ready["compiled"] else "- (it only compiled; run more rounds)"
    print(
        f"{args.profile}: decode eager {eager:.1f} tok/s, compiled {compiled:.1f} tok/s ({compiled / eager:.2f}x, medians over "
        f"{len(speeds['eager'])} replies each); ready eager {statistics.median(ready['eager']):.0f} s, compiled {loaded}; "
        f"{same} of {len(prompts)} greedy replies identical"
    )


if __name__ == "__main__":
    main()
