"""The one streaming client, for managed and remote servers alike.

`ChatStream` posts a streamed chat completion and yields one `Step` per engine
step (text delta, token ids, arrival time); when it is exhausted, `stats`
holds the reply's statistics. Breaking out of the loop (or cancelling the
task) closes the connection, and vLLM aborts the request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx

from termchat.engine import stats as stats_mod
from termchat.engine.server import Engine, EngineError
from termchat.engine.stats import ReplyStats, Step


class ReplyInterrupted(EngineError):
    """The connection broke mid-reply; `partial` holds what had arrived."""

    def __init__(self, message: str, partial: str):
        super().__init__(message)
        self.partial = partial


@dataclass
class Sampling:
    temperature: float
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int | None = None
    top_k: int | None = None
    logprobs: bool = False  # ask for each sampled token's log-probability (verify, tests)


@dataclass
class ChatStream:
    engine: Engine
    messages: list[dict]
    sampling: Sampling
    text: str = ""
    steps: list[Step] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)  # with Sampling.logprobs
    stats: ReplyStats | None = None
    timeout: float = 600.0

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
        if self.sampling.seed is not None:
            body["seed"] = self.sampling.seed
        if self.sampling.top_k is not None:
            body["top_k"] = self.sampling.top_k
        if self.sampling.logprobs:
            body["logprobs"] = True
        return body

    async def __aiter__(self) -> AsyncIterator[Step]:
        if not self.engine.model_name:
            self.engine.model_name = await _first_model(self.engine)
        started = time.monotonic()
        server_metrics = usage = finish = None
        timeout = httpx.Timeout(self.timeout, connect=10.0)
        try:
            async with httpx.AsyncClient(timeout=timeout) as client:
                async with client.stream("POST", self.engine.base_url + "/chat/completions", json=self.body(), headers=self.engine.headers()) as response:
                    if response.status_code != 200:
                        detail = (await response.aread()).decode("utf-8", "replace")
                        raise EngineError(_http_message(response.status_code, detail, self.engine))
                    async for line in response.aiter_lines():
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            break
                        chunk = json.loads(data)
                        if chunk.get("usage"):
                            usage = chunk["usage"]
                        metrics = (chunk.get("metrics") or {}).get("speculative_decoding")
                        if metrics:
                            server_metrics = metrics
                        for choice in chunk.get("choices") or []:
                            delta = (choice.get("delta") or {}).get("content") or ""
                            ids = tuple(choice.get("token_ids") or ())
                            finish = choice.get("finish_reason") or finish
                            for entry in (choice.get("logprobs") or {}).get("content") or []:
                                self.token_logprobs.append(entry["logprob"])
                            if delta or ids:
                                step = Step(delta, ids, time.monotonic())
                                self.text += delta
                                self.steps.append(step)
                                yield step
        except (httpx.TransportError, httpx.StreamError) as exc:
            raise ReplyInterrupted(f"the engine stopped answering mid-reply ({type(exc).__name__}). {self.engine.describe_failure()}", self.text) from None
        self.stats = stats_mod.compute(
            self.steps,
            started,
            self.engine.profile.num_speculative_tokens,
            server_metrics,
            usage,
            self.sampling.temperature,
            finish,
        )


def _http_message(status: int, detail: str, engine: Engine) -> str:
    try:
        detail = json.loads(detail).get("error", {}).get("message") or json.loads(detail).get("message") or detail
    except (ValueError, AttributeError):
        pass
    if status == 401:
        return f"the engine at {engine.base_url} refused the API key (401); check ${engine.profile.api_key_env or 'the key'}"
    return f"the engine answered {status}: {str(detail)[:400]}"


async def _first_model(engine: Engine) -> str:
    async with httpx.AsyncClient(timeout=10.0) as client:
        try:
            response = await client.get(engine.base_url + "/models", headers=engine.headers())
            response.raise_for_status()
            return response.json()["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            raise EngineError(f"could not list the models at {engine.base_url}: {exc}") from None


async def complete(engine: Engine, messages: list[dict], sampling: Sampling) -> ChatStream:
    """Run a whole reply and return the finished stream (text and stats)."""
    stream = ChatStream(engine, messages, sampling)
    async for _ in stream:
        pass
    return stream


def complete_sync(engine: Engine, messages: list[dict], sampling: Sampling) -> ChatStream:
    return asyncio.run(complete(engine, messages, sampling))
