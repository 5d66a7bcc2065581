"""Conversations stay private and whole: file modes, bounded attachments, the
store under contention, exports that never clobber, literal search."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import stat
import threading
import time
from pathlib import Path

import pytest

from termchat import cli, paths
from termchat.coding.attach import fenced_file
from termchat.engine import process, registry
from termchat.errors import UserError
from termchat.engine.stats import ReplyStats
from termchat.profiles import builtin_profiles
from termchat.repl import Repl
from termchat.chat.reply import ReplyWriter
from termchat.chat.store import COMPLETE, MIGRATIONS, Store

from .conftest import wait_for


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_database_its_wal_and_shm_and_its_folder_are_private(tmp_path):
    folder = tmp_path / "data"
    store = Store(folder / "termchat.db")
    conv = store.new_conversation("local")
    store.add_message(conv, "user", "a secret")
    assert mode(folder) == 0o700
    for name in ("termchat.db", "termchat.db-wal", "termchat.db-shm"):
        assert (folder / name).exists() and mode(folder / name) == 0o600, name


def test_an_existing_world_readable_database_is_tightened(tmp_path):
    folder = tmp_path / "old"
    folder.mkdir(mode=0o755)
    sqlite3.connect(folder / "termchat.db").close()
    (folder / "termchat.db").chmod(0o644)
    Store(folder / "termchat.db").close()
    assert mode(folder) == 0o700 and mode(folder / "termchat.db") == 0o600


def test_the_repl_history_file_is_private(tmp_path):
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    history = tmp_path / "state" / "repl-history"
    with create_pipe_input() as pipe:
        Repl(builtin_profiles_config(), input=pipe, output=DummyOutput(), history_file=history, write=lambda text: None, store=None, color=False)
    assert mode(history) == 0o600 and mode(history.parent) == 0o700


def builtin_profiles_config():
    from termchat.profiles import Config

    return Config(builtin_profiles())


def test_engine_logs_are_pruned_to_the_last_few_per_profile(tmp_path):
    for number in range(8):
        log = tmp_path / f"engine-local-20261130-0000{number:02d}-1000{number}.log"
        log.write_text("x")
        os.utime(log, (number, number))
    (tmp_path / "engine-local-draft-20261130-000000-1.log").write_text("another profile's")
    process.prune_logs(tmp_path, "local")
    kept = sorted(p.name for p in tmp_path.glob("engine-local-2*.log"))
    assert len(kept) == process.KEEP_LOGS - 1 and kept[-1].endswith("10007.log")  # room for the new one
    assert (tmp_path / "engine-local-draft-20261130-000000-1.log").exists()


@pytest.mark.engine
def test_the_shared_engine_log_is_private(shared_engine):
    assert mode(shared_engine.log_path) == 0o600 and mode(shared_engine.log_path.parent) == 0o700


# ---- /file ------------------------------------------------------------------------------


def test_file_refuses_devices_and_fifos_without_reading_or_blocking(tmp_path):
    with pytest.raises(UserError, match="not a regular file"):
        fenced_file("/dev/zero")
    with pytest.raises(UserError, match="not a regular file"):
        fenced_file("/dev/urandom")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    outcome: list[str] = []

    def attach() -> None:
        try:
            fenced_file(str(fifo))
        except UserError as exc:
            outcome.append(str(exc))

    worker = threading.Thread(target=attach, daemon=True)
    worker.start()
    worker.join(5)
    assert not worker.is_alive(), "attaching a FIFO blocked"
    assert outcome and "not a regular file" in outcome[0]


def test_file_refuses_a_file_over_the_limit_and_reads_a_small_one(tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("x" * 300_000)
    with pytest.raises(UserError, match="over the 256 KiB limit"):
        fenced_file(str(big))
    small = tmp_path / "ok.py"
    small.write_text("print('hi')\n")
    block, notice = fenced_file(str(small))
    assert "```python\nprint('hi')\n```" in block and notice == ""
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"caf\xe9\n")  # not UTF-8: attached with U+FFFD, and said so
    block, notice = fenced_file(str(latin))
    assert "caf\ufffd" in block and "not valid UTF-8" in notice


# ---- the store under contention ------------------------------------------------------------


def _open(path: str, barrier) -> None:
    barrier.wait()
    Store(Path(path), timeout=10).close()


def test_two_processes_opening_a_fresh_database_at_once_both_succeed(tmp_path):
    context = multiprocessing.get_context("spawn")
    for round_ in range(6):
        path = tmp_path / f"fresh-{round_}.db"
        barrier = context.Barrier(3)
        workers = [context.Process(target=_open, args=(str(path), barrier)) for _ in range(3)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
        assert [w.exitcode for w in workers] == [0, 0, 0], f"round {round_}"
        assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)


def test_a_lock_held_while_a_reply_streams_loses_nothing(tmp_path):
    path = tmp_path / "locked.db"
    store = Store(path)
    conv = store.new_conversation("local")
    writer = ReplyWriter(store, conv, interval=0.1, profile="local")
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN EXCLUSIVE")  # another process holds the write lock for ~2 s
    release = threading.Timer(2.0, lambda: other.execute("COMMIT"))
    release.start()
    started = time.monotonic()
    pieces = [f"token{i} " for i in range(230)]
    for piece in pieces:
        writer.append(piece)
        time.sleep(0.01)
    streaming_took = time.monotonic() - started
    writer.finish(COMPLETE, ReplyStats(output_tokens=230))
    release.join()
    message = store.messages(conv)[-1]
    assert message.content == "".join(pieces) and message.status == COMPLETE
    assert writer.error is None
    assert streaming_took < 6  # each write waited at most a moment: the screen did not freeze


# ---- export and search --------------------------------------------------------------------


def test_export_never_overwrites_without_force_and_reports_errors_in_one_line(tmp_path, capsys):
    store = Store()
    conv = store.new_conversation("local")
    store.add_message(conv, "user", "export me")
    target = tmp_path / "out.md"
    target.write_text("precious")
    assert cli.main(["history", "export", str(conv), "-o", str(target)]) == 2
    assert target.read_text() == "precious" and "exists" in capsys.readouterr().err
    assert cli.main(["history", "export", str(conv), "-o", str(target), "--force"]) == 0
    capsys.readouterr()
    assert "export me" in target.read_text() and mode(target) == 0o600
    for bad, words in ((tmp_path / "missing" / "x.md", "does not exist"), (tmp_path, "is a folder")):
        assert cli.main(["history", "export", str(conv), "-o", str(bad)]) == 2
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_history_search_takes_percent_and_underscore_literally(tmp_path):
    store = Store(tmp_path / "s.db")
    hit, miss = store.new_conversation("local"), store.new_conversation("local")
    store.add_message(hit, "user", "what is 100% of x_1?")
    store.add_message(miss, "user", "what is 1000 of xy1?")
    assert [c.id for c in store.conversations(search="100%")] == [hit]
    assert [c.id for c in store.conversations(search="x_1")] == [hit]


# ---- the serve state file ------------------------------------------------------------------


@pytest.mark.parametrize("content", ["", "{not json", "[]", '{"pid": 1}', None])
def test_a_damaged_or_foreign_serve_state_file_is_ignored(content):
    profile = builtin_profiles()["local"].without_speculation()  # a name no test serves
    state = paths.state_dir() / "serve" / f"{profile.name}.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    if content is None:  # well formed, but the pid is a live process that is not a vLLM server
        content = f'{{"base_url": "http://127.0.0.1:9/v1", "api_key": "k", "pid": {os.getpid()}, "model": "m", "log": "/tmp/x"}}'
    state.write_text(content)
    assert registry.find_served(profile) is None
    assert not state.exists()


async def test_the_tui_asks_before_overwriting_an_export(tmp_path):
    from textual.widgets import Input

    from termchat.ui.app import TermchatApp
    from termchat.ui.screens.ask_text import AskText

    store = Store()
    conv = store.new_conversation("local")
    store.add_message(conv, "user", "tui export")
    target = tmp_path / "kept.md"
    target.write_text("precious")
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        for answer in ("n", "y"):
            app.chat_screen.export(conv, "md")
            await wait_for(pilot, lambda: isinstance(app.screen, AskText) and isinstance(app.focused, Input), timeout=10, what="the file name question")
            app.screen.query_one("Input").value = str(target)
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, AskText) and "Overwrite" in app.screen.question, timeout=10, what="overwrite question")
            app.screen.query_one("Input").value = answer
            await pilot.press("enter")
            await pilot.pause(0.2)
            if answer == "n":
                assert target.read_text() == "precious"
        await wait_for(pilot, lambda: "tui export" in target.read_text(), timeout=10, what="the overwrite")
