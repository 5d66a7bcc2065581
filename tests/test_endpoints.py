"""Broken, silent and untrusted endpoints: one clear message, nothing lost, no
traceback, no proxy on loopback.

Broken streams come from `standin.StandIn`, a scripted stand-in (not vLLM):
the real engine cannot be made to send them. The proxy check runs against
the session's real engine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import asyncio
import json
import time

import pytest

from termchat import cli
from termchat.engine.endpoint import Engine
from termchat.profiles.advisor import plain_http_warning
from termchat.profiles import Profile, parse_config
from termchat.chat.store import Store
from termchat.ui.app import TermchatApp
from termchat.ui.widgets.message import MessageView

from .conftest import ROOT, TERMCHAT, wait_for
from .standin import MODEL, SEPARATED, StandIn


def config_for(tmp_path, url: str, extra: str = "") -> str:
    path = tmp_path / "standin.toml"
    path.write_text(f'[profiles.standin]\nendpoint = "{url}"\nfirst_token_timeout = 2\n{extra}')
    return str(path)


def last_reply():
    store = Store()
    return store.messages(store.latest().id)[-1]


def test_an_endpoint_profile_without_model_asks_the_server_which_model_it_serves(tmp_path, capsys):
    with StandIn("ok") as standin:
        code = cli.main(["ask", "--config", config_for(tmp_path, standin.url), "--profile", "standin", "hi"])
    out, err = capsys.readouterr()
    assert code == 0 and out.strip() == "Hello there.", err
    assert standin.requests[0]["model"] == MODEL


@pytest.mark.parametrize(
    "scenario, message",
    [
        ("not-json", "sent a line that is not JSON"),
        ("not-object", "where a JSON object was expected"),
        ("error-mid-stream", "reported an error mid-reply: out of memory [/]"),
        ("no-done", "closed the stream before the end of the reply"),
        ("silent", "no answer from the engine"),
    ],
)
def test_a_broken_stream_is_one_message_and_the_partial_reply_is_stored_as_interrupted(scenario, message, tmp_path, capsys):
    started = time.monotonic()
    with StandIn(scenario) as standin:
        code = cli.main(["ask", "--config", config_for(tmp_path, standin.url), "--profile", "standin", f"hi {scenario}"])
    out, err = capsys.readouterr()
    assert code == 2 and message in err, err
    assert "\x1b" not in err and "\x07" not in err and "Traceback" not in err
    assert time.monotonic() - started < 30  # the silent endpoint: first_token_timeout = 2 s, not 600
    reply = last_reply()
    assert reply.status == "interrupted" and reply.content == out.rstrip("\n"), (reply.status, reply.content, out)


def test_a_self_signed_certificate_is_refused_and_said_so(tmp_path, capsys):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    with StandIn("ok", tls=(str(cert), str(key))) as standin:
        code = cli.main(["ask", "--config", config_for(tmp_path, standin.url, 'model = "m"\n'), "--profile", "standin", "hi"])
    err = capsys.readouterr().err
    assert code == 2 and "could not verify the TLS certificate" in err and "mid-reply" not in err, err


async def test_the_tui_survives_a_malformed_stream(tmp_path):
    with StandIn("not-json") as standin:
        config, problems = parse_config(f'[profiles.standin]\nendpoint = "{standin.url}"\n', "standin.toml")
        assert not problems
        app = TermchatApp(config=config, profile="standin", resume=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.5)
            app.query_one("PromptArea").focus()
            await pilot.press("h", "i", "enter")
            status = app.query_one("StatusBar")
            await wait_for(pilot, lambda: [v for v in app.query(MessageView) if v.role == "assistant" and v.cut] and not status.info.live, timeout=20, what="the cut")
            view = [v for v in app.query(MessageView) if v.role == "assistant"][-1]
            assert view.cut and "not JSON" in str(view.query_one(".footer").render())
            assert app.is_running and app.query_one("StatusBar").info.engine == "ready"


def test_loopback_never_uses_a_proxy_and_remote_endpoints_follow_the_environment():
    local = Engine(Profile("p"), "http://127.0.0.1:8000/v1", None, "m")
    assert not local.uses_proxy_settings and not Engine(Profile("p"), "http://localhost:1/v1", None, "m").uses_proxy_settings
    assert not Engine(Profile("p"), "http://[::1]:1/v1", None, "m").uses_proxy_settings
    assert Engine(Profile("p"), "https://gpu-box.example:8000/v1", None, "m").uses_proxy_settings


def test_ask_reaches_the_local_engine_with_a_dead_proxy_in_the_environment(shared_engine):
    dead = "http://127.0.0.1:9"  # nothing listens there
    env = {**os.environ, "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "ALL_PROXY": dead, "http_proxy": dead, "https_proxy": dead, "NO_PROXY": "", "no_proxy": ""}
    result = subprocess.run([*TERMCHAT, "ask", "--temperature", "0", "--max-tokens", "8", "--no-save", "Say hi."], capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert result.returncode == 0 and result.stdout.strip(), result.stderr


def test_a_key_sent_in_clear_to_another_host_gets_a_warning():
    config, problems = parse_config('[profiles.far]\nendpoint = "http://gpu-box:8000/v1"\napi_key_env = "GPU_KEY"\n[profiles.near]\nendpoint = "http://127.0.0.1:8000/v1"\napi_key_env = "GPU_KEY"\n', "c.toml")
    assert not problems
    assert "plain http://" in plain_http_warning(config.get("far"))
    assert plain_http_warning(config.get("near")) is None


def test_a_call_from_outside_an_event_loop_closes_the_client_it_opened():
    """The bench and verify make hundreds of such calls: none may leave its client (and its sockets) behind."""
    from termchat.engine.client import Sampling, complete_sync

    with StandIn("ok") as standin:
        engine = Engine(Profile("standin"), standin.url, None, MODEL)
        clients = []

        async def work():
            clients.append(engine.client)
            return await engine.first_model()

        assert engine.run(work) == MODEL and engine.run(work) == MODEL
        assert complete_sync(engine, [{"role": "user", "content": "hi"}], Sampling(temperature=0.0, max_tokens=8)).text == "Hello there."
    assert clients[0] is not clients[1] and all(c.is_closed for c in clients)


def test_a_reply_with_unicode_line_separators_streams_whole():
    """SSE lines end at CR LF, LF or CR only. vLLM leaves U+2028, U+0085 and
    the like raw inside its JSON; a client that split lines as str.splitlines
    does broke a sampled reply in CI as "a line that is not JSON" (the
    separator was among the top log-probabilities). The stand-in sends them,
    in writes cut mid-character and between CR and LF."""
    from termchat.engine.client import Sampling, complete_sync

    with StandIn("separators") as standin:
        engine = Engine(Profile("standin"), standin.url, None, MODEL)
        reply = complete_sync(engine, [{"role": "user", "content": "hi"}], Sampling(temperature=0.0, max_tokens=8))
    assert reply.text == "".join(SEPARATED) and len(reply.steps) == 3


def test_sse_lines_split_at_cr_lf_lf_and_cr_wherever_the_bytes_are_cut():
    from termchat.engine.client import SSELines

    stream = "data: a\u2028b\u0085\r\n\r\ndata: c\x1c\rdata: d\n\ndata: é".encode()
    want = ["data: a\u2028b\u0085", "", "data: c\x1c", "data: d", "", "data: é"]
    for size in (1, 2, 3, len(stream)):
        lines = SSELines()
        got = [line for i in range(0, len(stream), size) for line in lines.feed(stream[i : i + size])] + lines.close()
        assert got == want, size


def test_a_server_that_sends_text_only_gets_live_figures_marked_as_estimates(tmp_path, capsys):
    """Not every OpenAI-compatible server sends token ids or usage: the reply
    still has a TTFT, a token count and a speed, each marked as an estimate."""
    with StandIn("text-only") as standin:
        code = cli.main(["ask", "--json", "--config", config_for(tmp_path, standin.url), "--profile", "standin", "hi"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert result["text"] == "Hello there."
    assert result["output_tokens"] == 4 and result["tokens_estimated"] is True
    assert result["ttft_s"] is not None and result["decode_tokens_per_s"] is not None
    with StandIn("text-only") as standin:
        assert cli.main(["ask", "--config", config_for(tmp_path, standin.url), "--profile", "standin", "hi"]) == 0
    assert "~4 tokens" in capsys.readouterr().err


def test_a_30_mb_line_ends_the_reply_with_one_message(tmp_path, capsys):
    with StandIn("long-line") as standin:
        code = cli.main(["ask", "--config", config_for(tmp_path, standin.url), "--profile", "standin", "hi"])
    out, err = capsys.readouterr()
    assert code == 2 and "a line of over 8 MB with no line end" in err, err[-400:]
    assert "Traceback" not in err and len(err) < 2000
    assert last_reply().status == "interrupted" and last_reply().content == "Hel"


def test_sse_lines_search_only_new_bytes_and_refuse_a_line_over_the_limit():
    from termchat.engine.client import LineTooLong, SSELines

    lines = SSELines(limit=1000)
    for _ in range(9):
        assert lines.feed(b"x" * 100) == []
    assert lines._size == 900 and len(lines._parts) == 9  # kept as pieces, not re-joined at every feed
    with pytest.raises(LineTooLong):
        lines.feed(b"x" * 200)
    lines = SSELines(limit=1000)
    assert lines.feed(b"a" * 999 + b"\n" + b"b" * 10) == ["a" * 999]
    assert lines.close() == ["b" * 10]


@pytest.mark.parametrize("how", ["argument", "stdin"])
def test_a_prompt_that_is_not_utf8_is_sent_with_replacement_and_a_notice(how, tmp_path):
    """`termchat ask $'caf\\xe9 ole'`, or the same piped under LC_ALL=C: one
    notice, the prompt sent and stored with U+FFFD, no traceback."""
    with StandIn("ok") as standin:
        cmd = [sys.executable, "-m", "termchat.cli", "ask", "--config", config_for(tmp_path, standin.url), "--profile", "standin"]
        env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0"}
        if how == "argument":
            result = subprocess.run([*cmd, b"caf\xe9 ole"], capture_output=True, env=env, timeout=120)
        else:
            result = subprocess.run(cmd, input=b"caf\xe9 ole\n", capture_output=True, env=env, timeout=120)
    err = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 0, err
    assert "Traceback" not in err and "was not valid UTF-8" in err
    assert standin.requests[0]["messages"][-1]["content"].strip() == "caf\ufffd ole"
    store = Store()
    assert store.messages(store.latest().id)[0].content.strip() == "caf\ufffd ole"


async def test_the_tui_the_repl_and_ask_start_a_reply_through_the_same_code(tmp_path, monkeypatch, capsys):
    """One way to start a reply (chat/reply.py): each front-end's reply is a
    Reply begun by ChatSession.begin_reply and streamed by Reply.stream."""
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from termchat.chat.reply import Reply
    from termchat.chat.session import ChatSession
    from termchat.repl import Repl

    from .conftest import wait_for
    from .test_tui_coding import command

    begun, streamed = [], []
    begin, stream = ChatSession.begin_reply, Reply.stream

    def counting_begin(self, prompt, choice):
        begun.append(prompt)
        return begin(self, prompt, choice)

    async def counting_stream(self, *args, **kwargs):
        streamed.append(self.request[-1]["content"])
        return await stream(self, *args, **kwargs)

    monkeypatch.setattr(ChatSession, "begin_reply", counting_begin)
    monkeypatch.setattr(Reply, "stream", counting_stream)
    with StandIn("ok") as standin:
        config_path = config_for(tmp_path, standin.url)
        assert await asyncio.to_thread(cli.main, ["ask", "--config", config_path, "--profile", "standin", "from ask"]) == 0
        config, _ = parse_config(f'[profiles.standin]\nendpoint = "{standin.url}"\n', "standin.toml")
        with create_pipe_input() as pipe:
            repl = Repl(config, "standin", input=pipe, output=DummyOutput(), write=lambda text: None, history_file=tmp_path / "h", color=False)
            assert await repl.send("from the repl")
        app = TermchatApp(config=config, profile="standin", resume=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.5)
            await command(pilot, "from the tui")
            await wait_for(pilot, lambda: len(standin.requests) == 3 and not app.query_one("StatusBar").info.live, timeout=20, what="the reply")
    assert begun == streamed == ["from ask", "from the repl", "from the tui"]
