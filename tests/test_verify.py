"""The statistics of `termchat doctor --verify`, on synthetic replies drawn
from known distributions (the engine runs are in test_speculation.py; the
power table on real replies is `python -m termchat.bench.lossless_power`)."""

from __future__ import annotations

import numpy as np
import pytest

from termchat.engine.client import ChatStream, Sampling
from termchat.engine.verify import ALPHA, Samples, compare, lossless_test, mid_pits, sampling_distribution

PROMPTS = ["copy this list", "rename these variables"]


def positions(rng: np.random.Generator, n: int) -> list[list[float]]:
    """n positions' raw top-20 log-probabilities: mostly confident, some open (as in real replies)."""
    out = []
    for _ in range(n):
        logits = rng.gumbel(size=200) * rng.choice([0.6, 1.5, 4.0], p=[0.3, 0.3, 0.4])
        logprobs = logits - np.log(np.exp(logits).sum())
        out.append(sorted(logprobs.tolist(), reverse=True)[:20])
    return out


def reply(rng: np.random.Generator, prompt: str, temperature: float = 0.7, garbage: float = 0.0, tokens: int = 60) -> ChatStream:
    """A reply whose tokens a sampler at `temperature` drew (the check assumes 0.7), with a share of garbage."""
    stream = ChatStream(None, [{"role": "user", "content": prompt}], Sampling(temperature=0.7, top_p=0.95))
    for top in positions(rng, tokens):
        q = sampling_distribution(top, temperature, 0.95)
        rank = 21 if rng.random() < garbage else int(rng.choice(len(q), p=q)) + 1
        stream.token_top.append(top)
        stream.token_logprobs.append(top[rank - 1] if rank <= 20 else -12.0)
    return stream


def samples(rng: np.random.Generator, per_prompt: int = 8, **defect) -> Samples:
    return Samples(["a", "b"], [reply(rng, p, **defect) for p in PROMPTS for _ in range(per_prompt)])


def sampled(spec: Samples, base: Samples) -> bool:
    return {c.name: c.passed for c in compare(spec, base)}["sampled at T=0.7"]


def test_the_mean_mid_pit_is_one_half_for_a_correct_sampler():
    rng = np.random.default_rng(3)
    pits = [u for s in samples(rng, 40).sampled for u in mid_pits(s.token_ranks(), [sampling_distribution(t, 0.7, 0.95) for t in s.token_top])]
    assert abs(np.mean(pits) - 0.5) < 0.01


@pytest.mark.parametrize("defect", [{"temperature": 0.35}, {"temperature": 1.4}, {"temperature": 0.0}, {"garbage": 0.05}])
def test_a_sharper_flatter_or_noisy_sampler_fails_and_a_correct_one_passes(defect):
    rng = np.random.default_rng(5)
    base = samples(rng)
    assert sampled(samples(rng), base) is True
    assert sampled(samples(rng, **defect), base) is False


def test_the_test_is_two_sided():
    """The defect a one-sided check missed: replies *more* probable than without speculation."""
    rng = np.random.default_rng(8)
    base, sharp = samples(rng), samples(rng, temperature=0.35)
    test = lossless_test(sharp.rows(), base.rows(), sharp.strata(), base.strata())
    assert test.shift < 0 and test.p < ALPHA
    assert np.mean(sharp.reply_means()) > np.mean(base.reply_means())  # the sampled tokens are more probable


def test_false_alarms_are_rare():
    """200 lossless comparisons of 16 replies a side: at most 2 alarms (ALPHA = 0.002 gives 0.4 on average)."""
    rng = np.random.default_rng(11)
    pool = samples(rng, 60)
    rows, strata = pool.rows(), pool.strata()
    by_prompt = {p: [i for i, s in enumerate(strata) if s == p] for p in PROMPTS}
    alarms = 0
    for trial in range(200):
        a, b = [], []
        for members in by_prompt.values():
            chosen = rng.choice(members, 16, replace=False)
            a += list(chosen[:8])
            b += list(chosen[8:])
        alarms += lossless_test([rows[i] for i in a], [rows[i] for i in b], [strata[i] for i in a], [strata[i] for i in b], permutations=1999, seed=trial).p < ALPHA
    assert alarms <= 2
