"""Shared fixtures: a throw-away termchat home, and ONE real engine per session.

The shared engine is `termchat serve --profile local` run as a child process
(the real vLLM CPU build with the packaged SmolLM2 model). Everything in
termchat that opens the `local` profile attaches to it through serve's state
file, exactly as `termchat ask` does for a user, so no test starts its own
copy. Tests that need a different engine configuration (no speculation, a
draft model) start one, one at a time, in their own module.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from termchat import models, paths
from termchat.engine import proc

ROOT = Path(__file__).resolve().parent.parent
TERMCHAT = [sys.executable, "-m", "termchat.cli"]


def vllm_processes() -> list[str]:
    """Live (non-zombie) processes that are part of a vLLM server."""
    found = []
    for pid in proc.pids():
        cmd = proc.cmdline(pid).replace(b"\0", b" ").decode(errors="replace")
        fields = proc.stat_fields(pid)
        if fields and fields[0] != "Z" and ("vllm.entrypoints" in cmd or cmd.startswith("VLLM::")):
            found.append(f"{pid} {cmd[:120]}")
    return found


def engine_profile(name: str, env: dict | None = None, **keys) -> str:
    """A `[profiles.NAME]` table for an engine a test starts itself, with the
    built-in CPU profiles' engine settings (profiles._cpu_engine(): the forked
    engine core, one process, the KV cache size, thread binding), eager: these
    engines test lifecycles and sampling, not the compile. `keys` are more
    profile keys (a dict becomes an inline table), `env` more environment."""
    import json

    from termchat.profiles import _cpu_engine

    base = _cpu_engine()

    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        return json.dumps(v)

    table = {"model": base["model"], "dtype": base["dtype"], **keys}
    table["engine_args"] = {**base["engine_args"], "enforce_eager": True}
    table["env"] = {**base["env"], **(env or {})}
    return f"\n[profiles.{name}]\n" + "".join(f"{k} = {value(v)}\n" for k, v in table.items())


async def wait_for(pilot, condition, timeout=180.0, what="condition"):
    """Let a Pilot-driven app run until `condition()` holds."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.1)


async def streamed_view(app, pieces: list[str]):
    """A reply view on screen, fed `pieces` as engine steps would (a stand-in for the stream)."""
    from termchat.engine.stats import Step
    from termchat.ui.widgets.message import MessageView

    view = MessageView("assistant", "stand-in")
    await app.query_one("#chat").mount(view)
    for number, piece in enumerate(pieces):
        await view.append(Step(piece, (number,), 0.0))
    await view.finish(None)
    return view


def group_alive(pgid: int) -> list[int]:
    from termchat.engine.proc import group_members

    return group_members(pgid)


def group_left_after(pgid: int, seconds: float = 30.0) -> list[int]:
    """The group's processes still alive once `seconds` have passed, or none as soon as
    it is empty: a server's helper (vLLM's EngineCore) sees its parent go and exits a
    moment later, not at once. Whatever is left is killed, so no test inherits it."""
    from termchat.engine.proc import group_members

    deadline = time.monotonic() + seconds
    while (left := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    return left


@pytest.fixture(scope="session", autouse=True)
def termchat_home(tmp_path_factory):
    """Keep tests out of the user's folders; share the converted model."""
    real_models = paths.models_dir()
    home = tmp_path_factory.mktemp("termchat-home")
    os.environ["TERMCHAT_HOME"] = str(home)
    os.environ["TERMCHAT_MODELS"] = str(real_models)
    os.environ.pop("TERMCHAT_CONFIG", None)
    # engines stop when their front-end leaves them, as before keep-alive; the warm
    # engine tests (test_warm.py) set keep_alive in their profiles
    os.environ["TERMCHAT_KEEP_ALIVE"] = "0"
    yield home


@pytest.fixture(scope="session")
def prepared_model(termchat_home):
    models.prepare(quiet=True)  # no-op when the set-up already did it
    return models.folder("termchat:smollm2-135m-instruct")


@pytest.fixture(scope="session")
def shared_engine(prepared_model):
    """The session's one `local` engine, run by `termchat serve`."""
    from termchat.engine.registry import find_served
    from termchat.profiles import builtin_profiles

    profile = builtin_profiles()["local"]
    log = open(paths.state_dir().parent / "serve.out", "wb") if paths.state_dir().parent.exists() else subprocess.DEVNULL
    proc = subprocess.Popen([*TERMCHAT, "serve", "--profile", "local"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    deadline = time.monotonic() + 400
    engine = None
    while time.monotonic() < deadline and proc.poll() is None:
        engine = find_served(profile)
        if engine:
            break
        time.sleep(1)
    if engine is None:
        proc.kill()
        pytest.fail(f"termchat serve did not come up (exit {proc.poll()}); see {getattr(log, 'name', '')}")
    yield engine
    os.killpg(proc.pid, signal.SIGINT)  # serve stops its engine on Ctrl+C
    proc.wait(timeout=60)
    left = group_alive(engine.pid)
    assert not left, f"engine processes survived `termchat serve` shutdown: {left}"
