"""Fewer bytes per token: is bfloat16 as good as float32, and how much faster?

    python -m termchat.bench.dtype [--per-category 4] [--runs 2]

Decoding one token at batch 1 reads every weight once, so halving the bytes
(float32 -> bfloat16) can nearly double the speed where the CPU computes in
bfloat16 natively (AVX512-BF16, AMX). A variant may become the default only if
it matches the float32 reference closely (the quality guard):

- the float32 engine's greedy reply to each prompt (64 tokens) is scored
  under both engines (`prompt_logprobs` of the same tokens): the mean
  log-probability under the variant must be within 1% of float32's own;
- the variant's own greedy first 64 tokens: identical to float32's on most
  prompts (reported, with where they part).

Speed: median decode tokens/s of 128-token greedy replies on the same prompts,
the engines alternated (`--runs`), plain decoding (the default profile
without speculation).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from termchat import models
from termchat.bench.prompt_sets import builtin
from termchat.bench.roofline import read_bandwidth, weight_count
from termchat.engine.client import Sampling, complete_sync
from termchat.engine.connect import open_engine
from termchat.profiles import builtin_profiles

GUARD_TOKENS = 64
LOGPROB_LIMIT = 0.01  # relative


async def continuation_logprob(engine, prompt: str, reply: str) -> tuple[float, int]:
    """Sum and count of the log-probabilities of `reply`'s tokens after `prompt`, under `engine`."""
    user = [{"role": "user", "content": prompt}]
    head = await engine.client.post(engine.root_url + "/tokenize", json={"model": engine.model_name, "messages": user, "add_generation_prompt": True})
    head.raise_for_status()
    start = head.json()["count"]
    body = {
        "model": engine.model_name,
        "messages": [*user, {"role": "assistant", "content": reply}],
        "continue_final_message": True,
        "add_generation_prompt": False,
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 0,
    }
    response = await engine.client.post(engine.base_url + "/chat/completions", json=body, timeout=120.0)
    response.raise_for_status()
    entries = response.json()["prompt_logprobs"][start:]
    # prompt_logprobs = 0: each position holds its own token only
    values = [next(iter(entry.values()))["logprob"] for entry in entries if entry]
    return sum(values), len(values)


def run_engine(profile, prompts: list[str], references: list[str] | None):
    """Greedy 64-token replies, decode speed of 128-token replies, and the
    reference replies' log-probabilities under this engine."""
    engine = open_engine(profile, progress=lambda line: print(line, file=sys.stderr), attach=False)
    try:
        complete_sync(engine, [{"role": "user", "content": "Say hi."}], Sampling(temperature=0.0, max_tokens=8))
        greedy = [complete_sync(engine, [{"role": "user", "content": p}], Sampling(temperature=0.0, max_tokens=GUARD_TOKENS)) for p in prompts]
        speeds = [complete_sync(engine, [{"role": "user", "content": p}], Sampling(temperature=0.0, max_tokens=128)).stats.decode_tokens_per_s for p in prompts]
        refs = references or [g.text for g in greedy]
        scored = [engine.run(lambda p=p, r=r: continuation_logprob(engine, p, r)) for p, r in zip(prompts, refs)]
    finally:
        engine.stop()
    return greedy, [s for s in speeds if s], scored


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m termchat.bench.dtype", description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-category", type=int, default=4)
    parser.add_argument("--runs", type=int, default=2, help="alternations of the two engines for the speed figure")
    parser.add_argument("--variant", default="bfloat16")
    args = parser.parse_args(argv)
    base = builtin_profiles()["local"].without_speculation()
    by_category: dict[str, list] = {}
    for prompt in builtin():
        by_category.setdefault(prompt.category, []).append(prompt)
    prompts = [p.text for items in by_category.values() for p in items[: args.per_category]]
    reference, variant = replace(base, dtype="float32"), replace(base, dtype=args.variant)
    speeds: dict[str, list[float]] = {"float32": [], args.variant: []}
    ref_greedy = ref_scored = var_greedy = var_scored = None
    for run in range(args.runs):
        greedy, speed, scored = run_engine(reference, prompts, None if ref_greedy is None else [g.text for g in ref_greedy])
        ref_greedy, ref_scored = ref_greedy or greedy, ref_scored or scored
        speeds["float32"].append(statistics.median(speed))
        greedy, speed, scored = run_engine(variant, prompts, [g.text for g in ref_greedy])
        var_greedy, var_scored = var_greedy or greedy, var_scored or scored
        speeds[args.variant].append(statistics.median(speed))
        print(f"run {run + 1}: float32 {speeds['float32'][-1]:.1f} tok/s, {args.variant} {speeds[args.variant][-1]:.1f} tok/s", flush=True)
    ref_mean = sum(s for s, _ in ref_scored) / sum(n for _, n in ref_scored)
    var_mean = sum(s for s, _ in var_scored) / sum(n for _, n in var_scored)
    identical = sum(a.text == b.text for a, b in zip(ref_greedy, var_greedy))
    shift = abs(var_mean - ref_mean) / abs(ref_mean)
    print(f"\n{len(prompts)} built-in prompts ({args.per_category} per category), plain decoding, greedy\n")
    print(f"| | float32 | {args.variant} | ratio |\n|---|---|---|---|")
    a, b = statistics.median(speeds["float32"]), statistics.median(speeds[args.variant])
    print(f"| decode tok/s (median of {args.runs} alternated runs) | {a:.1f} | {b:.1f} | {b / a:.2f} |")
    print(f"| mean log-probability of float32's greedy replies ({sum(n for _, n in ref_scored)} tokens) | {ref_mean:.4f} | {var_mean:.4f} | shift {shift:.2%} (limit {LOGPROB_LIMIT:.0%}) |")
    print(f"| greedy first {GUARD_TOKENS} tokens identical to float32's | | {identical}/{len(prompts)} | |")
    bandwidth, weights = read_bandwidth(), weight_count(Path(models.resolve(base.model)))
    limit = {"float32": bandwidth / (weights * 4), args.variant: bandwidth / (weights * (2 if "16" in args.variant else 4))}
    print(f"| the memory limit: {bandwidth / 1e9:.1f} GB/s read / weight bytes per step | {limit['float32']:.1f} tok/s | {limit[args.variant]:.1f} tok/s | |")
    print(f"| share of the limit reached | {a / limit['float32']:.0%} | {b / limit[args.variant]:.0%} | |")
    for prompt, x, y in zip(prompts, ref_greedy, var_greedy):
        if x.text != y.text:
            where = next((i for i, (c, d) in enumerate(zip(x.text, y.text)) if c != d), min(len(x.text), len(y.text)))
            print(f"  parts at character {where}: {prompt[:50]!r}")
    print(f"\nquality guard: {'PASS' if shift <= LOGPROB_LIMIT and identical * 2 > len(prompts) else 'FAIL'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
