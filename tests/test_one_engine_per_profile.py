"""One recorded engine per profile (registry.py): `termchat serve` and the
front-ends' warm engines never write over each other's state file, so no
engine runs unseen by `termchat ps` and `termchat stop`.

The engines here are stand-ins: sleeping processes whose command line names
vLLM's server module, which is all the registry checks of a process (it
never talks to them but for /health, which they do not answer). What is
tested is the registry's protocol, not an engine.
"""

from __future__ import annotations

import os
import signal

import pytest

from termchat import cli
from termchat.engine import proc, registry, state
from termchat.engine.endpoint import EngineState
from termchat.engine.process import ManagedEngine
from termchat.profiles import load_config

from .conftest import engine_profile
from .standin import server_lookalike


@pytest.fixture
def stand_in():
    with server_lookalike() as child:
        yield child


def record_of(pid: int, profile, keep_alive: float | None) -> state.EngineRecord:
    return state.EngineRecord("http://127.0.0.1:9/v1", "key", pid, proc.started_at(pid) or "", profile.model, "/tmp/log",
                              fingerprint=registry.fingerprint(profile), keep_alive=keep_alive)


def engine_of(pid: int, profile) -> ManagedEngine:
    return ManagedEngine(profile=profile, base_url="http://127.0.0.1:8/v1", api_key="mine", model_name=profile.model, pid=pid, owned=False)


@pytest.fixture
def config(tmp_path):
    """A profile of its own: the session's shared engine is `local`'s, and its record must stay."""
    path = tmp_path / "config.toml"
    path.write_text(engine_profile("one-engine", max_model_len=2048))
    return path


@pytest.fixture
def profile(config):
    profile = load_config(config).get("one-engine")
    yield profile
    registry.state_file(profile.name).unlink(missing_ok=True)


def test_a_live_engines_record_is_never_written_over(stand_in, profile):
    path = registry.state_file(profile.name)
    theirs = record_of(stand_in.pid, profile, keep_alive=60.0)
    state.write_record(path, theirs)
    assert registry.write_state(engine_of(os.getpid(), profile)) == theirs
    assert state.read_record(path) == theirs  # untouched


@pytest.mark.parametrize("content", [b"", b"{not json", None])
def test_an_empty_damaged_or_stale_record_is_replaced(profile, content):
    path = registry.state_file(profile.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    if content is None:
        state.write_record(path, record_of(4_000_000, profile, keep_alive=60.0))  # no such process
    else:
        path.write_bytes(content)
    assert registry.write_state(engine_of(os.getpid(), profile), keep_alive=30.0) is None
    written = state.read_record(path)
    assert written is not None and written.pid == os.getpid() and written.keep_alive == 30.0
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_two_writers_at_once_one_wins():
    from termchat import paths

    where = paths.state_dir() / "claim-test"
    try:
        assert paths.write_private(where, b"first", replace=False)
        assert not paths.write_private(where, b"second", replace=False)
        assert where.read_bytes() == b"first"
        assert not [p for p in where.parent.iterdir() if p.name.startswith(".claim-test")]  # no temporary file left
    finally:
        where.unlink(missing_ok=True)


def test_a_served_engine_still_starting_is_waited_for_not_doubled(stand_in, profile):
    """`termchat serve` records its engine at launch; a front-end that comes
    meanwhile gets it as starting (and waits), where it used to start a second."""
    state.write_record(registry.state_file(profile.name), record_of(stand_in.pid, profile, keep_alive=None))
    assert registry.find_served(profile) is None  # not answering yet: not ready for a caller that does not wait
    found = registry.find_served(profile, lease=True, starting=True)
    assert found is not None and found.pid == stand_in.pid and found.state == EngineState.STARTING
    assert found.lease is None  # serve's engine lives as long as serve: no lease


@pytest.fixture
def serve_here(monkeypatch, config):
    """`termchat serve --profile one-engine` in this process, its signal handlers
    left out; a launch is recorded and ends the command."""
    launches = []

    class Launched(Exception):
        pass

    def launch(profile, keep_alive=0.0):
        launches.append(profile.name)
        raise Launched

    monkeypatch.setattr(signal, "signal", lambda *args: None)
    monkeypatch.setattr(ManagedEngine, "launch", staticmethod(launch))

    def run():
        try:
            return cli.main(["serve", "--config", str(config), "--profile", "one-engine"])
        except Launched:
            return "launched"

    return run, launches


@pytest.mark.parametrize("keep_alive, leased", [(None, False), (60.0, True)])
def test_serve_refuses_a_profile_whose_engine_is_served_or_in_use(stand_in, profile, serve_here, capsys, keep_alive, leased):
    run, launches = serve_here
    path = registry.state_file(profile.name)
    theirs = record_of(stand_in.pid, profile, keep_alive=keep_alive)
    state.write_record(path, theirs)
    lease = state.take_lease(stand_in.pid) if leased else None
    try:
        assert run() == 2  # a UserError: one line, no traceback
    finally:
        if lease is not None:
            state.drop_lease(lease)
    err = capsys.readouterr().err
    assert f"pid {stand_in.pid}" in err and "termchat stop one-engine" in err and "Traceback" not in err
    assert launches == [] and stand_in.poll() is None  # nothing started, nothing stopped
    assert state.read_record(path) == theirs


def test_serve_takes_over_from_an_idle_warm_engine(stand_in, profile, serve_here, capsys):
    run, launches = serve_here
    state.write_record(registry.state_file(profile.name), record_of(stand_in.pid, profile, keep_alive=60.0))
    assert run() == "launched"
    assert launches == ["one-engine"]
    assert stand_in.wait(timeout=20) == -signal.SIGTERM  # the idle one was stopped first
    assert f"stopped the idle warm engine of 'one-engine' (pid {stand_in.pid})" in capsys.readouterr().err
    assert not registry.state_file(profile.name).exists()


@pytest.mark.parametrize("settings", ["same", "earlier"])
def test_a_front_end_that_loses_the_record_stops_its_engine_and_waits_for_the_recorded_one(profile, monkeypatch, settings):
    """The race itself: while a front-end launches a warm engine, `termchat
    serve` records one of the same profile. The front-end's engine goes,
    nothing is written over serve's record, and the front-end waits for
    serve's engine (which, a look-alike, never answers: the wait times out),
    or, if serve runs the profile's earlier settings, says so."""
    import asyncio
    import dataclasses

    from termchat.engine.connect import open_engine_async
    from termchat.engine.process import EngineError
    from termchat.errors import UserError

    warm = dataclasses.replace(profile, keep_alive=60.0)
    served = warm if settings == "same" else dataclasses.replace(warm, max_model_len=1024)
    with server_lookalike() as ours, server_lookalike() as serves:
        path = registry.state_file(profile.name)
        theirs = record_of(serves.pid, served, keep_alive=None)
        launched = []

        def launch(profile, keep_alive=0.0):
            launched.append(keep_alive)
            state.write_record(path, theirs)  # serve recorded its engine meanwhile
            return ManagedEngine(profile=profile, base_url="http://127.0.0.1:8/v1", api_key="k", model_name=profile.model, pid=ours.pid, owned=True)

        monkeypatch.setattr(ManagedEngine, "launch", staticmethod(launch))
        expected = (EngineError, "did not become ready within 1 s; see /tmp/log") if settings == "same" else (UserError, "earlier settings")
        with pytest.raises(expected[0], match=expected[1]):  # waited for serve's engine (its log), or told why not
            asyncio.run(open_engine_async(warm, keep_warm=True, timeout=1.0))
        assert launched == [60.0]  # one launch
        assert ours.wait(timeout=20) == -signal.SIGTERM  # the front-end's own engine was stopped
        assert serves.poll() is None  # serve's is not the front-end's to stop
        assert state.read_record(path) == theirs
        assert not state.live_leases(ours.pid)
