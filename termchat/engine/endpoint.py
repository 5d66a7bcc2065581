"""What a client needs to reach an engine, wherever it runs.

`Engine` is the one interface the rest of termchat talks to (`base_url`,
`api_key`, `model_name`, `state`) and it owns the engine's one HTTP client:
its key, timeouts and the proxy decision live here and nowhere else. A
profile's `endpoint` is an Engine as it is (`remote_engine`); engines started
on this machine are `process.ManagedEngine`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

import httpx

from termchat import limits
from termchat.errors import UserError
from termchat.profiles import Profile, is_loopback
from termchat.sanitize import one_line

T = TypeVar("T")


class EngineError(UserError):
    """The engine failed to start, died, or cannot be reached."""


class EngineState(StrEnum):
    """Where an engine is in its life, as the status bar shows it."""

    NOT_STARTED = "not started"
    STARTING = "starting"
    READY = "ready"
    WAITING = "waiting"  # a request is out, no token yet
    STREAMING = "streaming"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"




@dataclass
class Engine:
    """A server that speaks the OpenAI API: remote, or started here."""

    profile: Profile
    base_url: str  # ends in /v1
    api_key: str | None
    model_name: str
    state: EngineState = EngineState.READY
    has_counters: bool | None = field(default=None, repr=False, compare=False)  # /metrics with draft counters (server_counters); None: not asked yet
    decode_rate: float | None = field(default=None, repr=False, compare=False)  # tok/s of its last reply (checked by stats.compute)
    _client: httpx.AsyncClient | None = field(default=None, init=False, repr=False, compare=False)
    _client_loop: asyncio.AbstractEventLoop | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def root_url(self) -> str:
        return self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def uses_proxy_settings(self) -> bool:
        """Loopback traffic never goes through a proxy (it would carry the prompt
        and the key off the machine, and a dead proxy would hang every request);
        a remote endpoint follows HTTP(S)_PROXY / NO_PROXY as users expect."""
        return not is_loopback(self.base_url)

    @property
    def client(self) -> httpx.AsyncClient:
        """This engine's HTTP client: its key, its timeouts, the one proxy decision.

        One per event loop: the client's connections belong to the loop that
        opened them, and the bench and `verify` run each engine call in a loop
        of its own (asyncio.run)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client.is_closed or self._client_loop is not loop:
            self._client = httpx.AsyncClient(headers=self.headers(), timeout=httpx.Timeout(10.0), trust_env=self.uses_proxy_settings)
            self._client_loop = loop
        return self._client

    async def close(self) -> None:
        if self._client is not None and self._client_loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = None

    async def health(self, timeout: float = 2.0) -> bool:
        """Does /health answer 200 now?"""
        try:
            return (await self.client.get(self.root_url + "/health", timeout=timeout)).status_code == 200
        except httpx.HTTPError:
            return False

    def run(self, work: Callable[[], Awaitable[T]]) -> T:
        """`work()` in an event loop of its own, for callers without one (the
        CLI, the bench, verify); the client it opened is closed with the loop."""

        async def once() -> T:
            try:
                return await work()
            finally:
                await self.close()

        return asyncio.run(once())

    def health_now(self, timeout: float = 2.0) -> bool:
        """health() for callers without an event loop (attaching to `termchat serve`)."""
        return self.run(lambda: self.health(timeout))

    async def json_body(self, method: str, url: str, limit: int, what: str, **kwargs):
        """A request's JSON answer, its body read to at most `limit` bytes and
        parsed within termchat's limits; httpx.HTTPStatusError for a status
        that is not 2xx, limits.Refused or ValueError for a body that is not."""
        async with self.client.stream(method, url, **kwargs) as response:
            body = await limits.read_body(response, limit, what)
            if response.status_code >= 300:
                raise httpx.HTTPStatusError(f"{what}: HTTP {response.status_code}", request=response.request, response=response)
        return limits.json_loads(body, what)

    async def first_model(self) -> str:
        """The served model, for a remote profile that names none."""
        try:
            data = await self.json_body("GET", self.base_url + "/models", limits.MODELS_BODY, "its list of models")
            model = data["data"][0]["id"]
            if not isinstance(model, str):
                raise TypeError("the model id is not a string")
            return model
        except (httpx.HTTPError, KeyError, IndexError, ValueError, TypeError) as exc:
            raise EngineError(f"could not ask {self.base_url} which model it serves: {one_line(str(exc), 200)}. Set `model` in the profile.") from None

    async def detokenize(self, ids: set[int]) -> dict[int, str]:
        """The text of single tokens, from the server's /detokenize."""
        found: dict[int, str] = {}
        for token in ids:
            try:
                data = await self.json_body("POST", self.root_url + "/detokenize", limits.MODELS_BODY, "a detokenized token", json={"model": self.model_name, "tokens": [token]})
            except (httpx.HTTPError, ValueError):
                break
            if isinstance(data, dict) and isinstance(data.get("prompt"), str):
                found[token] = data["prompt"]
        return found

    def alive(self) -> bool:
        return True

    def stop(self) -> None:
        """Remote and attached engines are not ours to stop."""

    def release(self) -> None:
        """This front-end is done with it (see ManagedEngine.release)."""
        self.stop()

    def describe_failure(self) -> str:
        return f"the engine at {self.base_url} did not answer"


def remote_engine(profile: Profile) -> Engine:
    """A profile's `endpoint`; the key only ever comes from its environment variable."""
    key = None
    if profile.api_key_env:
        key = os.environ.get(profile.api_key_env)
        if not key:
            raise EngineError(f"profile '{profile.name}' reads its API key from ${profile.api_key_env}, which is not set; export it and try again")
        if len(key) > 4096 or not all(33 <= ord(c) <= 126 for c in key):
            # an HTTP header carries printable ASCII only: a letter outside it or a line break is a pasting accident
            raise EngineError(f"${profile.api_key_env} holds {'a line break, a space or another control' if any(ord(c) < 33 or ord(c) == 127 for c in key) else 'a non-ASCII'} character (or is over 4 KiB); an API key is printable ASCII: export it again")
    base = profile.endpoint.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    # no model in the profile: ask the server for it on the first request
    return Engine(profile=profile, base_url=base, api_key=key, model_name=profile.model or "")
