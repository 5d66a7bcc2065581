"""Engines started on this machine: launched, watched through /proc, stopped.

Why a child process and not vLLM inside termchat: vLLM prints logs and spawns
workers, which would corrupt a full-screen UI; a crash would take the UI with
it; and switching profiles must really free the old model's memory. A child in
its own process group gives all three: kill the group and everything is back.
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib.util
import json
import os
import re
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

from termchat import paths
from termchat.engine import proc, state
from termchat.engine.watchdog import WARM_ENV
from termchat.engine.command import owned, server_command
from termchat.engine.guarded_server import OWNS_ENV
from termchat.engine.endpoint import Engine, EngineError, EngineState
from termchat.profiles import Profile

Progress = Callable[[str], None]


# vLLM's log lines when a compiled engine starts: compiling, or loading the
# compiled model; and the line that ends the engine core's initialisation
COMPILING = "Warming up model for the compilation"
LOADED_COMPILED = "Directly load AOT compilation"
ENGINE_INITIALIZED = "init engine (profile, create kv cache, warmup model)"

KEEP_LOGS = 5  # engine logs kept per profile

# vLLM's and termchat's words for why an engine could not start -> what it means and what to do
_ERROR_LINE = re.compile(r"\b([A-Za-z_.]*(?:Error|Exception)): (.+)$")
_WRAPPERS = re.compile(r"See root cause above|Engine core initialization failed|Failed core proc")  # vLLM's, around the cause
START_FAILURES = (
    (re.compile(r"KV cache is needed|maximum number of tokens that can be stored in KV cache|kv_cache_memory_bytes", re.I),
     "its KV cache is too small for the context ({detail}); raise kv_cache_memory_bytes in engine_args or lower max_model_len"),
    (re.compile(r"Available memory|less than desired|not enough memory|Cannot allocate memory|out of memory|MemoryError|No available memory", re.I),
     "not enough memory ({detail}); stop other engines (`termchat ps`, `termchat stop --all`) or programs, or pick a smaller model or KV cache"),
    (re.compile(r"termchat_gguf|termchat_ggml|GGUF|config\.json|not a local folder|Repository Not Found|valid model identifier|Unrecognized model|No such file", re.I),
     "the model could not be loaded ({detail}); check `model` in the profile and `termchat models list`"),
)


def diagnose(log: str, code: int | None) -> str:
    """One line from an engine's log: the cause vLLM or termchat's loader gave."""
    errors = [m for m in (_ERROR_LINE.search(line.strip()) for line in log.splitlines()) if m and not _WRAPPERS.search(m.group(2))]
    detail = errors[-1].group(2).strip()[:240] if errors else ""
    for pattern, says in START_FAILURES:
        if detail and pattern.search(detail) or not detail and pattern.search(log[-4000:]):
            return says.format(detail=detail or "see the log")
    if code in (-9, 137) and not detail:
        return "it was killed (SIGKILL), most likely by the kernel for want of memory; stop other programs or pick a smaller model"
    if detail:
        return f"{errors[-1].group(1)}: {detail}"
    return f"it exited with code {code}" if code is not None else "it stopped answering"


def prune_logs(log_dir: Path, profile_name: str, keep: int = KEEP_LOGS - 1) -> None:
    """Delete all but the newest `keep` engine logs of a profile (before a new one is started)."""
    logs = sorted(log_dir.glob(f"engine-{profile_name}-[0-9]*.log"), key=lambda p: p.stat().st_mtime)
    for old in logs[: max(0, len(logs) - keep)]:
        old.unlink(missing_ok=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scalable_malloc(env: dict[str, str]) -> str | None:
    """LD_PRELOAD for oneTBB's scalable allocator (the `tbb` wheel's
    libtbbmalloc_proxy) in place of glibc's malloc in the engine's processes.
    A decode step allocates and frees hundreds of small buffers on the step
    thread; glibc's malloc took 3% of it (`python -m termchat.bench.step
    --native`). With tbbmalloc, steps were shorter in 8 of 11 alternating
    runs, median 4% (bench README, "The allocator"). Not where `env` (the
    environment with the profile's) already preloads something, which stays
    the user's choice, or sets TERMCHAT_MALLOC=glibc; None where the wheel
    is not installed (not Linux x86_64) or its path cannot go in LD_PRELOAD."""
    if env.get("TERMCHAT_MALLOC", "tbb") != "tbb" or env.get("LD_PRELOAD"):
        return None
    from importlib import metadata

    try:
        files = metadata.files("tbb") or []
    except metadata.PackageNotFoundError:
        return None
    found = {f.name: Path(f.locate()).resolve() for f in files if f.name in ("libtbbmalloc.so.2", "libtbbmalloc_proxy.so.2")}
    libs = [found.get("libtbbmalloc.so.2"), found.get("libtbbmalloc_proxy.so.2")]  # the proxy needs the allocator loaded first
    if not all(lib is not None and lib.is_file() and not re.search(r"[\s:]", str(lib)) for lib in libs):
        return None
    return ":".join(str(lib) for lib in libs)


def die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: the server gets SIGTERM if termchat dies, even by kill -9.

    PR_SET_PDEATHSIG follows the parent *thread*, so engines are launched from
    the main thread only (launch() is quick; the health wait runs anywhere)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass




@dataclass
class ManagedEngine(Engine):
    """A vLLM server started (or left running by `termchat serve`) on this machine."""

    process: subprocess.Popen | None = None
    pid: int | None = None
    log_path: Path | None = None
    owned: bool = True
    started_at: float = field(default_factory=time.monotonic)
    lease: Path | None = None  # this process uses a warm engine (watchdog.py, registry.py)

    @classmethod
    def launch(cls, profile: Profile, log_dir: Path | None = None, keep_alive: float = 0.0) -> ManagedEngine:
        """Start the server and return at once; call wait_ready() next.

        With `keep_alive` the engine is warm (watchdog.py, registry.py): it outlives termchat
        and ends itself once unused that long; without, it dies with termchat."""
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
        owns = owned(profile, port, cmd[cmd.index("--model") + 1])
        env = {**os.environ, **profile.env, "PYTHONUNBUFFERED": "1", "VLLM_API_KEY": key, OWNS_ENV: json.dumps(owns)}
        preload = scalable_malloc(env)
        if preload:
            env["LD_PRELOAD"] = preload
        if keep_alive > 0:
            env[WARM_ENV] = json.dumps({"serve": str(paths.private_dir(state.serve_dir())), "keep_alive": keep_alive})
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
                    preexec_fn=die_with_parent if sys.platform.startswith("linux") and keep_alive <= 0 else None,
                )
            except OSError as exc:
                raise EngineError(f"could not start the engine: {exc}") from None
        return cls(
            profile=profile,
            base_url=f"http://127.0.0.1:{port}/v1",
            api_key=key,
            model_name=profile.model,
            state=EngineState.STARTING,
            process=process,
            pid=process.pid,
            log_path=log_path,
        )

    def release(self) -> None:
        """This front-end is done with the engine: a warm one stays for others
        and for keep_alive (this process's lease goes); any other is stopped."""
        if self.lease is not None:
            state.drop_lease(self.lease)
            self.lease = None
        else:
            self.stop()

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return self.pid is not None and proc.pid_alive(self.pid)

    def log_tail(self, lines: int = 12) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, 2) - 16384))
            text = handle.read().decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    def start_phase(self) -> str:
        """What a start is doing when it takes long, from vLLM's log: compiling
        (torch.compile) happens on the first start of an engine's settings on a
        machine; later starts load the result from vLLM's cache."""
        if not self.log_path or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as handle:
            text = handle.read(1 << 20).decode("utf-8", "replace")
        if COMPILING in text and LOADED_COMPILED not in text and ENGINE_INITIALIZED not in text:
            return "compiling the model for this CPU: the first start of these settings on this machine takes 1-3 min; later starts load it from vLLM's cache"
        return ""

    def describe_failure(self) -> str:
        code = self.process.poll() if self.process else None
        how = f"exited with code {code}" if code is not None else "stopped answering"
        return (
            f"the engine for profile '{self.profile.name}' {how}. Last lines of {self.log_path}:\n"
            f"{self.log_tail()}\nFix the cause above, then start again (the full log is in that file)."
        )

    def start_failure(self) -> str:
        """Why the engine could not start, in one line (memory, KV cache, model,
        or vLLM's own last error), and the log's path on a second."""
        code = self.process.poll() if self.process else None
        text = ""
        if self.log_path and self.log_path.exists():
            with open(self.log_path, "rb") as handle:
                handle.seek(max(0, handle.seek(0, 2) - (1 << 20)))
                text = handle.read().decode("utf-8", "replace")
        cause = diagnose(text, code)
        return f"the engine for profile '{self.profile.name}' could not start: {cause}\nits log: {self.log_path}"

    def _check(self, starting: bool = False) -> None:
        if not self.alive():
            self.state = EngineState.FAILED
            raise EngineError(self.start_failure() if starting else self.describe_failure())

    def wait_ready(self, timeout: float = 600.0, progress: Progress | None = None) -> None:
        """Block until /health answers; raise EngineError with the log tail if it dies."""
        self.run(lambda: self.wait_ready_async(timeout, progress))

    async def wait_ready_async(self, timeout: float = 600.0, progress: Progress | None = None) -> None:
        """Poll /health twice a second; give up at `timeout` or when the process dies."""
        deadline = time.monotonic() + timeout
        while True:
            self._check(starting=True)
            if await self.health():
                self.state = EngineState.READY
                return
            if time.monotonic() > deadline:
                self.stop()
                raise EngineError(f"the engine did not become ready within {timeout:.0f} s; see {self.log_path}")
            if progress:
                progress(self._progress_line())
            await asyncio.sleep(0.5)

    def _progress_line(self) -> str:
        phase = self.start_phase()
        last = next((line for line in reversed(self.log_tail(5).splitlines()) if line.strip()), "")
        return f"starting {self.profile.name} ({time.monotonic() - self.started_at:.0f} s): {phase or last[-160:]}"

    def stop(self, timeout: float = 20.0) -> None:
        """End the whole process group and check that nothing of it is left
        (a warm engine this process uses too: F5 restarts it)."""
        if not (self.owned or self.lease is not None) or self.pid is None:
            return
        pgid = self.pid
        state.forget(pgid)  # nobody attaches to it while it ends
        self.lease = None
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
            end = time.monotonic() + wait
            while time.monotonic() < end:
                if self.process is not None:
                    self.process.poll()
                if not proc.group_members(pgid):
                    break
                time.sleep(0.1)
            if not proc.group_members(pgid):
                break
        if self.process is not None:
            try:
                self.process.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        self.state = EngineState.STOPPED
        left = proc.group_members(pgid)
        if left:
            raise EngineError(f"engine processes {left} survived SIGKILL; end them by hand (kill -9 {' '.join(map(str, left))})")

