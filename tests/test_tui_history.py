"""History in the TUI: resume on start, the history screen, export. No engine needed."""

from __future__ import annotations

import json

from textual.widgets import Input

from termchat.engine.stats import ReplyStats
from termchat.chat.store import CUT, Store
from termchat.ui.app import TermchatApp
from termchat.ui.screens.ask_text import AskText
from termchat.ui.screens.history import HistoryScreen
from termchat.ui.widgets.message import MessageView
from termchat.ui.widgets.status import StatusBar

from .conftest import wait_for


def seed(store: Store) -> tuple[int, int]:
    older = store.new_conversation("local")
    store.add_message(older, "user", "older question about rust lifetimes")
    store.add_message(older, "assistant", "older answer", profile="local", temperature=0.7)
    newer = store.new_conversation("local")
    store.add_message(newer, "user", "newest question")
    store.add_message(newer, "assistant", "partial ans", status=CUT, profile="local", temperature=0.0, stats=ReplyStats(output_tokens=3, prompt_tokens=40, decode_tokens_per_s=12.5))
    return older, newer


async def test_the_last_conversation_is_resumed_and_others_open_from_history(tmp_path):
    store = Store(tmp_path / "h.db")
    older, newer = seed(store)
    app = TermchatApp(start_engine=False, store=store)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: len(app.query(MessageView)) == 2, timeout=10, what="the resumed conversation")
        views = list(app.query(MessageView))
        assert [v.text for v in views] == ["newest question", "partial ans"]
        # the views are mounted a moment before their footers are filled
        await wait_for(pilot, lambda: "cut" in str(views[1].query_one(".footer").render()), timeout=10, what="the cut mark")
        last = app.session.conversation.messages[-1]
        assert (last["role"], last["content"]) == ("assistant", "partial ans")
        assert app.session.conversation_id == newer  # the next prompt continues it
        assert app.query_one(StatusBar).info.context_used == 43  # its context, from the stored stats

        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), timeout=10, what="history")
        await pilot.press(*"rust")
        await pilot.pause(0.2)
        await pilot.press("enter")
        await wait_for(pilot, lambda: [v.text for v in app.query(MessageView)] == ["older question about rust lifetimes", "older answer"], timeout=10, what="older conversation")
        assert app.session.conversation_id == older
        assert app.query_one(StatusBar).info.context_used is None  # no stats stored for it

        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: list(app.query(MessageView)) == [], timeout=10, what="new conversation")
        assert app.session.recorder is None


async def test_rename_delete_and_export_from_the_history_screen(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = Store(tmp_path / "h.db")
    older, newer = seed(store)
    app = TermchatApp(start_engine=False, store=store, resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), timeout=10, what="history")
        await pilot.press("ctrl+r")  # rename the highlighted (newest) conversation
        await wait_for(pilot, lambda: isinstance(app.screen, AskText) and isinstance(app.focused, Input), timeout=10, what="the rename question")
        await pilot.press("ctrl+a", "ctrl+k", *"renamed", "enter")
        await wait_for(pilot, lambda: store.conversation(newer).title == "renamed", timeout=10, what="renamed")
        await pilot.press("ctrl+d")  # asks first...
        await pilot.pause(0.2)
        assert len(store.conversations()) == 2
        await pilot.press("ctrl+d")  # ...then deletes
        await wait_for(pilot, lambda: [c.id for c in store.conversations()] == [older], timeout=10, what="deleted")
        await pilot.press("ctrl+j")  # export JSON: asks for a file name
        await wait_for(pilot, lambda: isinstance(app.screen, AskText) and isinstance(app.focused, Input), timeout=10, what="the file name question")
        await pilot.press("enter")
        await wait_for(pilot, lambda: (tmp_path / f"conversation-{older}.json").exists(), timeout=10, what="the export")
    data = json.loads((tmp_path / f"conversation-{older}.json").read_text())
    assert [m["content"] for m in data["messages"]] == ["older question about rust lifetimes", "older answer"]
