"""Bench arithmetic and reports: medians, spreads, speed-ups, verdicts.

Pure functions on recorded samples, so they are tested on fixed numbers.

- decode tokens/s: output tokens after the first, over the time after the
  first (prefill excluded, as the article measures);
- speed-up: ratio of the medians (speculation / baseline), with the spread of
  per-prompt ratios (each prompt's median over its runs). The speculative
  side counts only each prompt's first run: a proposer that remembers earlier
  replies (suffix decoding) answers a repeated prompt far faster, which is
  reported apart as "repeat" (what Ctrl+R, regenerate, gets);
- acceptance: accepted / proposed drafts summed over all requests;
- ideal speed-up: (1 - a^(k+1)) / ((1 - a)(k*c + 1)), a = acceptance,
  k = speculative tokens, c = a draft step's cost relative to a target step;
- lossless: at T > 0, the checks of `termchat doctor --verify` on the bench's
  own replies: the two-sided test of the sampled tokens' ranks and mid-PITs
  (verify.lossless_test, shuffling within each prompt), the mean
  log-probability of the sampled tokens with and without speculation
  (Welch's t), and the share of improbable tokens (log-probability below -6;
  a one-sided binomial tail). A category where
  speculation changed what was sampled gets no speed-up: it would measure a
  defect, not speculation.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass

from termchat.profiles.advisor import ADAPTIVE_METHODS, band
from termchat.engine.stats import ReplyStats
from termchat.engine.verify import ALPHA, IMPROBABLE, P_LIMIT, T_LIMIT, binomial_tail, lossless_test, welch_t


@dataclass
class Sample:
    """One bench request: the reply's own statistics, and where it stands in the run."""

    prompt_id: str
    category: str
    speculative: bool
    stats: ReplyStats
    run: int = 0  # 0: the first time the engine saw this prompt; later runs may hit a proposer's cache
    mean_logprob: float | None = None  # of the sampled tokens, at T > 0
    improbable: int | None = None  # sampled tokens with a log-probability below verify.IMPROBABLE, at T > 0
    rank_row: list[float] | None = None  # verify.reply_row, at T > 0


MIN_REPLIES_FOR_LOSSLESS = 4


def lossless_t(spec: list[Sample], base: list[Sample]) -> float | None:
    """Welch's t of the sampled replies' mean log-probabilities (None: too few replies at T > 0)."""
    a = [s.mean_logprob for s in spec if s.mean_logprob is not None and s.stats.temperature]
    b = [s.mean_logprob for s in base if s.mean_logprob is not None and s.stats.temperature]
    if min(len(a), len(b)) < MIN_REPLIES_FOR_LOSSLESS:
        return None
    return welch_t(a, b)


def lossless_tail(spec: list[Sample], base: list[Sample]) -> float | None:
    """The chance of as many improbable tokens with speculation if it were lossless (None: none sampled)."""
    a = [s for s in spec if s.improbable is not None and s.stats.temperature]
    b = [s for s in base if s.improbable is not None and s.stats.temperature]
    if not a or not b:
        return None
    return binomial_tail(sum(s.improbable for s in a), sum(s.stats.output_tokens for s in a), sum(s.improbable for s in b), sum(s.stats.output_tokens for s in b))


def lossless_rank(spec: list[Sample], base: list[Sample]) -> float | None:
    """The two-sided test's p (verify.lossless_test; None: too few replies at T > 0)."""
    a = [s for s in spec if s.rank_row is not None and s.stats.temperature]
    b = [s for s in base if s.rank_row is not None and s.stats.temperature]
    if min(len(a), len(b)) < MIN_REPLIES_FOR_LOSSLESS:
        return None
    return lossless_test([s.rank_row for s in a], [s.rank_row for s in b], [s.prompt_id for s in a], [s.prompt_id for s in b]).p


def count_improbable(logprobs: list[float]) -> int:
    return sum(x < IMPROBABLE for x in logprobs)


def quantiles(values: list[float]) -> tuple[float, float, float]:
    """(25th, 50th, 75th) percentiles; for one or two values, min/median/max."""
    ordered = sorted(values)
    if len(ordered) < 3:
        return ordered[0], statistics.median(ordered), ordered[-1]
    q1, q2, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    return q1, q2, q3


def ideal_speedup(a: float, k: int, c: float) -> float:
    """Expected speed-up with per-token acceptance a, k drafts, draft cost c."""
    if a >= 1.0:
        expected = k + 1
    else:
        expected = (1 - a ** (k + 1)) / (1 - a)
    return expected / (k * c + 1)


def verdict(acceptance: float | None, speedup: float | None, method: str | None = None, tokens_per_step: float | None = None, step_cost: float | None = None) -> str:
    """The rule of thumb that fits the method (advisor.band), checked against the measurement."""
    level, words = band(method, acceptance, tokens_per_step, step_cost)
    if speedup is None or level is None:
        return words
    predicts = "slowdown" if level == "low" else "gain"
    measured = "gain" if speedup > 1.0 else "slowdown"
    return f"{words}; measured {speedup:.2f}x {'agrees' if measured == predicts else 'does NOT agree'}"


def step_cost(spec: list[Sample], base: list[Sample]) -> float | None:
    """Time of one speculative engine step over one plain decode step (whatever
    the method, a step verifies its drafts in one forward pass)."""

    def per_step(samples: list[Sample]) -> float | None:
        timed = [s for s in samples if s.stats.steps and s.stats.steps > 1 and s.stats.decode_tokens_per_s]
        seconds = sum((s.stats.output_tokens - 1) / s.stats.decode_tokens_per_s for s in timed)
        steps = sum(s.stats.steps - 1 for s in timed)
        return seconds / steps if steps else None

    a, b = per_step(spec), per_step(base)
    return a / b if a and b else None


@dataclass
class CategoryResult:
    category: str
    spec_tps: tuple[float, float, float]
    base_tps: tuple[float, float, float]
    speedup: float
    speedup_spread: tuple[float, float, float]
    acceptance: float | None
    mean_acceptance_length: float | None
    per_position: list[float]
    ideal: float | None
    efficiency: float | None  # measured / ideal
    verdict: str
    samples: int
    lossless_t: float | None = None  # None: no sampled (T > 0) replies to check
    lossless_p: float | None = None  # the improbable tokens' tail; None: not measured
    lossless_rank_p: float | None = None  # the two-sided rank / mid-PIT test; None: not measured
    repeat_speedup: float | None = None  # the same prompts asked again (runs after the first)
    tokens_per_step: float | None = None  # output tokens per engine step with speculation
    step_cost: float | None = None  # a speculative step's time over a plain step's

    @property
    def lossless(self) -> bool:
        return (self.lossless_t is None or abs(self.lossless_t) <= T_LIMIT) and (self.lossless_p is None or self.lossless_p >= P_LIMIT) and (self.lossless_rank_p is None or self.lossless_rank_p >= ALPHA)

    def to_dict(self) -> dict:
        return asdict(self) | {"lossless": self.lossless}


def summarize(samples: list[Sample], k: int | None, draft_cost: float, method: str | None = None) -> list[CategoryResult]:
    by_category: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        by_category[sample.category].append(sample)
    results = []
    for category, items in by_category.items():
        every = [s for s in items if s.speculative]
        base = [s for s in items if not s.speculative]
        spec = [s for s in every if s.run == 0] or every
        repeats = [s for s in every if s.run > 0]
        if not spec or not base:
            continue
        spec_tps = quantiles([s.stats.decode_tokens_per_s for s in spec])
        base_tps = quantiles([s.stats.decode_tokens_per_s for s in base])
        speedup = spec_tps[1] / base_tps[1]
        repeat = statistics.median(s.stats.decode_tokens_per_s for s in repeats) / base_tps[1] if repeats else None
        ratios = []
        for prompt_id in sorted({s.prompt_id for s in spec}):
            a = [s.stats.decode_tokens_per_s for s in spec if s.prompt_id == prompt_id]
            b = [s.stats.decode_tokens_per_s for s in base if s.prompt_id == prompt_id]
            if a and b:
                ratios.append(statistics.median(a) / statistics.median(b))
        accepted = sum(s.stats.accepted_tokens or 0 for s in spec)
        drafted = sum(s.stats.draft_tokens or 0 for s in spec)
        steps = sum(s.stats.spec_steps or 0 for s in spec)
        acceptance = accepted / drafted if drafted else None
        mean_length = 1 + accepted / steps if steps else None
        width = max((len(s.stats.acceptance_histogram) for s in spec), default=0)
        histogram = [sum(s.stats.acceptance_histogram[j] for s in spec if j < len(s.stats.acceptance_histogram)) for j in range(width)]
        total = sum(histogram)
        per_position = [sum(histogram[p:]) / total for p in range(1, width)] if total else []
        stepped = [s for s in spec if s.stats.steps]
        per_step = sum(s.stats.output_tokens for s in stepped) / sum(s.stats.steps for s in stepped) if stepped else None
        cost = step_cost(spec, base)
        if method in ADAPTIVE_METHODS:
            # drafts vary in number from step to step: free verification would give tokens-per-step
            ideal = per_step
        else:
            ideal = ideal_speedup(acceptance, k, draft_cost) if acceptance is not None and k else None
        t, p, rank_p = lossless_t(spec, base), lossless_tail(spec, base), lossless_rank(spec, base)
        judged = verdict(acceptance, speedup, method, per_step, cost)
        if (t is not None and abs(t) > T_LIMIT) or (p is not None and p < P_LIMIT) or (rank_p is not None and rank_p < ALPHA):
            if t is not None and abs(t) > T_LIMIT:
                why = f"t = {t:.1f}"
            elif p is not None and p < P_LIMIT:
                why = f"improbable tokens, chance {p:.1g}"
            else:
                why = f"ranks of the sampled tokens, chance {rank_p:.1g}"
            judged = f"NOT LOSSLESS: speculation changed what was sampled at T > 0 ({why}); no speed-up to report, run `termchat doctor --verify`"
        results.append(
            CategoryResult(
                category=category,
                spec_tps=spec_tps,
                base_tps=base_tps,
                speedup=speedup,
                speedup_spread=quantiles(ratios) if ratios else (speedup, speedup, speedup),
                acceptance=acceptance,
                mean_acceptance_length=mean_length,
                per_position=per_position,
                ideal=ideal,
                efficiency=speedup / ideal if ideal else None,
                verdict=judged,
                samples=len(spec),
                lossless_t=t,
                lossless_p=p,
                lossless_rank_p=rank_p,
                repeat_speedup=repeat,
                tokens_per_step=per_step,
                step_cost=cost,
            )
        )
    return results


def _cells(rows: list[tuple[str, CategoryResult]], label: str) -> list[list[str]]:
    head = ([label] if label else []) + ["category", "spec tok/s", "base tok/s", "speed-up", "per-prompt", "repeat", "accept", "len", "ideal (reached)", "verdict"]
    lines = [head]
    for value, r in rows:
        acc = f"{r.acceptance:.2f}" if r.acceptance is not None else "-"
        length = f"{r.mean_acceptance_length:.2f}" if r.mean_acceptance_length is not None else "-"
        ideal = f"{r.ideal:.2f}x ({r.efficiency:.0%})" if r.ideal and r.lossless else "-"
        lines.append(
            ([value] if label else [])
            + [
                r.category,
                f"{r.spec_tps[1]:.1f} [{r.spec_tps[0]:.1f}-{r.spec_tps[2]:.1f}]",
                f"{r.base_tps[1]:.1f} [{r.base_tps[0]:.1f}-{r.base_tps[2]:.1f}]",
                f"{r.speedup:.2f}x" if r.lossless else "-",
                f"{r.speedup_spread[0]:.2f}-{r.speedup_spread[2]:.2f}" if r.lossless else "-",
                f"{r.repeat_speedup:.2f}x" if r.repeat_speedup is not None and r.lossless else "-",
                acc,
                length,
                ideal,
                r.verdict,
            ]
        )
    return lines


def table(rows: list[tuple[str, CategoryResult]], label: str = "") -> str:
    """A plain-text table; rows are (sweep value or '', result).

    tok/s cells are median [25th-75th percentile]; per-prompt is the
    25th-75th percentile of per-prompt speed-ups."""
    lines = _cells(rows, label)
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines)


def markdown_table(rows: list[tuple[str, CategoryResult]], label: str = "") -> str:
    lines = _cells(rows, label)
    out = ["| " + " | ".join(lines[0]) + " |", "|" + "---|" * len(lines[0])]
    out += ["| " + " | ".join(line) + " |" for line in lines[1:]]
    return "\n".join(out)


def bar_chart(rows: list[tuple[str, CategoryResult]], width: int = 40) -> str:
    """Speed-up per category as horizontal bars, with the 1.0x line marked."""
    if not rows:
        return ""
    top = max(max((r.speedup for _, r in rows if r.lossless), default=1.0), 1.0) * 1.1
    one = round(width / top)
    lines = []
    for value, r in rows:
        name = f"{r.category}{' ' + value if value else ''}"
        if not r.lossless:
            lines.append(f"{name:>22} {'NOT LOSSLESS: no speed-up reported':<{width}}")
            continue
        filled = round(r.speedup / top * width)
        bar = ("█" * filled).ljust(width)
        bar = bar[:one] + ("┃" if filled <= one else bar[one]) + bar[one + 1 :] if one < width else bar
        lines.append(f"{name:>22} {bar} {r.speedup:.2f}x")
    lines.append(" " * 23 + " " * one + "└ 1.0x (no gain)")
    return "\n".join(lines)


def lossless_line(rows: list[tuple[str, CategoryResult]]) -> str:
    """One line on whether speculation kept sampling intact, per row with replies at T > 0."""
    checked = [(value, r) for value, r in rows if r.lossless_t is not None or r.lossless_p is not None or r.lossless_rank_p is not None]
    if not checked:
        return ""

    def cell(value: str, r: CategoryResult) -> str:
        t = f" t={r.lossless_t:.1f}" if r.lossless_t is not None else ""
        p = f" p={r.lossless_p:.2g}" if r.lossless_p is not None else ""
        rank = f" ranks p={r.lossless_rank_p:.2g}" if r.lossless_rank_p is not None else ""
        return f"{r.category}{' ' + value if value else ''}{t}{p}{rank}"

    cells = ", ".join(cell(value, r) for value, r in checked)
    broken = [r.category for _, r in checked if not r.lossless]
    head = (
        "lossless at T > 0 (sampled tokens with vs without speculation: mean log-probability, Welch's t, "
        f"|t| <= {T_LIMIT:g}; tokens below {IMPROBABLE:g}, chance p >= {P_LIMIT:g}; ranks and mid-PITs, chance p >= {ALPHA:g}): "
    )
    if broken:
        return head + cells + f"\nWARNING: speculation changed what was sampled in {', '.join(broken)}; those speed-ups are not reported. `termchat doctor --verify --profile NAME` checks the engine."
    return head + cells + ": all pass"
