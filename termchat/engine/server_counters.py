"""Exact acceptance from a server that does not report it per reply.

A `vllm serve` started without `--per-request-spec-decode-metrics` (every
remote one termchat did not start) still counts drafts in its Prometheus
totals on `/metrics`: `vllm:spec_decode_num_drafts_total` (verification
steps), `..._num_draft_tokens_total`, `..._num_accepted_tokens_total` and
`..._num_accepted_tokens_per_pos_total{position="i"}`. Read before and after a
reply, their difference is that reply's acceptance, exactly, when the server
ran nothing else meanwhile. Whether it did is told by two other series:
`vllm:num_requests_running` before the request and after it (others
running) and `vllm:request_success_total` (more than one request finished).
The figures are then labelled approximate, never passed off as exact.

A server without these counters (llama.cpp, LM Studio, an older vLLM, a
proxy that hides `/metrics`) is asked once, then left alone.

The page is data: a sample that is not a finite, non-negative number
(Prometheus allows NaN and ±Inf), positions beyond any method's, and counters
that went down between the two reads (the server restarted) make that reply's
figures unknown, never exact and never a crash.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field

import httpx

from termchat import limits, numbers

SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
POSITION = re.compile(r'position="(\d+)"')
SERIES = {
    "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total", "vllm:request_success_total", "vllm:num_requests_running",
}
MAX_POSITIONS = 64  # as engine/stats.py
SETTLE_S = 1.0  # the server records a step's counters just after it sends the step's tokens

EXACT = "server total"
APPROXIMATE = "server total, approximate: other requests ran"


@dataclass
class Counters:
    drafts: float = 0.0  # verification steps that had drafts
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: dict[int, float] = field(default_factory=dict)
    finished: float = 0.0  # requests finished, every reason
    running: float = 0.0  # requests running now (a gauge)
    bad: str = ""  # why these counters cannot be used ("": they can)


def parse(text: str) -> Counters | None:
    """The counters in a Prometheus text page, summed over their labels (one
    per model and engine); None when it has no speculative decoding series."""
    counters, seen = Counters(), False
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if not match:
            continue
        name, labels = match["name"], match["labels"] or ""
        if name not in SERIES:
            continue
        value = numbers.parse_real(match["value"], 0.0, float(numbers.MAX_COUNT))
        if value is None:
            counters.bad = counters.bad or f"{name} = {match['value'][:20]!r} on the server's /metrics"
            continue
        if name == "vllm:spec_decode_num_drafts_total":
            counters.drafts += value
            seen = True
        elif name == "vllm:spec_decode_num_draft_tokens_total":
            counters.draft_tokens += value
        elif name == "vllm:spec_decode_num_accepted_tokens_total":
            counters.accepted += value
        elif name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            position = POSITION.search(labels)
            if position and int(position[1]) < MAX_POSITIONS:
                counters.per_position[int(position[1])] = counters.per_position.get(int(position[1]), 0.0) + value
            elif position:
                counters.bad = counters.bad or f"a draft position {position[1][:12]} on the server's /metrics (more than {MAX_POSITIONS})"
        elif name == "vllm:request_success_total":
            counters.finished += value
        elif name == "vllm:num_requests_running":
            counters.running += value
    return counters if seen else None


async def read(client: httpx.AsyncClient, root_url: str) -> Counters | None:
    try:
        async with client.stream("GET", root_url + "/metrics", timeout=3.0) as response:
            if response.status_code != 200:
                return None
            body = await limits.read_body(response, limits.METRICS_BODY, "/metrics")
    except (httpx.HTTPError, limits.Refused):  # an endless page is no figure
        return None
    return parse(body.decode("utf-8", "replace"))


def metrics(before: Counters, after: Counters) -> dict:
    """One reply's figures in the shape the server's per-request metrics have
    (stats.compute reads both), with their source; `unknown` says why there
    are none to trust."""
    if before.bad or after.bad:
        return {"unknown": before.bad or after.bad, "source": EXACT}
    deltas = [after.drafts - before.drafts, after.accepted - before.accepted, after.draft_tokens - before.draft_tokens, after.finished - before.finished]
    deltas += [after.per_position.get(i, 0.0) - before.per_position.get(i, 0.0) for i in set(after.per_position) | set(before.per_position)]
    if any(d < 0 for d in deltas):
        return {"unknown": "the server's counters went down during the reply (it restarted)", "source": EXACT}
    drafts = after.drafts - before.drafts
    accepted = after.accepted - before.accepted
    drafted = after.draft_tokens - before.draft_tokens
    per_position = [after.per_position.get(i, 0.0) - before.per_position.get(i, 0.0) for i in sorted(after.per_position)]
    # alone: nothing running before the request, nothing still running after it
    # (vLLM counts running requests after freeing the finished ones), one finished
    alone = before.running == 0 and after.running == 0 and after.finished - before.finished <= 1
    return {
        "num_spec_steps": int(drafts),
        "num_draft_tokens": int(drafted),
        "num_accepted_draft_tokens": int(accepted),
        "draft_acceptance_rate": accepted / drafted if drafted else None,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
        "per_position": [x / drafts for x in per_position] if drafts else [],
        "source": EXACT if alone else APPROXIMATE,
    }


class Watch:
    """The counters of one engine around one reply (ChatStream)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.before: Counters | None = None

    async def start(self) -> None:
        if self.engine.has_counters is False:
            return
        self.before = await read(self.engine.client, self.engine.root_url)
        self.engine.has_counters = self.before is not None

    async def result(self) -> dict | None:
        """The reply's figures, once the server has counted its last step."""
        if self.before is None:
            return None
        deadline = asyncio.get_running_loop().time() + SETTLE_S
        while True:
            after = await read(self.engine.client, self.engine.root_url)
            if after is None:
                return None
            if after.finished > self.before.finished or asyncio.get_running_loop().time() > deadline:
                return metrics(self.before, after)
            await asyncio.sleep(0.05)
