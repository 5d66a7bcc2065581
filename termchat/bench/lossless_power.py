"""How often does `doctor --verify`'s sampled check raise a false alarm, and
how often does it catch a broken sampler?

    python -m termchat.bench.lossless_power [--seeds 48] [--trials 1000] [--save pool.json | --load pool.json]

A pool of replies from the plain engine (the default profile without
speculation: no speculation, so lossless by construction), sampled as the
check samples them (verify.SAMPLED_PROMPTS, T = 0.7, top-p 0.95, 80 tokens,
the top 20 log-probabilities at each position). Then, at the check's sample
sizes (12 replies a side for `doctor --verify`, 16 for the test suite):

- false alarms: two disjoint random sets of replies from the pool, compared
  as the check compares an engine with speculation and one without;
- power: the "speculative" set's tokens replaced by what a broken sampler
  would have drawn at each of their positions, from the reported raw
  distribution: temperature halved (0.35), doubled (1.4), zero (greedy), and
  5% garbage (a token outside the top 20); and a control, the correct
  sampler simulated (T = 0.7), which must alarm no more than real replies:
  it checks the simulation.

The simulation knows the top 20 tokens of each position; the rest of the
distribution is one block of mass 1 - (their sum), heated as if made of
tokens as probable as the 20th: the least mass a heated tail can have, so the
power against "doubled" is if anything under-estimated. A defect's other
effect (the reply going elsewhere after a different token) is not simulated:
the check sees only ranks.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from termchat.engine import verify
from termchat.progress import engine_start_line

CONTROL = "correct sampler, simulated, against itself"
DEFECTS = {
    CONTROL: ("temperature", 0.7),
    "temperature halved (0.35)": ("temperature", 0.35),
    "temperature doubled (1.4)": ("temperature", 1.4),
    "temperature zero (greedy)": ("temperature", 0.0),
    "5% garbage tokens": ("garbage", 0.05),
}
TOP_P = 0.95
TEMPERATURE = 0.7


def collect_pool(seeds: int) -> list[dict]:
    """Replies of the plain engine: prompt, sampled ranks, top-20 log-probabilities."""
    from termchat.engine.connect import open_engine
    from termchat.profiles import builtin_profiles

    engine = open_engine(builtin_profiles()["local"].without_speculation(), progress=engine_start_line(), attach=False)
    try:
        streams = engine.run(lambda: verify.sample(engine, verify.SAMPLED_PROMPTS, seeds, TEMPERATURE, TOP_P))
    finally:
        engine.stop()
    return [{"prompt": verify.SAMPLED_PROMPTS.index(s.messages[-1]["content"]), "logprobs": s.token_logprobs, "top": s.token_top} for s in streams]


def rank_probabilities(top: list[float], defect: tuple[str, float]) -> np.ndarray:
    """The chance of each rank (1-20, then beyond) for a sampler with `defect`
    at a position whose raw top log-probabilities are `top`.

    Beyond the top 20 only their total mass is known. Below temperature 1 it
    is taken as nothing, as the check does (verify.sampling_distribution);
    above 1, as tokens as probable as the 20th: the least a heated tail can
    weigh, so the power against a hotter sampler is if anything
    under-estimated."""
    kind, value = defect
    temperature = value if kind == "temperature" else TEMPERATURE
    if temperature > 1:
        # the tail as one last entry whose heated weight is tail * p20^(1/T - 1): the
        # log-probability that gives it that weight once divided by T
        tail = max(0.0, 1.0 - float(np.exp(top).sum()))
        heated = temperature * math.log(tail) + top[-1] * (1 - temperature) if tail > 0 else -math.inf
        return verify.sampling_distribution([*top, heated], temperature, TOP_P)
    q = np.append(verify.sampling_distribution(top, temperature, TOP_P), 0.0)
    if kind == "garbage":
        q = (1 - value) * q
        q[-1] += value
    return q


def real_row(reply: dict) -> tuple[list[float], int]:
    """A real reply's row for the rank test, and its improbable tokens."""
    return verify.tokens_row(reply["logprobs"], reply["top"], TEMPERATURE, TOP_P), sum(lp < verify.IMPROBABLE for lp in reply["logprobs"])


class Simulator:
    """Each reply's positions, as rank chances under each sampler, drawn at will
    into the rows the check compares (verify.reply_row)."""

    def __init__(self, pool: list[dict]):
        self.cumulative = {name: [np.cumsum([rank_probabilities(top, defect) for top in reply["top"]], axis=1) for reply in pool] for name, defect in DEFECTS.items()}
        self.tops = [reply["top"] for reply in pool]
        self.q_rows = [[verify.sampling_distribution(top, TEMPERATURE, TOP_P) for top in reply["top"]] for reply in pool]

    def row(self, name: str, reply: int, rng: np.random.Generator) -> tuple[list[float], int]:
        """A drawn reply's row, and its improbable tokens (a token beyond the
        top 20, garbage, counts as improbable: a random token of the
        vocabulary is, nearly always)."""
        cumulative = self.cumulative[name][reply]
        ranks = ((rng.random((len(cumulative), 1)) > cumulative[:, :-1]).sum(axis=1) + 1).tolist()
        tops = self.tops[reply]
        improbable = sum(r > len(top) or top[r - 1] < verify.IMPROBABLE for r, top in zip(ranks, tops))
        return verify.reply_row(ranks, verify.mid_pits(ranks, self.q_rows[reply])), improbable


def measure(pool: list[dict], simulator: Simulator, per_side: int, trials: int, seed: int = 0) -> dict[str, float]:
    """Share of comparisons that fail: real lossless pairs; a simulated correct
    sampler against itself; each simulated defect against the correct one."""
    rng = np.random.default_rng(seed)
    by_prompt: dict[int, list[int]] = {}
    for i, reply in enumerate(pool):
        by_prompt.setdefault(reply["prompt"], []).append(i)
    each = per_side // len(by_prompt)
    real = [real_row(reply) for reply in pool]
    alarms = {"real replies, lossless": 0, **{name: 0 for name in DEFECTS}}
    for trial in range(trials):
        spec, base = [], []
        for members in by_prompt.values():
            chosen = rng.choice(members, 2 * each, replace=False)
            spec += list(chosen[:each])
            base += list(chosen[each:])
        strata = [pool[i]["prompt"] for i in spec], [pool[i]["prompt"] for i in base]
        correct = [simulator.row(CONTROL, i, rng) for i in base]
        for name in alarms:
            if name in DEFECTS:
                a, b = [simulator.row(name, i, rng) for i in spec], correct
            else:
                a, b = [real[i] for i in spec], [real[i] for i in base]
            rows_a, rows_b = [row for row, _ in a], [row for row, _ in b]
            tail = verify.binomial_tail(sum(n for _, n in a), int(sum(row[-1] for row in rows_a)), sum(n for _, n in b), int(sum(row[-1] for row in rows_b)))
            alarms[name] += verify.lossless_test(rows_a, rows_b, *strata, seed=trial).p < verify.ALPHA or tail < verify.P_LIMIT
    return {name: count / trials for name, count in alarms.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m termchat.bench.lossless_power", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=48, help="replies per prompt in the pool (default 48)")
    parser.add_argument("--trials", type=int, default=1000, help="comparisons per row (default 1000)")
    parser.add_argument("--save", type=Path, help="write the pool here (JSON)")
    parser.add_argument("--load", type=Path, help="read the pool from here instead of running the engine")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        pool = json.loads(args.load.read_text()) if args.load else collect_pool(args.seeds)
    except (OSError, ValueError) as exc:
        parser.error(f"cannot read the pool {args.load}: {exc}")
    if args.save:
        args.save.write_text(json.dumps(pool))
    tokens = sum(len(r["logprobs"]) for r in pool)
    observed = np.sum([real_row(r)[0] for r in pool], axis=0)[: len(verify.RANK_BUCKETS)]
    print(f"pool: {len(pool)} replies of the plain engine, {tokens} tokens ({time.monotonic() - started:.0f} s); ranks 1 / 2 / 3-5 / 6-20 / >20: {' / '.join(f'{x / tokens:.1%}' for x in observed)}")
    print(f"check: rank buckets' G and the mean mid-PIT's shift, {verify.PERMUTATIONS} shuffles within prompts, fails at p < {verify.ALPHA:g}; {args.trials} comparisons per cell")
    sizes = (12, 16, 24)
    simulator = Simulator(pool)
    results = {n: measure(pool, simulator, n, args.trials, seed=n) for n in sizes}
    print(f"\n| | {' | '.join(f'{n} replies a side' for n in sizes)} |\n|---|{'---|' * len(sizes)}")
    for name in results[sizes[0]]:
        kind = "false alarms" if name in ("real replies, lossless", CONTROL) else "power"
        print(f"| {name} ({kind}) | {' | '.join(f'{results[n][name]:.3f}' for n in sizes)} |")
    print(f"\n({time.monotonic() - started:.0f} s in all)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
