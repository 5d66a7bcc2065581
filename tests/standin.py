"""A scripted stand-in for an OpenAI-compatible endpoint (NOT vLLM).

Only for what the real engine cannot be made to do on demand: send a broken
stream, an error mid-reply, close early, never answer, or present a
self-signed certificate. It serves `/v1/models` and streams the scripted
lines of one scenario for every `/v1/chat/completions`.
"""

from __future__ import annotations

import json
import ssl
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


SCENARIOS = {
    "ok": [chunk("Hello"), chunk(" there."), "data: [DONE]\n\n"],
    "not-json": [chunk("Hel"), "data: {this is not json\n\n"],
    "not-object": [chunk("Hel"), "data: [1, 2, 3]\n\n"],
    "error-mid-stream": [chunk("Hel"), "data: " + json.dumps({"error": {"message": "\x1b]52;c;cm0gLXJm\x07out of memory [/]"}}) + "\n\n"],
    "no-done": [chunk("Hel"), chunk("lo")],
    "silent": None,  # accepts the request and never answers
    "pings": [": ping\n\n"] * 250,  # SSE comments only, for 5 s: alive, but no answer
    "separators": [raw_chunk(SEPARATED[0]), _second[:_cut], _second[_cut : _cr + 1], _second[_cr + 1 :], raw_chunk(SEPARATED[2]), b"data: [DONE]\r\r"],
}


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
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
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
