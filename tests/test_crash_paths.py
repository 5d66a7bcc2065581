"""Crash paths closed at their cause: each gives one message, loses nothing,
and leaves the front-end running (issue: "nothing a user does breaks termchat").

Streams that only ping come from `standin.StandIn`, a scripted stand-in (not
vLLM): the real engine cannot be made to send only comments.
"""

from __future__ import annotations

import sqlite3
import stat
import time

import pytest
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from termchat.coding import apply

from termchat import cli, paths
from termchat.coding.attach import fenced_file
from termchat.slash import dispatch
from termchat.errors import UserError
from termchat.profiles import Config, builtin_profiles
from termchat.repl import Repl
from termchat.chat.session import ChatSession
from termchat.chat.store import Store, StoreError
from termchat.ui.app import TermchatApp
from termchat.ui.screens.history import HistoryScreen
from termchat.ui.widgets.message import MessageView
from termchat.ui.widgets.prompt import PromptArea
from textual.widgets._toast import Toast

from .conftest import wait_for
from .standin import StandIn


def notes(app) -> str:
    return "\n".join(n.message for n in app._notifications)


async def command(pilot, text: str) -> None:
    area = pilot.app.query_one(PromptArea)
    area.text = text
    area.focus()
    await pilot.press("enter")


# ---- /file on a folder ----------------------------------------------------------------------


def test_file_on_a_folder_or_a_special_file_is_one_message(tmp_path):
    # was: IsADirectoryError from os.fdopen (on Linux a folder opens), out of both front-ends
    with pytest.raises(UserError, match="is a folder"):
        fenced_file(str(tmp_path))
    with pytest.raises(UserError, match="not a regular file"):
        fenced_file("/dev/null")


async def test_file_on_a_folder_in_the_tui_and_the_repl_keeps_them_running(tmp_path):
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await command(pilot, f"/file {tmp_path}")
        await wait_for(pilot, lambda: "is a folder" in notes(app), timeout=10, what="the message")
        assert app.is_running and not app.session.conversation.attachments
    said: list[str] = []
    with create_pipe_input() as pipe:
        repl = Repl(Config(builtin_profiles()), input=pipe, output=DummyOutput(), history_file=tmp_path / "h", write=said.append, store=None, color=False)
        await dispatch(repl, "/file .")
    assert "is a folder" in "".join(said) and not repl.session.conversation.attachments


# ---- /undo never raises -----------------------------------------------------------------------


@pytest.fixture
def applied(tmp_path):
    undo = apply.UndoStack(tmp_path / "undo")
    target = tmp_path / "made.py"
    apply.write(apply.plan("x = 1\n", "python", str(target), tmp_path), undo)
    return undo, target


def test_undo_of_a_file_that_became_non_utf8_says_so_and_keeps_the_record(applied):
    undo, target = applied
    target.write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(UserError, match="changed after /apply.*the undo is kept"):
        undo.undo()
    assert target.read_bytes() == b"\xff\xfe not utf-8" and len(undo._entries()) == 1


def test_undo_of_a_created_file_that_is_now_a_folder_says_so(applied):
    undo, target = applied
    target.unlink()
    target.mkdir()
    with pytest.raises(UserError, match="no longer a regular file"):
        undo.undo()
    assert target.is_dir() and len(undo._entries()) == 1


@pytest.mark.parametrize("record", ["not json", "{}", "[{\"path\": 1}]", "[{\"path\": \"x\", \"old\": 5, \"mode\": 420, \"new_sha\": \"\"}]"])
def test_a_malformed_undo_record_is_dropped_with_one_message(applied, record):
    undo, target = applied
    undo._entries()[-1].write_text(record)
    with pytest.raises(UserError, match="could not be read.*dropped"):
        undo.undo()
    assert not undo._entries() and target.read_text() == "x = 1\n"


async def test_undo_in_the_tui_reports_instead_of_exiting(applied, tmp_path, monkeypatch):
    undo, target = applied
    target.write_bytes(b"\xff")
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        app.chat_screen.undo = undo
        await command(pilot, "/undo")
        await wait_for(pilot, lambda: "changed after /apply" in notes(app), timeout=10, what="the message")
        assert app.is_running


# ---- a database locked by another process -----------------------------------------------------


def seeded(tmp_path) -> tuple[Store, int]:
    store = Store(tmp_path / "h.db", timeout=0.2)
    conversation = store.new_conversation("local", title="kept whole")
    store.add_message(conversation, "user", "question")
    store.add_message(conversation, "assistant", "answer")
    return store, conversation


def lock(store: Store) -> sqlite3.Connection:
    other = sqlite3.connect(store.path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN EXCLUSIVE")
    return other


def test_regenerate_and_branch_under_a_lock_change_nothing(tmp_path):
    store, conversation = seeded(tmp_path)
    session = ChatSession(Config(builtin_profiles()), builtin_profiles()["local"], store)
    session.load(conversation)
    other = lock(store)
    with pytest.raises(StoreError, match="locked"):
        session.drop_last_exchange()
    assert [m["content"] for m in session.conversation.messages] == ["question", "answer"]  # the live one too
    with pytest.raises(StoreError, match="locked"):
        session.branch_at(session.conversation.prompts()[0])
    other.execute("ROLLBACK")
    assert [m.content for m in store.messages(conversation)] == ["question", "answer"]
    assert [c.id for c in store.conversations()] == [conversation]  # no half-made branch


async def test_deleting_or_regenerating_under_a_lock_in_the_tui_is_one_message(tmp_path):
    # was: an uncaught StoreError from the history screen and from Ctrl+R
    store, conversation = seeded(tmp_path)
    app = TermchatApp(start_engine=False, store=store)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: len(app.query(MessageView)) == 2, timeout=10, what="the conversation")
        other = lock(store)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: "locked" in notes(app), timeout=10, what="the regenerate refusal")
        assert [v.text for v in app.query(MessageView)] == ["question", "answer"]
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), timeout=10, what="history")
        app.notify("clear")  # so the next "locked" is the delete's
        app._notifications.clear()
        await pilot.press("ctrl+d", "ctrl+d")
        await wait_for(pilot, lambda: "locked" in notes(app), timeout=10, what="the delete refusal")
        other.execute("ROLLBACK")
        assert app.is_running and [c.title for c in store.conversations()] == ["kept whole"]


# ---- an endpoint that only pings --------------------------------------------------------------


def test_an_endpoint_that_only_sends_comments_is_declared_silent(tmp_path, capsys):
    # was: every ": ping" line restarted the first-token timer
    with StandIn("pings") as standin:
        config = tmp_path / "pings.toml"
        config.write_text(f'[profiles.standin]\nendpoint = "{standin.url}"\nmodel = "m"\nfirst_token_timeout = 1\n')
        started = time.monotonic()
        code = cli.main(["ask", "--config", str(config), "--profile", "standin", "hi"])
        took = time.monotonic() - started
    err = capsys.readouterr().err
    assert code == 2 and "no answer from the engine" in err and "first token" in err, err
    assert took < 4  # the stand-in pings for 5 s


# ---- private folders --------------------------------------------------------------------------


def test_the_whole_state_and_data_folders_are_private(tmp_path, monkeypatch):
    # was: state/ was 0755 with 0700 folders inside
    monkeypatch.setenv("TERMCHAT_HOME", str(tmp_path / "home"))
    paths.private_dir(paths.logs_dir())
    Store().close()
    for folder in (paths.state_dir(), paths.logs_dir(), paths.data_dir()):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    paths.state_dir().chmod(0o755)  # an older termchat left it open: tightened at the next use
    paths.private_dir(paths.state_dir() / "undo")
    assert stat.S_IMODE(paths.state_dir().stat().st_mode) == 0o700


# ---- notifications keep the prompt readable -----------------------------------------------------


async def test_notifications_do_not_cover_the_prompt():
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        for number in range(3):
            app.notify(f"working in /some/long/folder/name/{number}", timeout=30)
        await pilot.pause(0.5)
        toasts = list(app.screen.query(Toast))
        prompt = app.query_one(PromptArea).region
        assert toasts and all(toast.region.bottom <= prompt.y for toast in toasts), [t.region for t in toasts]
