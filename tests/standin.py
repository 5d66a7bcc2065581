"""Scripted stand-ins for an OpenAI-compatible endpoint (NOT vLLM).

Only for what the real engine cannot be made to do on demand:
- `StandIn`: send a broken stream, an error mid-reply, close early, never
  answer, or present a self-signed certificate. It serves `/v1/models` and
  streams the scripted lines of one scenario for every `/v1/chat/completions`.
- `SlowEndpoint`: the keyboard monkey's engine (tests/monkey.py), which streams
  short replies a few milliseconds a step, at any moment, and records every
  request.
- `server_lookalike`: a sleeping process whose command line names vLLM's
  server module, which is all the engine registry checks of a process.
"""

from __future__ import annotations

import contextlib
import json
import random
import sys
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "stand-in-model"


def chunk(text: str) -> str:
    return "data: " + json.dumps({"choices": [{"delta": {"content": text}, "token_ids": [1]}]}) + "\n\n"


def raw_chunk(text: str, end: str = "\n\n") -> bytes:
    """A chunk as vLLM writes it: JSON leaves U+2028, U+0085 and the like raw."""
    return ("data: " + json.dumps({"choices": [{"delta": {"content": text}, "token_ids": [1]}]}, ensure_ascii=False) + end).encode()


# text that str.splitlines would cut, sent in writes that end mid-character
# and between the CR and the LF of a line end
SEPARATED = ["a\u2028b", "\u2029c\x85", "d\x1ce\x0bf"]
_second = raw_chunk(SEPARATED[1], "\r\n\r\n")
_cut = _second.index("\u2029".encode()) + 1
_cr = _second.index(b"\r")


def text_chunk(text: str) -> str:
    """A chunk as servers that are not vLLM send it: text only, no token ids, no usage
    (llama-cpp-python's server, for one)."""
    return "data: " + json.dumps({"choices": [{"delta": {"content": text}, "finish_reason": None}]}) + "\n\n"


SCENARIOS = {
    "ok": [chunk("Hello"), chunk(" there."), "data: [DONE]\n\n"],
    "not-json": [chunk("Hel"), "data: {this is not json\n\n"],
    "not-object": [chunk("Hel"), "data: [1, 2, 3]\n\n"],
    "error-mid-stream": [chunk("Hel"), "data: " + json.dumps({"error": {"message": "\x1b]52;c;cm0gLXJm\x07out of memory [/]"}}) + "\n\n"],
    "no-done": [chunk("Hel"), chunk("lo")],
    "silent": None,  # accepts the request and never answers
    "pings": [": ping\n\n"] * 250,  # SSE comments only, for 5 s: alive, but no answer
    "loop": [chunk("Two good lines of a poem about the sea.\n")] + [chunk("Aeon, aeon, aeon of moon, ")] * 200 + ["data: [DONE]\n\n"],
    "text-only": [text_chunk("Hel"), text_chunk("lo"), text_chunk(" there"), text_chunk("."), "data: [DONE]\n\n"],
    "long-line": [chunk("Hel"), b"data: " + b"x" * (30 * 1024 * 1024)],  # 30 MB and no line end
    "separators": [raw_chunk(SEPARATED[0]), _second[:_cut], _second[_cut : _cr + 1], _second[_cr + 1 :], raw_chunk(SEPARATED[2]), b"data: [DONE]\r\r"],
}


class QuietServer(ThreadingHTTPServer):
    """A client that hangs up mid-answer (a reply cut, an app quitting) is the
    point of the monkey, not an error to print."""

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class StandIn:
    def __init__(self, scenario: str, tls: tuple[str, str] | None = None):
        self.scenario = scenario
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                body = json.dumps({"data": [{"id": MODEL}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                outer.requests.append(json.loads(self.rfile.read(length) or b"{}"))
                lines = SCENARIOS[outer.scenario]
                if lines is None:
                    while not outer.stopped.wait(0.2):
                        pass
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for line in lines:
                    self.wfile.write(line if isinstance(line, bytes) else line.encode())
                    self.wfile.flush()
                    time.sleep(0.02)
                self.close_connection = True

        self.stopped = threading.Event()
        self.server = QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        scheme = "http"
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.server.shutdown()
        self.server.server_close()


WORDS = "the a reply streams here while keys land now and then on it so".split()


class SlowEndpoint:
    """A scripted stand-in for an OpenAI-compatible server (NOT vLLM).

    Every chat completion streams `min_steps` to `max_steps` steps of 1-3 tokens, `step_s`
    apart, sometimes with a Python code block (for the code-block keys), or
    as `script` says. It keeps each request's messages, to check their order
    afterwards."""

    def __init__(self, seed: int = 0, step_s: float = 0.01, max_steps: int = 60, min_steps: int = 3, script: list[int] | None = None):
        self.requests: list[list[dict]] = []  # the messages of each chat completion
        self.other: list[str] = []  # any other POST (none expected)
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._send(200, json.dumps({"data": [{"id": MODEL}]}).encode())

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length)
                if len(body) < length:  # the client cut the request while sending it: no request
                    self.close_connection = True
                    return
                request = json.loads(body or b"{}")
                if self.path.endswith("/detokenize"):  # the draft tint (F8) asks for token texts
                    self._send(200, json.dumps({"prompt": f"<{request.get('tokens')}>"}).encode())
                    return
                if not self.path.endswith("/chat/completions"):
                    outer.other.append(self.path)
                    self._send(404, b'{"error": "not served by the stand-in"}')
                    return
                with outer.lock:
                    outer.requests.append(request.get("messages", []))
                    steps, code = outer.random.randint(min_steps, max_steps), outer.random.random() < 0.3
                    if script:  # the steps of each request in turn (the last one repeats)
                        steps = script[min(len(outer.requests), len(script)) - 1]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                # paragraphs of 12 steps: the Markdown stream re-parses the last block per step;
                # each word numbered, so that no reply is a loop to chat/loops.py
                pieces = [f" {WORDS[i % len(WORDS)]}{i}" + ("\n\n" if i % 12 == 11 else "") for i in range(steps)]
                if code:
                    pieces[steps // 2] += "\n\n```python\nprint('monkey')\n```\n\n"
                try:
                    for number, piece in enumerate(pieces):
                        ids = list(range(1 + number % 3))
                        self._line({"choices": [{"delta": {"content": piece}, "token_ids": ids, "finish_reason": None}]})
                        time.sleep(step_s)
                    self._line({"choices": [{"delta": {}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 10, "completion_tokens": steps}})
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except OSError:  # the client cut the reply
                    pass
                self.close_connection = True

            def _line(self, chunk: dict) -> None:
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()

        self.server = QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> SlowEndpoint:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class Hostile:
    """A server that means harm, for the limits where data enters (NOT vLLM):
    `kind` is one of
    - "deep-line": a reply line nested 100,000 deep;
    - "deep-error": HTTP 500 with a body nested 20,000 deep;
    - "endless-error": HTTP 500 with a body that never ends;
    - "endless-models": a /v1/models that never ends (a profile without `model` asks it);
    - "endless-metrics": a /metrics that never ends (a remote vLLM's counters are read around a reply);
    - "string-ids": token ids sent as a 1,000-character string.
    `sent` counts the bytes it wrote, to show how much a client took."""

    DEEP = "[" * 100_000 + "]" * 100_000
    DEEP_ERROR = "[" * 20_000 + "]" * 20_000  # under an error body's size limit: the depth rule must catch it

    def __init__(self, kind: str):
        self.kind = kind
        self.sent = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def endless(self, status: int, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Connection", "close")
                self.end_headers()
                block = b"x" * (1 << 20)
                try:
                    while not outer.stopped.is_set():
                        self.wfile.write(block)
                        outer.sent += len(block)
                except OSError:  # the client hung up: what a bounded reader does
                    pass
                self.close_connection = True

            def whole(self, status: int, body: bytes, kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                outer.sent += len(body)

            def do_GET(self):
                if self.path.endswith("/models") and outer.kind == "endless-models":
                    return self.endless(200, "application/json")
                if self.path.endswith("/metrics"):
                    if outer.kind == "endless-metrics":
                        return self.endless(200, "text/plain")
                    return self.whole(200, b"vllm:request_success_total 0\n", "text/plain")
                self.whole(200, json.dumps({"data": [{"id": MODEL}]}).encode())

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if outer.kind == "deep-error":
                    return self.whole(500, outer.DEEP_ERROR.encode())
                if outer.kind == "endless-error":
                    return self.endless(500, "application/json")
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                lines = [chunk("Hel")]
                if outer.kind == "deep-line":
                    lines.append("data: " + outer.DEEP + "\n\n")
                elif outer.kind == "string-ids":
                    lines = ["data: " + json.dumps({"choices": [{"delta": {"content": "Hello"}, "token_ids": "x" * 1000}]}) + "\n\n", "data: [DONE]\n\n"]
                else:
                    lines += [chunk("lo."), "data: [DONE]\n\n"]
                for line in lines:
                    self.wfile.write(line.encode())
                    self.wfile.flush()
                self.close_connection = True

        self.stopped = threading.Event()
        self.server = QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Hostile:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def server_lookalike(seconds: int = 120):
    """A process the registry takes for a vLLM server (NOT one: it answers
    nothing), in a session of its own, exec'd before it is handed out."""
    from termchat.engine import proc
    from termchat.engine.command import SERVER_MODULE

    child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})", SERVER_MODULE], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while SERVER_MODULE.encode() not in proc.cmdline(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # until the child has exec'd (its cmdline is empty before)
        assert SERVER_MODULE.encode() in proc.cmdline(child.pid)
        yield child
    finally:
        child.kill()
        child.wait()
