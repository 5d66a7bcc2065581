"""How the client reads an engine's stream: chunks of several tokens and a pause
between reads (the policy, and the reading loop over a scripted response: no engine;
the chunks' effect on a real engine is in test_speculation)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from termchat.engine import client
from termchat.engine.client import ChatStream, Sampling, chunk_tokens, sse_lines
from termchat.engine.endpoint import Engine
from termchat.engine.stats import Step
from termchat.profiles import builtin_profiles


def test_a_reply_comes_in_chunks_only_from_a_measured_engine_of_termchats_without_speculation():
    local = builtin_profiles()["local"]
    plain = Engine(local.without_speculation(), "http://127.0.0.1:1/v1", None, "m")
    assert chunk_tokens(plain) == 1  # its speed is not known yet
    for rate, tokens in ((10.0, 1), (39.0, 1), (40.0, 2), (100.0, 5), (250.0, 8), (5000.0, 8)):
        plain.decode_rate = rate
        assert chunk_tokens(plain) == tokens, rate  # what it decodes in 50 ms, at most 8
    speculative = Engine(local, "http://127.0.0.1:1/v1", None, "m", decode_rate=500.0)
    remote = Engine(replace(local.without_speculation(), endpoint="http://gpu:8000/v1"), "http://gpu:8000/v1", None, "m", decode_rate=500.0)
    assert chunk_tokens(speculative) == 1 and chunk_tokens(remote) == 1
    greedy = Sampling(temperature=0.0)
    assert ChatStream(plain, [], greedy).body()["stream_interval"] == 8
    assert "stream_interval" not in ChatStream(speculative, [], greedy).body()
    assert "stream_interval" not in ChatStream(remote, [], greedy).body()


class ScriptedResponse:
    """httpx.Response's aiter_bytes, scripted: each read's bytes, and a log of the reads."""

    def __init__(self, reads: list[bytes], log: list):
        self.reads, self.log = reads, log

    async def aiter_bytes(self):
        for data in self.reads:
            self.log.append(("read", data))
            yield data


def test_after_each_read_the_client_leaves_the_socket_for_the_pause_it_is_given(monkeypatch):
    log = []

    async def sleep(seconds):
        log.append(("pause", seconds))

    monkeypatch.setattr(client.asyncio, "sleep", sleep)
    pauses = iter([0.0, 0.04, 0.04])

    async def lines():
        return [line async for line in sse_lines(ScriptedResponse([b"data: a\n", b"data: b\ndata: c\n", b"data: d\n"], log), lambda: next(pauses))]

    assert asyncio.run(lines()) == ["data: a", "data: b", "data: c", "data: d"]
    # every line of a read is handed on before the pause, and no pause before the first token
    assert log == [("read", b"data: a\n"), ("read", b"data: b\ndata: c\n"), ("pause", 0.04), ("read", b"data: d\n"), ("pause", 0.04)]


def test_the_client_pauses_between_reads_only_on_its_own_engines_once_the_first_token_is_in():
    local = builtin_profiles()["local"]
    stream = ChatStream(Engine(local, "http://127.0.0.1:1/v1", None, "m"), [], Sampling(temperature=0.0))
    assert stream.read_pause() == 0.0  # the first token is read as soon as it comes
    stream.steps.append(Step("a", (1,), 0.0))
    assert stream.read_pause() == client.READ_PAUSE_S > 0
    remote = ChatStream(Engine(replace(local, endpoint="http://gpu:8000/v1"), "http://gpu:8000/v1", None, "m"), [], Sampling(temperature=0.0))
    remote.steps.append(Step("a", (1,), 0.0))
    assert remote.read_pause() == 0.0  # another machine's cores: read at once, its clock is the client's
