"""One reply's statistics, from the stream of engine steps.

vLLM streams one chunk per engine step; with `return_token_ids` each chunk
carries that step's tokens, so a step of n tokens accepted n - 1 drafts (the
last token of a step is the target's own). When the server was started with
`--per-request-spec-decode-metrics summary`, the last chunk carries exact
figures (`metrics.speculative_decoding`): those win, as do the per-reply
counts llama.cpp (`timings.draft_n`) and LM Studio (`stats`) send. A remote
vLLM without that flag gives its `/metrics` totals (server_counters.py).
Otherwise the figures are derived from step sizes. `acceptance_source` says
which: "server", "server total" (or its approximate form), "step sizes".

Decode tokens/s excludes prefill, as the article measures: output tokens after
the first, over the time after the first token.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from termchat.profiles.speculation import Speculation


@dataclass(frozen=True)
class Step:
    """One engine step as the client saw it."""

    text: str
    token_ids: tuple[int, ...]
    at: float  # time.monotonic() on arrival

    @property
    def drafts_accepted(self) -> int:
        return max(0, len(self.token_ids) - 1)


@dataclass
class ReplyStats:
    output_tokens: int = 0
    prompt_tokens: int | None = None
    ttft_s: float | None = None
    decode_tokens_per_s: float | None = None
    decode_s: float | None = None
    steps: int = 0
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    acceptance_per_position: list[float] = field(default_factory=list)
    accepted_tokens: int | None = None
    draft_tokens: int | None = None
    spec_steps: int | None = None  # verification steps that had drafts
    acceptance_histogram: list[int] = field(default_factory=list)  # [j] = steps accepting exactly j drafts
    acceptance_source: str = "none"  # "server" | server_counters.EXACT | server_counters.APPROXIMATE | "step sizes" | "none"
    temperature: float | None = None
    finish_reason: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> ReplyStats | None:
        """As stored by to_dict(); keys of older or newer versions are ignored."""
        if not data:
            return None
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    @property
    def tokens_per_step(self) -> float | None:
        """Output tokens per engine step: what speculation gains, whatever the method."""
        return self.output_tokens / self.steps if self.steps else None

    @property
    def context_tokens(self) -> int:
        """What the conversation now fills of the model's context."""
        return (self.prompt_tokens or 0) + self.output_tokens

    def short(self) -> str:
        """One line under a reply in the TUI."""
        parts = [f"{self.output_tokens} tokens"]
        if self.decode_tokens_per_s is not None:
            parts.append(f"{self.decode_tokens_per_s:.1f} tok/s")
        if self.ttft_s is not None:
            parts.append(f"TTFT {self.ttft_s:.2f} s")
        if self.acceptance_rate is not None:
            parts.append(f"acceptance {self.acceptance_rate:.0%}")
        if self.mean_acceptance_length is not None:
            parts.append(f"mean length {self.mean_acceptance_length:.2f}")
        return " · ".join(parts)

    def summary(self) -> str:
        """The full line `termchat ask` prints: short() plus where acceptance
        came from, per-position acceptance and the temperature."""
        parts = [self.short()]
        if self.acceptance_rate is not None:
            parts.append(f"acceptance from the {self.acceptance_source}")
        if self.acceptance_per_position:
            parts.append("per position " + " ".join(f"{p:.2f}" for p in self.acceptance_per_position))
        if self.temperature is not None:
            parts.append(f"T={self.temperature:g}")
        return " · ".join(parts)


def per_position_from_histogram(histogram: list[int]) -> list[float]:
    """histogram[j] = verification steps that accepted exactly j drafts.

    Position p (1-based) was accepted in every step that accepted >= p drafts."""
    steps = sum(histogram)
    if not steps:
        return []
    return [sum(histogram[p:]) / steps for p in range(1, len(histogram))]


def compute(
    steps: list[Step],
    started: float,
    k: int | None,
    server_metrics: dict | None = None,
    usage: dict | None = None,
    temperature: float | None = None,
    finish_reason: str | None = None,
) -> ReplyStats:
    """The statistics of one reply.

    k is the profile's num_speculative_tokens (None: no speculation)."""
    stats = ReplyStats(temperature=temperature, finish_reason=finish_reason)
    token_steps = [s for s in steps if s.token_ids]
    counted = sum(len(s.token_ids) for s in token_steps)
    stats.output_tokens = (usage or {}).get("completion_tokens") or counted
    stats.prompt_tokens = (usage or {}).get("prompt_tokens")
    stats.steps = len(token_steps)
    if token_steps:
        first, last = token_steps[0], token_steps[-1]
        stats.ttft_s = first.at - started
        after_first = counted - 1
        stats.decode_s = last.at - first.at
        if after_first > 0 and stats.decode_s > 0:
            stats.decode_tokens_per_s = after_first / stats.decode_s

    if server_metrics:
        stats.acceptance_source = server_metrics.get("source", "server")
        stats.acceptance_rate = server_metrics.get("draft_acceptance_rate")
        stats.mean_acceptance_length = server_metrics.get("mean_acceptance_length")
        stats.accepted_tokens = server_metrics.get("num_accepted_draft_tokens")
        stats.draft_tokens = server_metrics.get("num_draft_tokens")
        stats.spec_steps = server_metrics.get("num_spec_steps")
        stats.acceptance_histogram = list(server_metrics.get("acceptance_histogram") or [])
        stats.acceptance_per_position = per_position_from_histogram(stats.acceptance_histogram) or list(server_metrics.get("per_position") or [])
    elif k and len(token_steps) > 1:
        # Derived: every decode step after the first (prefill) is taken to have
        # proposed k drafts. For draft-model methods that is exact; for ngram,
        # steps without a match propose nothing, so the rate is a lower bound.
        decode = token_steps[1:]
        accepted = [min(k, s.drafts_accepted) for s in decode]
        stats.acceptance_source = "step sizes"
        stats.accepted_tokens = sum(accepted)
        stats.draft_tokens = k * len(decode)
        stats.acceptance_rate = stats.accepted_tokens / stats.draft_tokens
        stats.mean_acceptance_length = 1 + stats.accepted_tokens / len(decode)
        stats.spec_steps = len(decode)
        stats.acceptance_histogram = [accepted.count(j) for j in range(k + 1)]
        stats.acceptance_per_position = per_position_from_histogram(stats.acceptance_histogram)
    return stats


def from_steps(steps: list[Step], started: float, speculation: Speculation | None, temperature: float | None = None, finish_reason: str | None = None) -> ReplyStats:
    """Figures from step sizes alone: live while a reply streams, and for a
    cut or broken one (the server's exact figures come with the last chunk).

    Tokens per step are exact for every method; an acceptance rate needs the
    number of drafts proposed, which step sizes give only for fixed-k methods."""
    stats = compute(steps, started, speculation.k if speculation else None, temperature=temperature, finish_reason=finish_reason)
    if speculation is not None and speculation.adaptive:
        stats.acceptance_rate = None
    return stats
