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

A server's numbers are data: `checked_figures` and `checked_usage` read them
once, here, through termchat.numbers. A figure that cannot be right (NaN, a
string, a bool, a rate over 1, more accepted than drafted, a counter that went
down) makes the acceptance unknown, with the reason in `unknown`, and is
never shown as exact. A server that sends text only (no token ids, no usage:
llama-cpp-python, some proxies) still gets a TTFT and a token count, the
count estimated from its chunks and marked as such (`~`).

Decode tokens/s excludes prefill, as the article measures: output tokens after
the first, over the time after the first token. The engine's own clock where
it sends it (vLLM's `generation_time_ms`, termchat starts its engines with
`--enable-per-request-metrics`); else this client's, over the tokens that
arrived after the first chunk.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from termchat import numbers
from termchat.profiles.speculation import Speculation

MAX_POSITIONS = 64  # no method proposes more drafts a step; more is not a figure to show
MAX_DECODE_RATE = 1e5  # tokens/s: a server's decode time implying more is not believed


@dataclass(frozen=True)
class Step:
    """One engine step as the client saw it."""

    text: str
    token_ids: tuple[int, ...]
    at: float  # time.monotonic() on arrival

    @property
    def drafts_accepted(self) -> int:
        return max(0, len(self.token_ids) - 1)


# what a stored figure may be (from_dict): counts, and reals in a range
_COUNTS = ("output_tokens", "prompt_tokens", "steps", "accepted_tokens", "draft_tokens", "spec_steps")
_REALS = {"ttft_s": (0.0, 86400.0), "decode_tokens_per_s": (0.0, 1e6), "decode_s": (0.0, 86400.0), "acceptance_rate": (0.0, 1.0),
          "mean_acceptance_length": (1.0, MAX_POSITIONS + 1.0), "temperature": (0.0, 2.0)}


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
    unknown: str = ""  # why the server's acceptance figures were not usable ("" : they were, or none came)
    tokens_estimated: bool = False  # output_tokens counted from text chunks (no token ids, no usage)
    decode_source: str = "client"  # "server": decode_s is the engine's own first-to-last-token time

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> ReplyStats | None:
        """As stored by to_dict(); keys of older or newer versions are ignored,
        and a value that is not a figure of its kind (a string speed, NaN, 1e300,
        a bool count) reads as unknown, never as measured."""
        if not isinstance(data, dict) or not data:
            return None
        figures = {}
        for key, value in data.items():
            if key in _COUNTS:
                figures[key] = numbers.count(value)
            elif key in _REALS:
                figures[key] = numbers.real(value, *_REALS[key])
            elif key == "acceptance_per_position" and isinstance(value, list):
                figures[key] = [f for f in (numbers.fraction(v) for v in value[:MAX_POSITIONS]) if f is not None]
            elif key == "acceptance_histogram" and isinstance(value, list):
                figures[key] = [c for c in (numbers.count(v) for v in value[: MAX_POSITIONS + 1]) if c is not None]
            elif key in ("acceptance_source", "finish_reason", "unknown", "decode_source") and isinstance(value, str):
                figures[key] = value[:200]
            elif key == "tokens_estimated" and isinstance(value, bool):
                figures[key] = value
        defaults = {"output_tokens": 0, "steps": 0}
        return cls(**{k: (defaults[k] if v is None and k in defaults else v) for k, v in figures.items()})

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
        about = "~" if self.tokens_estimated else ""
        parts = [f"{about}{self.output_tokens} tokens"]
        if self.decode_tokens_per_s is not None:
            parts.append(f"{about}{self.decode_tokens_per_s:.1f} tok/s")
        if self.ttft_s is not None:
            parts.append(f"TTFT {self.ttft_s:.2f} s")
        if self.unknown:
            parts.append("acceptance ?")
        elif self.acceptance_rate is not None:
            parts.append(f"acceptance {self.acceptance_rate:.0%}")
        if self.mean_acceptance_length is not None:
            parts.append(f"mean length {self.mean_acceptance_length:.2f}")
        return " · ".join(parts)

    def summary(self) -> str:
        """The full line `termchat ask` prints: short() plus where acceptance
        came from, per-position acceptance and the temperature."""
        parts = [self.short()]
        if self.unknown:
            parts.append(f"acceptance unknown: {self.unknown}")
        elif self.acceptance_rate is not None:
            parts.append(f"acceptance from the {self.acceptance_source}")
        if self.tokens_estimated:
            parts.append("tokens estimated from the text chunks (the server sent no token counts)")
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


def checked_usage(usage: object) -> tuple[int | None, int | None]:
    """(completion_tokens, prompt_tokens) of an OpenAI `usage` object; None where not a count."""
    if not isinstance(usage, dict):
        return None, None
    return numbers.count(usage.get("completion_tokens")), numbers.count(usage.get("prompt_tokens"))


def checked_figures(raw: object) -> dict:
    """A server's speculation figures for one reply (vLLM's
    `metrics.speculative_decoding`, llama.cpp's and LM Studio's draft counts,
    or server_counters' deltas), checked: the same keys with trusted values,
    or `unknown` set to why they cannot be used."""
    if not isinstance(raw, dict):
        return {"unknown": f"the server sent {type(raw).__name__} where figures belong"}
    source = raw.get("source") if isinstance(raw.get("source"), str) else "server"
    if isinstance(raw.get("unknown"), str) and raw["unknown"]:
        return {"unknown": raw["unknown"], "source": source}
    bad = []

    def take(key, read):
        value = raw.get(key)
        if value is None:
            return None
        checked = read(value)
        if checked is None:
            bad.append(f"{key} = {str(value)[:40]!r}")
        return checked

    drafted = take("num_draft_tokens", numbers.count)
    accepted = take("num_accepted_draft_tokens", numbers.count)
    steps = take("num_spec_steps", numbers.count)
    rate = take("draft_acceptance_rate", numbers.fraction)
    length = take("mean_acceptance_length", lambda v: numbers.real(v, 1.0, 1.0 + MAX_POSITIONS))
    histogram = take("acceptance_histogram", lambda v: _counts(v, MAX_POSITIONS + 1))
    per_position = take("per_position", lambda v: _fractions(v, MAX_POSITIONS))
    if drafted is not None and accepted is not None and accepted > drafted:
        bad.append(f"{accepted} accepted of {drafted} drafted")
    if bad:
        return {"unknown": "the server's figures cannot be right (" + ", ".join(bad[:3]) + ")", "source": source}
    if rate is None and drafted and accepted is not None:
        rate = accepted / drafted
    return {
        "source": source, "draft_acceptance_rate": rate, "mean_acceptance_length": length, "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted, "num_spec_steps": steps, "acceptance_histogram": histogram or [], "per_position": per_position or [],
    }


def _counts(value: object, most: int) -> list[int] | None:
    if not isinstance(value, list) or len(value) > most:
        return None
    counts = [numbers.count(v) for v in value]
    return None if None in counts else counts


def _fractions(value: object, most: int) -> list[float] | None:
    if not isinstance(value, list) or len(value) > most:
        return None
    rates = [numbers.fraction(v) for v in value]
    return None if None in rates else rates


def compute(
    steps: list[Step],
    started: float,
    k: int | None,
    server_metrics: dict | None = None,
    usage: dict | None = None,
    temperature: float | None = None,
    finish_reason: str | None = None,
    generation_ms: object = None,
    chunk_tokens: int = 1,
) -> ReplyStats:
    """The statistics of one reply.

    k is the profile's num_speculative_tokens (None: no speculation).
    generation_ms is the server's own first-to-last-token time (vLLM's
    per-request `generation_time_ms`), as it came: checked here.
    chunk_tokens > 1: the reply was asked for in chunks of that many tokens
    (client.chunk_tokens, never with speculation), so each token was a step."""
    stats = ReplyStats(temperature=temperature, finish_reason=finish_reason)
    token_steps = [s for s in steps if s.token_ids]
    counted = sum(len(s.token_ids) for s in token_steps)
    completion, stats.prompt_tokens = checked_usage(usage)
    timed = token_steps or steps  # a server without token ids: its text chunks
    if completion is not None:
        stats.output_tokens = completion
    elif token_steps:
        stats.output_tokens = counted
    else:
        stats.output_tokens = len(steps)  # about one token a chunk: an estimate, and shown as one
        stats.tokens_estimated = bool(steps)
    stats.steps = counted if chunk_tokens > 1 and k is None else len(token_steps)
    if timed:
        first, last = timed[0], timed[-1]
        stats.ttft_s = first.at - started
        # only tokens that arrived after the first chunk were timed after it: a client (or API
        # server) that falls behind gets several steps merged into one chunk, and a first chunk
        # of 127 tokens must not count as decoded in the 10 ms before the last one arrived
        after_first = sum(len(s.token_ids) for s in token_steps[1:]) if token_steps else stats.output_tokens - 1
        stats.decode_s = last.at - first.at
        if after_first > 0 and stats.decode_s > 0:
            stats.decode_tokens_per_s = after_first / stats.decode_s
    served = numbers.real(generation_ms, 0.0, 86400e3)
    waited = (timed[-1].at - started) if timed else 0.0  # the server cannot have decoded for longer
    if (served is not None and 0 < served / 1000 <= waited + 1.0 and stats.output_tokens > 1 and not stats.tokens_estimated
            and (stats.output_tokens - 1) / (served / 1000) <= MAX_DECODE_RATE):
        # the engine's clock: right however late the chunks reached this client
        stats.decode_s = served / 1000
        stats.decode_tokens_per_s = (stats.output_tokens - 1) / stats.decode_s
        stats.decode_source = "server"
    # more tokens in one chunk than one step of this speculation gives: the stream merged steps,
    # so step sizes say nothing about steps or acceptance
    largest = max((len(s.token_ids) for s in token_steps), default=0)
    merged = k is not None and largest > k + 1
    if merged:
        stats.steps = 0

    if server_metrics:
        figures = checked_figures(server_metrics)
        stats.acceptance_source = figures.get("source", "server")
        stats.unknown = figures.get("unknown", "")
        if not stats.unknown:
            stats.acceptance_rate = figures["draft_acceptance_rate"]
            stats.mean_acceptance_length = figures["mean_acceptance_length"]
            stats.accepted_tokens = figures["num_accepted_draft_tokens"]
            stats.draft_tokens = figures["num_draft_tokens"]
            stats.spec_steps = figures["num_spec_steps"]
            stats.acceptance_histogram = figures["acceptance_histogram"]
            stats.acceptance_per_position = per_position_from_histogram(stats.acceptance_histogram) or figures["per_position"]
    elif merged:
        stats.unknown = f"the stream merged engine steps (a chunk of {largest} tokens; one step gives at most {k + 1})"
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


def from_steps(steps: list[Step], started: float, speculation: Speculation | None, temperature: float | None = None, finish_reason: str | None = None, chunk_tokens: int = 1) -> ReplyStats:
    """Figures from step sizes alone: live while a reply streams, and for a
    cut or broken one (the server's exact figures come with the last chunk).

    Tokens per step are exact for every method; an acceptance rate needs the
    number of drafts proposed, which step sizes give only for fixed-k methods."""
    stats = compute(steps, started, speculation.k if speculation else None, temperature=temperature, finish_reason=finish_reason, chunk_tokens=chunk_tokens)
    if speculation is not None and speculation.adaptive:
        stats.acceptance_rate = None
    return stats
