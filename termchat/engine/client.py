"""The one streaming client, for managed and remote servers alike.

`ChatStream` posts a streamed chat completion and yields one `Step` per chunk
(text delta, token ids, arrival time): one engine step each where step sizes
carry the figures (speculation), a few tokens each elsewhere (`chunk_tokens`).
When it is exhausted, `stats` holds the reply's statistics. Breaking out of
the loop (or cancelling the task) closes the connection, and vLLM aborts the
request.
"""

from __future__ import annotations

import asyncio
import codecs
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx

from termchat import limits, numbers
from termchat.engine import server_counters
from termchat.engine import stats as stats_mod
from termchat.engine.endpoint import Engine, EngineError
from termchat.engine.stats import ReplyStats, Step
from termchat.sanitize import one_line


class ReplyInterrupted(EngineError):
    """The connection broke mid-reply; `partial` holds what had arrived."""

    def __init__(self, message: str, partial: str):
        super().__init__(message)
        self.partial = partial


class LineTooLong(ValueError):
    """A server sent a line longer than SSELines.limit (no SSE event is that long)."""


# An engine of termchat's without speculation streams chunks of several tokens (vLLM's
# per-request `stream_interval`; the first token still comes alone). Each chunk wakes vLLM's
# API server and this client, and on a 2-core machine their work lands on an engine thread
# at the start of the next step: 0.8 ms of a 9.6 ms step, measured (bench README, "The
# stream's chunks"). A chunk holds what the engine decodes in CHUNK_S at its last measured
# speed, at most MAX_CHUNK_TOKENS, so text still arrives 20 times a second or more. One
# token a chunk with speculation (the live tokens per step and the draft tint read step
# sizes), before a first measured reply, and for remote servers (not all take the field).
CHUNK_S = 0.05
MAX_CHUNK_TOKENS = 8


def chunk_tokens(engine: Engine) -> int:
    """Tokens a streamed chunk holds for this engine's next reply (1: every step; also
    for a stand-in without a profile, as tests build)."""
    p = getattr(engine, "profile", None)
    rate = getattr(engine, "decode_rate", None)
    if p is None or p.is_remote or p.speculative is not None or not rate:
        return 1
    return max(1, min(MAX_CHUNK_TOKENS, int(rate * CHUNK_S)))


MAX_LINE = limits.LINE  # characters: a chunk of vLLM's is a few hundred, with 20 top log-probabilities a few thousand


class SSELines:
    """Server-sent-event lines from the bytes of a stream, split where the SSE
    spec ends a line (CR LF, LF or CR) and nowhere else.

    httpx's `iter_lines` splits like `str.splitlines`, also at U+2028, U+2029,
    U+0085 and \\x1c-\\x1e, which JSON leaves raw inside strings: a model that
    sampled U+2028 (or merely listed it among its top log-probabilities) cut a
    chunk in two, and the reply broke as "a line that is not JSON".

    Linear in the bytes received: only new text is searched for line ends,
    and an unfinished line is kept as pieces, joined once when it ends. A line
    over `limit` characters raises LineTooLong as soon as it is that long."""

    ENDS = re.compile("\r\n|\r|\n")

    def __init__(self, limit: int = MAX_LINE):
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._parts: list[str] = []  # the line not yet ended
        self._size = 0
        self._cr = False  # the last text ended in CR: perhaps the first half of a CR LF
        self.limit = limit

    def feed(self, data: bytes) -> list[str]:
        text = self._decoder.decode(data)
        if self._cr:
            text, self._cr = "\r" + text, False
        if text.endswith("\r"):
            text, self._cr = text[:-1], True
        *ended, rest = self.ENDS.split(text)
        lines = []
        if ended:
            lines = ["".join(self._parts) + ended[0], *ended[1:]]
            self._parts, self._size = [], 0
        if rest:
            self._parts.append(rest)
            self._size += len(rest)
        if self._size > self.limit or any(len(line) > self.limit for line in lines):
            raise LineTooLong(f"a line of over {self.limit // (1024 * 1024)} MB with no line end")
        return lines

    def close(self) -> list[str]:
        """The last line, if the stream ended without a line end."""
        line = "".join(self._parts) + self._decoder.decode(b"", final=True)
        self._parts, self._size, self._cr = [], 0, False
        return [line] if line else []


async def sse_lines(response: httpx.Response) -> AsyncIterator[str]:
    lines = SSELines()
    async for data in response.aiter_bytes():
        for line in lines.feed(data):
            yield line
    for line in lines.close():
        yield line


@dataclass
class Sampling:
    temperature: float
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False  # ask for each sampled token's log-probability (verify, tests)
    top_logprobs: int = 0  # and the N most probable tokens' at each position (verify's rank test)

    # the knobs sent only when set: the server's own default otherwise
    OPTIONAL = ("seed", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")


@dataclass
class ChatStream:
    engine: Engine
    messages: list[dict]
    sampling: Sampling
    text: str = ""
    steps: list[Step] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)  # with Sampling.logprobs
    # with Sampling.top_logprobs: at each position, the log-probabilities of the
    # N most probable tokens (the model's raw distribution: vLLM's logprobs_mode)
    token_top: list[list[float]] = field(default_factory=list)
    stats: ReplyStats | None = None
    started: float | None = None  # when the request was sent
    chunk_tokens: int = 0  # tokens a chunk holds (0: chosen from the engine, chunk_tokens())

    def __post_init__(self) -> None:
        self.chunk_tokens = self.chunk_tokens or chunk_tokens(self.engine)

    def live_stats(self, finish_reason: str | None = None) -> ReplyStats:
        """The figures of what has arrived so far, from step sizes: while the
        reply streams, and for a cut or broken one."""
        return stats_mod.from_steps(self.steps, self.started or time.monotonic(), self.engine.profile.speculative, self.sampling.temperature, finish_reason, self.chunk_tokens)

    def body(self) -> dict:
        body = {
            "model": self.engine.model_name,
            "messages": self.messages,
            "stream": True,
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            "max_tokens": self.sampling.max_tokens,
            "return_token_ids": True,
            "stream_options": {"include_usage": True},
        }
        if self.chunk_tokens > 1:
            body["stream_interval"] = self.chunk_tokens
        for name in Sampling.OPTIONAL:
            if getattr(self.sampling, name) is not None:
                body[name] = getattr(self.sampling, name)
        if self.sampling.stop:
            body["stop"] = list(self.sampling.stop)
        if self.sampling.logprobs or self.sampling.top_logprobs:
            body["logprobs"] = True
        if self.sampling.top_logprobs:
            body["top_logprobs"] = self.sampling.top_logprobs
        return body

    def token_ranks(self) -> list[int]:
        return token_ranks(self.token_logprobs, self.token_top)

    async def __aiter__(self) -> AsyncIterator[Step]:
        if not self.engine.model_name:
            self.engine.model_name = await self.engine.first_model()
        # a remote vLLM that does not report per reply: its /metrics totals around this reply
        watch = server_counters.Watch(self.engine) if self.engine.profile.is_remote else None
        if watch is not None:
            await watch.start()
        started = self.started = time.monotonic()
        server_metrics = usage = finish = generation_ms = None
        done = False
        # a silent endpoint: first_token_timeout until the first token (long
        # enough for a cold large engine), then STALL_S between two lines
        first_wait = self.engine.profile.first_token_timeout
        try:
            # the engine's one client, with this reply's timeouts
            async with self.engine.client.stream("POST", self.engine.base_url + "/chat/completions", json=self.body(), timeout=httpx.Timeout(first_wait, connect=10.0)) as response:
                if response.status_code != 200:
                    try:
                        detail = (await limits.read_body(response, limits.ERROR_BODY, "its error message")).decode("utf-8", "replace")
                    except limits.Refused as exc:
                        detail = str(exc)
                    raise EngineError(_http_message(response.status_code, detail, self.engine))
                lines = sse_lines(response)
                while True:
                    # measured from the request (then from the last token), not
                    # from the last line: comments and keep-alives (": ping")
                    # are not an answer, and must not keep a silent endpoint alive
                    wait = first_wait if not self.steps else STALL_S
                    since = started if not self.steps else self.steps[-1].at
                    try:
                        # asyncio.timeout, not wait_for: on Python 3.11, wait_for
                        # swallows a cancel that lands as a line arrives, and a
                        # fast reply then ignored Escape (found by the monkey)
                        async with asyncio.timeout(max(since + wait - time.monotonic(), 0.0)):
                            line = await anext(lines)
                    except StopAsyncIteration:
                        break
                    except TimeoutError:
                        raise ReplyInterrupted(_silent(self.engine, wait, bool(self.steps)), self.text) from None
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    chunk = _chunk(data, self.text)
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    metrics = (chunk.get("metrics") or {}).get("speculative_decoding") or reported_drafts(chunk)
                    if metrics:
                        server_metrics = metrics
                    if "generation_time_ms" in (chunk.get("metrics") or {}):  # vLLM's --enable-per-request-metrics
                        generation_ms = chunk["metrics"]["generation_time_ms"]
                    for choice in chunk.get("choices") or []:
                        delta = (choice.get("delta") or {}).get("content") or ""
                        delta = delta if isinstance(delta, str) else ""
                        ids = numbers.token_ids(choice.get("token_ids")) or ()  # a list of counts, never a string's letters
                        finish = choice.get("finish_reason") or finish
                        for entry in (choice.get("logprobs") or {}).get("content") or []:
                            value = numbers.real(entry["logprob"], high=0.0)
                            if value is None:
                                raise TypeError(f"a log-probability of {one_line(repr(entry['logprob']), 40)}")
                            self.token_logprobs.append(value)
                            if self.sampling.top_logprobs:
                                self.token_top.append(sorted((v for t in entry.get("top_logprobs") or () if (v := numbers.real(t["logprob"], high=0.0)) is not None), reverse=True))
                        if delta or ids:
                            step = Step(delta, ids, time.monotonic())
                            self.text += delta
                            self.steps.append(step)
                            yield step
        except httpx.TimeoutException as exc:
            if isinstance(exc, httpx.ConnectTimeout):
                raise ReplyInterrupted(_transport_message(exc, self.engine, bool(self.text)), self.text) from None
            raise ReplyInterrupted(_silent(self.engine, first_wait, bool(self.steps)), self.text) from None
        except (httpx.TransportError, httpx.StreamError) as exc:
            raise ReplyInterrupted(_transport_message(exc, self.engine, bool(self.text)), self.text) from None
        except LineTooLong as exc:
            raise ReplyInterrupted(f"the engine at {self.engine.base_url} sent {exc}, which is not a reply; the partial reply is kept", self.text) from None
        except (AttributeError, TypeError, KeyError) as exc:  # a JSON object of the wrong shape
            raise ReplyInterrupted(f"the engine at {self.engine.base_url} sent a reply of an unexpected shape ({type(exc).__name__}: {one_line(str(exc), 120)}); the partial reply is kept", self.text) from None
        if not done:
            raise ReplyInterrupted(f"the engine at {self.engine.base_url} closed the stream before the end of the reply; the partial reply is kept", self.text)
        if server_metrics is None and watch is not None:
            server_metrics = await watch.result()
        self.stats = stats_mod.compute(
            self.steps,
            started,
            self.engine.profile.num_speculative_tokens,
            server_metrics,
            usage,
            self.sampling.temperature,
            finish,
            generation_ms,
            self.chunk_tokens,
        )
        if self.stats.decode_tokens_per_s and self.stats.output_tokens >= RATE_TOKENS:
            self.engine.decode_rate = self.stats.decode_tokens_per_s


RATE_TOKENS = 8  # a reply this long or longer measures the engine's speed for chunk_tokens()
STALL_S = 120.0  # between two lines of a reply that has started


def token_ranks(logprobs: list[float], tops: list[list[float]]) -> list[int]:
    """The rank of each sampled token under the model's distribution (1: the
    most probable; N + 1: outside the N reported), from its log-probability
    and the top N's (top_logprobs)."""
    return [1 + sum(top > lp for top in row) for lp, row in zip(logprobs, tops)]


def reported_drafts(chunk: dict) -> dict | None:
    """A reply's own draft counts where other servers put them: llama.cpp's
    `timings` (draft_n, draft_n_accepted), LM Studio's `stats` (or `usage`:
    total_draft_tokens_count, accepted_draft_tokens_count). Checked by
    stats.checked_figures: a bool or a string there is not a count."""
    timings = chunk.get("timings")
    if isinstance(timings, dict) and timings.get("draft_n") not in (None, 0):
        drafted, accepted = timings["draft_n"], timings.get("draft_n_accepted")
    else:
        box = next((b for b in (chunk.get("stats"), chunk.get("usage")) if isinstance(b, dict) and b.get("total_draft_tokens_count") not in (None, 0)), None)
        if box is None:
            return None
        drafted, accepted = box["total_draft_tokens_count"], box.get("accepted_draft_tokens_count")
    return stats_mod.checked_figures({"num_draft_tokens": drafted, "num_accepted_draft_tokens": accepted if accepted is not None else "missing", "source": "server"})


def _chunk(data: str, partial: str) -> dict:
    """One SSE data payload as a chunk object; anything else ends the reply with one clear message."""
    try:
        chunk = limits.json_loads(data, "a line of the reply")
    except limits.Refused as exc:
        raise ReplyInterrupted(f"the engine sent {exc}; the partial reply is kept", partial) from None
    except ValueError:
        raise ReplyInterrupted(f"the engine sent a line that is not JSON: {one_line(data, 120)!r}; the partial reply is kept", partial) from None
    if not isinstance(chunk, dict):
        raise ReplyInterrupted(f"the engine sent {type(chunk).__name__} where a JSON object was expected: {one_line(data, 120)!r}; the partial reply is kept", partial)
    error = chunk.get("error") if "error" in chunk else chunk if chunk.get("object") == "error" else None
    if error is not None:
        message = error.get("message") if isinstance(error, dict) else error
        raise ReplyInterrupted(f"the engine reported an error mid-reply: {one_line(str(message), 300)}; the partial reply is kept", partial)
    return chunk


def _silent(engine: Engine, seconds: float, started: bool) -> str:
    what = "the next token" if started else "the first token"
    return f"no answer from the engine at {engine.base_url} for {seconds:.0f} s while waiting for {what}; it may be overloaded or stuck (the profile's first_token_timeout sets the first wait)"


def _transport_message(exc: Exception, engine: Engine, started: bool) -> str:
    """What happened on the wire, in words (a bad certificate is not a dead engine)."""
    text = str(exc)
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
        return f"could not verify the TLS certificate of {engine.base_url} ({one_line(text, 200)}). If the server uses a private certificate authority, point SSL_CERT_FILE at its certificate."
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)) or (isinstance(exc, httpx.ProxyError) and not started):
        return f"could not connect to the engine at {engine.base_url} ({type(exc).__name__}: {one_line(text, 200)}). {engine.describe_failure()}"
    return f"the engine stopped answering mid-reply ({type(exc).__name__}). {engine.describe_failure()}"


def _http_message(status: int, detail: str, engine: Engine) -> str:
    try:
        data = limits.json_loads(detail, "its error message")
        error = data.get("error")
        detail = (error.get("message") if isinstance(error, dict) else error) or data.get("message") or detail
    except (ValueError, AttributeError):
        pass
    if status == 401:
        return f"the engine at {engine.base_url} refused the API key (401); check ${engine.profile.api_key_env or 'the key'}"
    return f"the engine answered {status}: {one_line(str(detail), 400)}"


async def complete(engine: Engine, messages: list[dict], sampling: Sampling) -> ChatStream:
    """Run a whole reply and return the finished stream (text and stats)."""
    stream = ChatStream(engine, messages, sampling)
    async for _ in stream:
        pass
    return stream


def complete_sync(engine: Engine, messages: list[dict], sampling: Sampling) -> ChatStream:
    return engine.run(lambda: complete(engine, messages, sampling))
