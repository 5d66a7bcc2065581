"""The statistics of `termchat doctor --verify`, on fixed numbers (the engine
runs are in test_speculation.py)."""

from __future__ import annotations

import random
from types import SimpleNamespace

from termchat.verify import Samples, compare, improbable_tail, welch_t


def replies(rng: random.Random, n: int, wild: int = 0, garbage: float = 0.0) -> list:
    """n replies of 50 tokens; `wild` of them mostly garbage; `garbage` = share of
    improbable tokens sprinkled everywhere."""
    out = []
    for i in range(n):
        lps = [-rng.expovariate(1.2) for _ in range(50)]
        if i < wild:
            lps = [-rng.uniform(3, 12) for _ in range(50)]
        lps = [rng.uniform(-14, -7) if rng.random() < garbage else x for x in lps]
        out.append(SimpleNamespace(token_logprobs=lps, stats=SimpleNamespace(draft_tokens=40, accepted_tokens=10, acceptance_rate=0.25, acceptance_histogram=[])))
    return out


def test_lossless_samples_pass_and_broken_ones_fail():
    rng = random.Random(7)
    base = Samples(["a", "b"], replies(rng, 12))
    same = Samples(["a", "b"], replies(rng, 12))
    checks = {c.name: c.passed for c in compare(same, base)}
    assert checks == {"greedy": True, "sampled at T=0.7": True, "drafts proposed": True}
    # what 0.32.0 did on one run: a few wild replies (t alone stays under the limit) and garbage tokens
    broken = Samples(["a", "b"], replies(rng, 12, wild=2, garbage=0.05))
    assert abs(welch_t(broken.reply_means(), base.reply_means())) < 4.5
    assert improbable_tail(broken.tokens(), base.tokens()) < 1e-6
    assert {c.name: c.passed for c in compare(broken, base)}["sampled at T=0.7"] is False
    assert {c.name: c.passed for c in compare(Samples(["a", "c"], replies(rng, 12)), base)}["greedy"] is False


def test_false_alarms_are_rare():
    """200 lossless comparisons of 12 replies each: no failure (the limits allow ~1 in 1,000)."""
    rng = random.Random(11)
    failures = 0
    for _ in range(200):
        a, b = Samples([], replies(rng, 12, garbage=0.002)), Samples([], replies(rng, 12, garbage=0.002))
        failures += abs(welch_t(a.reply_means(), b.reply_means())) > 4.5 or improbable_tail(a.tokens(), b.tokens()) < 1e-6
    assert failures == 0
