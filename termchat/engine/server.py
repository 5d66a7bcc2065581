"""Start, reach and stop a vLLM OpenAI-compatible server for a profile.

Why a child process and not vLLM inside termchat: vLLM prints logs and spawns
workers, which would corrupt a full-screen UI; a crash would take the UI with
it; and switching profiles must really free the old model's memory. A child in
its own process group gives all three: kill the group and everything is back.

Three kinds of engine, one interface (`base_url`, `api_key`, `model_name`):
- ManagedEngine: started here on 127.0.0.1, a free port, a random key, its
  output in a log file; stopped with its whole process group.
- RemoteEngine: a profile's `endpoint`; nothing is started or stopped.
- an attached ManagedEngine: one that `termchat serve` left running, found
  through its state file; `ask` uses it and leaves it running.
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib.util
import ipaddress
import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from termchat import models, paths
from termchat.errors import UserError
from termchat.profiles import Profile

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
Progress = Callable[[str], None]


class EngineError(UserError):
    """The engine failed to start, died, or cannot be reached."""


def is_loopback(url: str) -> bool:
    """Is this URL on this machine (127.0.0.0/8, ::1, localhost)?"""
    host = urlsplit(url).hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def plain_http_warning(profile: Profile) -> str | None:
    """A remote endpoint that would get the API key in clear text."""
    if profile.endpoint and profile.api_key_env and urlsplit(profile.endpoint).scheme == "http" and not is_loopback(profile.endpoint):
        return f"profile '{profile.name}' sends its API key (${profile.api_key_env}) over plain http:// to {urlsplit(profile.endpoint).hostname}: anyone on the network path can read it; use https://"
    return None


@dataclass
class Engine:
    """What a client needs to talk to a server."""

    profile: Profile
    base_url: str  # ends in /v1
    api_key: str | None
    model_name: str
    state: str = "ready"

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

    def http(self, timeout: float | httpx.Timeout = 10.0) -> httpx.AsyncClient:
        """An HTTP client for this engine: its key, and the one proxy decision."""
        return httpx.AsyncClient(headers=self.headers(), timeout=timeout, trust_env=self.uses_proxy_settings)

    def health(self, timeout: float = 2.0) -> bool:
        """Does /health answer 200 now? (synchronous, for attaching)"""
        try:
            with httpx.Client(timeout=timeout, trust_env=self.uses_proxy_settings) as client:
                return client.get(self.root_url + "/health").status_code == 200
        except httpx.HTTPError:
            return False

    async def detokenize(self, ids: set[int]) -> dict[int, str]:
        """The text of single tokens, from the server's /detokenize."""
        found: dict[int, str] = {}
        async with self.http() as client:
            for token in ids:
                try:
                    response = await client.post(self.root_url + "/detokenize", json={"model": self.model_name, "tokens": [token]})
                    data = response.json()
                except (httpx.HTTPError, ValueError):
                    break
                if isinstance(data, dict) and isinstance(data.get("prompt"), str):
                    found[token] = data["prompt"]
        return found

    def alive(self) -> bool:
        return True

    def stop(self) -> None:
        """Remote and attached engines are not ours to stop."""

    def describe_failure(self) -> str:
        return f"the engine at {self.base_url} did not answer"


KEEP_LOGS = 5  # engine logs kept per profile


def prune_logs(log_dir: Path, profile_name: str, keep: int = KEEP_LOGS - 1) -> None:
    """Delete all but the newest `keep` engine logs of a profile (before a new one is started)."""
    logs = sorted(log_dir.glob(f"engine-{profile_name}-[0-9]*.log"), key=lambda p: p.stat().st_mtime)
    for old in logs[: max(0, len(logs) - keep)]:
        old.unlink(missing_ok=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _flag(key: str, value) -> list[str]:
    name = "--" + key.replace("_", "-")
    if value is True:
        return [name]
    if value is False:
        return ["--no-" + key.replace("_", "-")]
    if isinstance(value, (dict, list)):
        return [name, json.dumps(value)]
    return [name, str(value)]


def server_command(profile: Profile, port: int | str = "PORT", resolve_model: bool = True) -> list[str]:
    """The exact command line that starts vLLM's server for a profile.

    The API key goes in the environment (VLLM_API_KEY), not on the command
    line, where any local user could read it with `ps`."""
    model = models.resolve(profile.model) if resolve_model else profile.model
    cmd = [sys.executable, "-m", SERVER_MODULE, "--model", model, "--served-model-name", profile.model]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    for key in ("tokenizer", "dtype", "max_model_len", "tensor_parallel_size", "quantization", "gpu_memory_utilization"):
        value = getattr(profile, key)
        if value is not None:
            cmd += _flag(key, value)
    if profile.trust_remote_code:
        cmd.append("--trust-remote-code")
    if profile.speculative:
        spec = dict(profile.speculative)
        if resolve_model and spec.get("model"):
            spec["model"] = models.resolve(spec["model"])
        cmd += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
        # per-request acceptance figures in the last streamed chunk (vLLM refuses
        # the flag when speculation is off)
        cmd += ["--per-request-spec-decode-metrics", "summary"]
    for key, value in profile.engine_args.items():
        cmd += _flag(key, value)
    return cmd


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: the server gets SIGTERM if termchat dies, even by kill -9.

    PR_SET_PDEATHSIG follows the parent *thread*, so engines are launched from
    the main thread only (launch() is quick; the health wait runs anywhere)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


@dataclass
class ManagedEngine(Engine):
    """A vLLM server started (or left running by `termchat serve`) on this machine."""

    process: subprocess.Popen | None = None
    pid: int | None = None
    log_path: Path | None = None
    owned: bool = True
    started_at: float = field(default_factory=time.monotonic)

    @classmethod
    def launch(cls, profile: Profile, log_dir: Path | None = None) -> ManagedEngine:
        """Start the server and return at once; call wait_ready() next."""
        if profile.method == "suffix" and importlib.util.find_spec("arctic_inference") is None:
            raise EngineError(
                f"profile '{profile.name}' uses suffix decoding, which needs the arctic-inference package: "
                "`python3 -m termchat.bootstrap setup` builds it, or pick another profile (local-ngram, local-plain)"
            )
        port, key = free_port(), secrets.token_urlsafe(24)
        cmd = server_command(profile, port)
        log_dir = paths.private_dir(log_dir or paths.logs_dir())
        prune_logs(log_dir, profile.name)
        log_path = log_dir / f"engine-{profile.name}-{time.strftime('%Y%m%d-%H%M%S')}-{port}.log"
        env = {**os.environ, **profile.env, "PYTHONUNBUFFERED": "1", "VLLM_API_KEY": key}
        with os.fdopen(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as log:
            log.write(("$ " + shlex.join(cmd) + "\n").encode())
            log.flush()
            try:
                process = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
                )
            except OSError as exc:
                raise EngineError(f"could not start the engine: {exc}") from None
        return cls(
            profile=profile,
            base_url=f"http://127.0.0.1:{port}/v1",
            api_key=key,
            model_name=profile.model,
            state="starting",
            process=process,
            pid=process.pid,
            log_path=log_path,
        )

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return self.pid is not None and _pid_alive(self.pid)

    def log_tail(self, lines: int = 12) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, 2) - 16384))
            text = handle.read().decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    def describe_failure(self) -> str:
        code = self.process.poll() if self.process else None
        how = f"exited with code {code}" if code is not None else "stopped answering"
        return (
            f"the engine for profile '{self.profile.name}' {how}. Last lines of {self.log_path}:\n"
            f"{self.log_tail()}\nFix the cause above, then start again (the full log is in that file)."
        )

    def _check(self) -> None:
        if not self.alive():
            self.state = "failed"
            raise EngineError(self.describe_failure())

    def wait_ready(self, timeout: float = 600.0, progress: Progress | None = None) -> None:
        """Block until /health answers; raise EngineError with the log tail if it dies."""
        asyncio.run(self.wait_ready_async(timeout, progress))

    async def wait_ready_async(self, timeout: float = 600.0, progress: Progress | None = None) -> None:
        """Poll /health twice a second; give up at `timeout` or when the process dies."""
        deadline = time.monotonic() + timeout
        async with self.http(timeout=2.0) as client:
            while True:
                self._check()
                try:
                    if (await client.get(self.root_url + "/health")).status_code == 200:
                        self.state = "ready"
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise EngineError(f"the engine did not become ready within {timeout:.0f} s; see {self.log_path}")
                if progress:
                    progress(self._progress_line())
                await asyncio.sleep(0.5)

    def _progress_line(self) -> str:
        last = next((line for line in reversed(self.log_tail(5).splitlines()) if line.strip()), "")
        return f"starting {self.profile.name} ({time.monotonic() - self.started_at:.0f} s): {last[-160:]}"

    def stop(self, timeout: float = 20.0) -> None:
        """End the whole process group and check that nothing of it is left."""
        if not self.owned or self.pid is None:
            return
        pgid = self.pid
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
            end = time.monotonic() + wait
            while time.monotonic() < end:
                if self.process is not None:
                    self.process.poll()
                if not _group_members(pgid):
                    break
                time.sleep(0.1)
            if not _group_members(pgid):
                break
        if self.process is not None:
            try:
                self.process.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        self.state = "stopped"
        left = _group_members(pgid)
        if left:
            raise EngineError(f"engine processes {left} survived SIGKILL; end them by hand (kill -9 {' '.join(map(str, left))})")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _our_engine(pid: object) -> bool:
    """Is `pid` a live vLLM server of this user? (a recycled pid, or another
    user's process, must not count as a running `termchat serve`)"""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    proc = Path(f"/proc/{pid}")
    try:
        if proc.stat().st_uid != os.getuid():
            return False
        return SERVER_MODULE.encode() in (proc / "cmdline").read_bytes()
    except OSError:
        return False


# ---- `termchat serve` state files, so `ask` can attach --------------------------------


def _serve_file(profile_name: str) -> Path:
    return paths.state_dir() / "serve" / f"{profile_name}.json"


def write_serve_state(engine: ManagedEngine) -> Path:
    path = _serve_file(engine.profile.name)
    paths.private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # holds the API key
    with os.fdopen(fd, "w") as handle:
        json.dump({"base_url": engine.base_url, "api_key": engine.api_key, "pid": engine.pid, "model": engine.model_name, "log": str(engine.log_path)}, handle)
    return path


def remove_serve_state(profile_name: str) -> None:
    _serve_file(profile_name).unlink(missing_ok=True)


def find_served(profile: Profile) -> ManagedEngine | None:
    """A `termchat serve` of this profile that is up and answering, if any."""
    path = _serve_file(profile.name)
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        state = None
    fields = ("base_url", "api_key", "model", "log")
    if not isinstance(state, dict) or not all(isinstance(state.get(k), str) for k in fields) or not is_loopback(state["base_url"]):
        if path.exists():
            path.unlink(missing_ok=True)  # empty, damaged or not ours: a fresh start is the answer
        return None
    if not _our_engine(state.get("pid")):
        path.unlink(missing_ok=True)
        return None
    engine = ManagedEngine(profile=profile, base_url=state["base_url"], api_key=state["api_key"], model_name=state["model"], pid=state["pid"], log_path=Path(state["log"]), owned=False)
    return engine if engine.health() else None


def remote_engine(profile: Profile) -> Engine:
    """A profile's `endpoint`; the key only ever comes from its environment variable."""
    key = None
    if profile.api_key_env:
        key = os.environ.get(profile.api_key_env)
        if not key:
            raise EngineError(f"profile '{profile.name}' reads its API key from ${profile.api_key_env}, which is not set; export it and try again")
    base = profile.endpoint.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    # no model in the profile: ask the server for it on the first request
    return Engine(profile=profile, base_url=base, api_key=key, model_name=profile.model or "")


async def open_engine_async(
    profile: Profile,
    progress: Progress | None = None,
    launched: Callable[[ManagedEngine], None] | None = None,
    attach: bool = True,
    timeout: float = 600.0,
) -> Engine:
    """The engine for a profile, ready to answer: remote, attached to a running
    `termchat serve`, or started here.

    Run it on the main thread's event loop: the engine is launched from that
    thread so that it dies with termchat (PDEATHSIG). `launched` hears of a
    started engine at once, so the caller can stop it while it warms up."""
    if profile.is_remote:
        return remote_engine(profile)
    if attach:
        served = await asyncio.to_thread(find_served, profile)
        if served is not None:
            return served
    engine = ManagedEngine.launch(profile)
    if launched is not None:
        launched(engine)
    await engine.wait_ready_async(timeout=timeout, progress=progress)
    return engine


def open_engine(profile: Profile, progress: Progress | None = None, attach: bool = True, timeout: float = 600.0) -> Engine:
    """open_engine_async for callers without an event loop; an engine that
    does not get ready is stopped."""
    started: list[ManagedEngine] = []
    try:
        return asyncio.run(open_engine_async(profile, progress, started.append, attach, timeout))
    except BaseException:
        for engine in started:
            engine.stop()
        raise
