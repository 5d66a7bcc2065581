"""Warm engines (engine/watchdog.py, registry.py): an engine outlives its front-end for the
profile's keep_alive, later front-ends attach to it, and it ends itself.

The real vLLM engine (the CPU build, the packaged SmolLM2), not the session's
shared one: these tests start, leave, expire and stop their own engines, one
or two at a time. The profiles are `local-plain`'s settings (the quickest to
start) under other names, with keep_alive set (the suite's default is 0).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from termchat.engine import proc, registry, state, watchdog
from termchat.engine.controller import EngineController
from termchat.engine.proc import group_members
from termchat.profiles import load_config

from .conftest import ROOT, TERMCHAT, engine_profile
from .standin import server_lookalike

pytestmark = pytest.mark.engine

def write_config(path: Path, **profiles) -> Path:
    """profiles: name -> (keep_alive, max_model_len)."""
    path.write_text("".join(engine_profile(name, max_model_len=length, max_tokens=8, keep_alive=keep) for name, (keep, length) in profiles.items()))
    return path


def profile(config: Path, name: str):
    return load_config(config).get(name)


def warm_pids() -> dict[str, int]:
    return {e.profile: e.pid for e in registry.running_engines() if e.keep_alive is not None}


def gone(pid: int, within: float) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if not group_members(pid):
            return True
        time.sleep(0.5)
    return False


@pytest.fixture(autouse=True)
def no_warm_engine_left(prepared_model):
    """Whatever a test leaves warm is stopped, and nothing of it may survive."""
    yield
    for engine in registry.running_engines():
        if engine.keep_alive is not None:  # not the session's `termchat serve`
            registry.stop_engine(engine)
            assert not group_members(engine.pid)


def ask(config: Path, name: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TERMCHAT, "ask", "--config", str(config), "--profile", name, "--no-save", "Say hi."], capture_output=True, text=True, timeout=400, cwd=ROOT)


def test_a_relaunch_attaches_to_the_warm_engine_and_stop_all_ends_it(tmp_path):
    config = write_config(tmp_path / "c.toml", **{"warm-ask": (120, 2048)})
    first = ask(config, "warm-ask")
    assert first.returncode == 0, first.stderr
    pid = warm_pids()["warm-ask"]  # the front-end has exited; its engine has not
    assert group_members(pid)
    second = ask(config, "warm-ask")
    assert second.returncode == 0, second.stderr
    assert warm_pids() == {"warm-ask": pid}  # attached: no second engine
    assert "starting warm-ask" not in second.stderr
    listed = subprocess.run([*TERMCHAT, "ps"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    row = next(line for line in listed.stdout.splitlines() if line.startswith("warm-ask"))
    assert str(pid) in row.split() and "GB" in row
    stopped = subprocess.run([*TERMCHAT, "stop", "--all"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert stopped.returncode == 0 and f"pid {pid}" in stopped.stdout
    assert not group_members(pid) and warm_pids() == {}
    assert not registry.state_file("warm-ask").exists()


async def test_switching_a_to_b_to_a_attaches_to_a_and_an_edited_profile_starts_afresh(tmp_path):
    config = write_config(tmp_path / "c.toml", **{"warm-a": (120, 2048), "warm-b": (120, 2048)})
    engines = EngineController()
    a = await engines.start(profile(config, "warm-a"))
    b = await engines.switch(profile(config, "warm-b"))
    assert a.pid != b.pid and a.alive()  # A stayed warm
    again = await engines.switch(profile(config, "warm-a"))
    assert again.pid == a.pid and await again.health()
    assert warm_pids() == {"warm-a": a.pid, "warm-b": b.pid}
    await engines.stop()
    # the config is edited: A's engine has settings the profile no longer has
    write_config(config, **{"warm-a": (120, 1024), "warm-b": (120, 2048)})
    fresh = await engines.start(profile(config, "warm-a"))
    assert fresh.pid != a.pid
    assert gone(a.pid, 60)  # the stale one, unused, was stopped
    await engines.stop()


async def test_two_front_ends_share_one_engine_which_expires_once_both_leave(tmp_path):
    config = write_config(tmp_path / "c.toml", **{"warm-s": (3, 2048)})
    one, two = EngineController(), EngineController()
    first = await one.start(profile(config, "warm-s"))
    second = await two.start(profile(config, "warm-s"))
    assert second.pid == first.pid and second.lease != first.lease
    await one.stop()
    time.sleep(8)  # beyond keep_alive: the other front-end still uses it
    assert await second.health()
    await two.stop()
    assert gone(first.pid, 60)
    assert not registry.state_file("warm-s").exists() and not state.lease_dir(first.pid).exists()


def test_the_engine_of_a_sigkilled_front_end_still_expires(tmp_path):
    config = write_config(tmp_path / "c.toml", **{"warm-k": (5, 2048)})
    holder = (
        "import sys, time\n"
        "from termchat.engine.connect import open_engine\n"
        "from termchat.profiles import load_config\n"
        f"engine = open_engine(load_config({str(config)!r}).get('warm-k'), keep_warm=True)\n"
        "print(engine.pid, flush=True)\n"
        "time.sleep(3600)\n"
    )
    front = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        pid = int(front.stdout.readline())
        time.sleep(8)  # beyond keep_alive: its front-end holds it
        assert group_members(pid)
    finally:
        front.send_signal(signal.SIGKILL)
        front.wait()
    assert gone(pid, 60)  # no front-end left to stop it: it ended itself
    assert warm_pids() == {}


def test_keep_alive_comes_from_the_profile_then_the_environment_then_five_minutes(monkeypatch):
    from dataclasses import replace

    from termchat.profiles import builtin_profiles

    local = builtin_profiles()["local"]
    monkeypatch.setenv("TERMCHAT_KEEP_ALIVE", "42")
    assert local.keep_alive_s == 42.0 and replace(local, keep_alive=7).keep_alive_s == 7.0
    monkeypatch.delenv("TERMCHAT_KEEP_ALIVE")
    assert local.keep_alive_s == 300.0 and replace(local, keep_alive=0).keep_alive_s == 0.0


@pytest.mark.parametrize("value", ["inf", "Infinity", "1e999", "nan", "-5", "soon"])
def test_a_keep_alive_that_is_not_a_time_is_one_clear_error(monkeypatch, value):
    from termchat.errors import UserError
    from termchat.profiles import builtin_profiles

    monkeypatch.setenv("TERMCHAT_KEEP_ALIVE", value)
    with pytest.raises(UserError, match="TERMCHAT_KEEP_ALIVE"):
        builtin_profiles()["local"].keep_alive_s
    result = subprocess.run([*TERMCHAT, "ask", "--profile", "local", "hi"], capture_output=True, text=True, timeout=120, env={**os.environ, "TERMCHAT_KEEP_ALIVE": value})
    assert result.returncode == 2 and "TERMCHAT_KEEP_ALIVE" in result.stderr and "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize("keep", ["NaN", "1e400", "Infinity", '"300"', "true", "-1"])
def test_a_state_file_with_an_impossible_keep_alive_is_not_an_engine(tmp_path, keep):
    path = tmp_path / "p.json"
    path.write_text(f'{{"base_url": "http://127.0.0.1:9/v1", "api_key": "k", "pid": {os.getpid()}, "started": "{proc.started_at(os.getpid())}", "model": "m", "log": "/l", "keep_alive": {keep}}}')
    assert state.read_record(path) is None
    assert registry.running_engines(tmp_path) == []


# ---- the watchdog's decisions, on state files alone (no engine) -------------------------------


def write_record(path, pid, started="1", keep_alive=60.0):
    state.write_record(path, state.EngineRecord("http://127.0.0.1:9/v1", "k", pid, started, "m", "/tmp/log", keep_alive=keep_alive))
    return path


def test_the_watchdog_keeps_a_leased_engine_and_ends_an_unused_one(tmp_path):
    engine_pid = 4_000_000  # above pid_max: no such process
    state_path = write_record(tmp_path / "p.json", engine_pid)
    dog = watchdog.Watchdog(tmp_path, keep_alive=10, pid=engine_pid)
    lease = state.take_lease(engine_pid, tmp_path)  # this test process uses it
    assert not dog.tick(now=dog.last_used + 100)
    state.drop_lease(lease)
    assert not dog.tick(now=dog.last_used + 5)  # unused, but not for keep_alive yet
    assert dog.tick(now=dog.last_used + 11) and not state_path.exists()


def test_a_lease_taken_as_the_engine_expires_keeps_it(tmp_path, monkeypatch):
    engine_pid = 4_000_000
    state_path = write_record(tmp_path / "p.json", engine_pid)
    dog = watchdog.Watchdog(tmp_path, keep_alive=1, pid=engine_pid)
    looks = iter([[], [1234]])  # no lease; then, once the state file is aside, one
    monkeypatch.setattr(state, "live_leases", lambda *args: next(looks))
    assert not dog.tick(now=dog.last_used + 5)
    assert state_path.exists() and not state_path.with_suffix(".expiring").exists()


def test_a_lease_of_a_dead_or_recycled_process_holds_nothing(tmp_path):
    engine_pid = 4_000_000
    where = state.lease_dir(engine_pid, tmp_path)
    where.mkdir(parents=True)
    (where / "4000001.aa").write_text("123")  # no such process
    (where / f"{os.getpid()}.bb").write_text("1")  # this pid, but another start time
    mine = state.take_lease(engine_pid, tmp_path)
    assert state.live_leases(engine_pid, tmp_path) == [os.getpid()]
    assert sorted(p.name for p in where.iterdir()) == [mine.name]
    assert oct(where.stat().st_mode & 0o777) == "0o700" and oct(mine.stat().st_mode & 0o777) == "0o600"


def test_idle_warm_engines_make_room_longest_idle_first_and_in_use_ones_stay(monkeypatch, tmp_path):
    gb = 2**30

    def engine(name, idle, users=0, keep=300.0):
        return registry.WarmEngine(name, "m", "plain", 1, 1, 3 * gb, users, idle, keep, tmp_path / f"{name}.json")

    engines = [engine("recent", 10), engine("oldest", 900), engine("in-use", 0, users=1), engine("served", 5000, keep=None), engine("older", 500)]
    ended = []
    monkeypatch.setattr(registry, "running_engines", lambda *a: [e for e in engines if e not in ended])
    monkeypatch.setattr(registry, "stop_engine", ended.append)
    monkeypatch.setattr(proc, "memory_available", lambda: 9 * gb)  # 15 GB used by the five, 24 in all
    # budget: half of 24 GB = 12; the five (15) and a new one (3) need 18: two must go
    assert [e.profile for e in registry.make_room()] == ["oldest", "older"]
    ended.clear()
    monkeypatch.setattr(proc, "memory_available", lambda: 30 * gb)
    assert registry.make_room() == []  # room enough: nothing ends


def test_proc_stat_fields_survive_a_command_name_with_parentheses_and_spaces(tmp_path):
    """A process may name itself anything: the fields are read after the last ')'."""
    odd = tmp_path / "a) S 1 (b"
    shutil.copy("/bin/sleep", odd)
    child = subprocess.Popen([str(odd), "5"], start_new_session=True)
    try:
        fields = proc.stat_fields(child.pid)
        assert fields[1] == str(os.getpid()) and fields[2] == str(child.pid)  # parent, process group
        assert child.pid in group_members(child.pid) and proc.started_at(child.pid)
    finally:
        child.kill()
        child.wait()
    assert proc.stat_fields(child.pid) == [] and proc.started_at(child.pid) is None


# ---- the serve folder holds only what termchat wrote ------------------------------------------


def test_a_symlinked_lease_folder_is_removed_never_emptied(tmp_path):
    precious = tmp_path / "thesis"
    precious.mkdir()
    (precious / "notes.md").write_text("mine")
    serve = tmp_path / "serve"
    (serve / "leases").mkdir(parents=True)
    (serve / "leases" / "4000000").symlink_to(precious)
    assert state.live_leases(4_000_000, serve) == []
    state.remove_leases(4_000_000, serve)
    assert (precious / "notes.md").read_text() == "mine"
    assert not os.path.lexists(serve / "leases" / "4000000")
    lease = state.take_lease(4_000_001, serve)  # and taking a lease through one makes a real folder
    (serve / "leases" / "4000002").symlink_to(precious)
    lease2 = state.take_lease(4_000_002, serve)
    assert lease.parent.is_dir() and not lease2.parent.is_symlink() and sorted(p.name for p in precious.iterdir()) == ["notes.md"]


def test_folders_and_fifos_in_the_serve_folder_neither_crash_nor_hang(tmp_path):
    import threading

    serve = tmp_path / "serve"
    leases = serve / "leases" / "4000000"
    (leases / "1234.ab").mkdir(parents=True)  # a folder among the lease files
    os.mkfifo(serve / "x.json")  # a FIFO named like a state file
    (serve / "y.json").mkdir()  # a folder too
    done = []
    worker = threading.Thread(target=lambda: done.append((registry.running_engines(serve), state.live_leases(4_000_000, serve), watchdog.Watchdog(serve, 1, 4_000_000).tick())))
    worker.start()
    worker.join(10)
    assert done == [([], [], False)]


def test_a_state_file_is_written_whole_0600_and_never_through_a_symlink(tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text("not yours")
    linked = tmp_path / "serve" / "p.json"
    linked.parent.mkdir()
    linked.symlink_to(target)
    record = state.EngineRecord("http://127.0.0.1:9/v1", "secret-key", 4_000_000, "1", "m", "/l", keep_alive=60.0)
    state.write_record(linked, record)
    assert target.read_text() == "not yours" and not linked.is_symlink()
    assert oct(linked.stat().st_mode & 0o777) == "0o600" and state.read_record(linked) == record
    loose = tmp_path / "serve" / "q.json"
    loose.write_text("{}")
    loose.chmod(0o644)
    state.write_record(loose, record)
    assert oct(loose.stat().st_mode & 0o777) == "0o600"
    assert state.read_record(linked) is not None and state.read_record(target) is None  # a symlink is not read either
    (tmp_path / "serve" / "r.json").symlink_to(linked)
    assert state.read_record(tmp_path / "serve" / "r.json") is None


def test_a_recycled_pid_that_looks_like_an_engine_is_neither_waited_on_nor_signalled():
    """A state file whose pid now belongs to another process that looks like
    a vLLM server: stale (its start time differs), removed, and that process
    is left alone."""
    from termchat.profiles import builtin_profiles

    with server_lookalike(60) as other:
        profile = builtin_profiles()["local"].without_speculation()
        path = registry.state_file(profile.name)
        record = state.EngineRecord("http://127.0.0.1:9/v1", "k", other.pid, "1", profile.model, "/l", fingerprint=registry.fingerprint(profile), keep_alive=60.0)
        state.write_record(path, record)
        assert registry.find_served(profile, lease=True) is None
        assert not path.exists()
        time.sleep(0.5)
        assert other.poll() is None  # not signalled
