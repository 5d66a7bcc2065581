"""The TUI driven through Textual's Pilot, on the session's real engine."""

from __future__ import annotations

import asyncio

import pytest

from termchat.engine.stats import ReplyStats
from termchat.profiles import parse_config
from termchat.ui.app import TermchatApp
from termchat.ui.screens.picker import ProfilePicker
from termchat.ui.widgets.message import MessageView
from termchat.ui.widgets.prompt import PromptArea
from termchat.ui.widgets.status import StatusBar

from .conftest import engine_profile, group_alive, wait_for

pytestmark = pytest.mark.engine

SWITCH_CONFIG = engine_profile("plain", description="the same model without speculation", max_model_len=2048, max_tokens=64)


async def type_and_send(pilot, text: str) -> None:
    pilot.app.query_one(PromptArea).focus()
    await pilot.press(*[c if c != " " else "space" for c in text])
    await pilot.press("enter")


async def ask(pilot, text: str) -> MessageView:
    """Send a prompt and wait for the whole reply; its view."""
    count = len(replies(pilot.app))
    await type_and_send(pilot, text)
    return await reply_ended(pilot, count + 1)


async def reply_ended(pilot, count: int, what: str = "reply") -> MessageView:
    """Wait for reply number `count` to end and for the screen to have taken its figures.

    The view gets them before the screen handles ReplyEnded, so waiting on the
    view alone races the status bar."""
    status = pilot.app.query_one(StatusBar)
    await wait_for(pilot, lambda: len(replies(pilot.app)) == count and replies(pilot.app)[-1].stats is not None, what=what)
    await wait_for(pilot, lambda: not status.info.live and status.info.reply is replies(pilot.app)[-1].stats, what=f"{what} end")
    return replies(pilot.app)[-1]


def replies(app) -> list[MessageView]:
    return [v for v in app.query(MessageView) if v.role == "assistant"]


async def ready(pilot):
    await wait_for(pilot, lambda: pilot.app.engine is not None and pilot.app.engine.state == "ready", what="engine ready")


async def test_prompt_streams_a_reply_and_the_status_bar_shows_speed_and_acceptance(shared_engine):
    app = TermchatApp(resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert app.engine.base_url == shared_engine.base_url  # attached to the shared engine
        view = await ask(pilot, "Say hello to my friend Ada.")  # "Say hello to Ada." reads as Ada, the language, to the topic probe (p=0.78)
        assert view.text.strip() and len(view.steps) > 1
        status = app.query_one(StatusBar)
        assert status.info.reply.decode_tokens_per_s and status.info.reply.decode_tokens_per_s > 0
        assert "tok/s" in status.text and "acc " in status.text and "%" in status.text
        assert status.info.history  # the sparkline got a point
        assert "T 0.7" in status.text and "↓code" not in status.text


async def test_code_prompt_lowers_the_temperature_and_says_why(shared_engine):
    app = TermchatApp(resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        view = await ask(pilot, "écris un test Jest pour la fonction add")
        assert "T=0 ↓code" in view._header and "jest" in view._header
        assert "↓code" in app.query_one(StatusBar).text
        assert view.stats.temperature == 0.0
        # F4 turns the behaviour off for the session
        await pilot.press("f4")
        await type_and_send(pilot, "refactor this function")
        await reply_ended(pilot, 2, "second reply")
        assert replies(app)[-1].stats.temperature == 0.7 and "auto off" in replies(app)[-1]._header


# Sampled and long, so the reply is still running when Escape lands. Not a
# count at T=0: the 135M model loops ("1234567890..."), suffix decoding then
# accepts 99% of its drafts and the 512 tokens stream in 1.6 s (measured: 315
# tok/s with `termchat ask --temperature 0`), often over before Escape. These
# stream at 36-63 tok/s; a reply that still ends first is asked again.
LONG_PROMPTS = (
    "Tell me a long story about a lighthouse keeper and a storm.",
    "Write a long letter to a friend about your travels.",
    "Describe, in detail, a long walk through an old city.",
)


async def test_escape_cancels_a_reply_and_keeps_the_partial_text(shared_engine):
    app = TermchatApp(resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        status = app.query_one(StatusBar)
        for prompt in LONG_PROMPTS:
            status.refresh_info(reply=ReplyStats(acceptance_rate=0.99, mean_acceptance_length=5.9))  # as if the previous reply had accepted nearly all
            count = len(replies(app)) + 1
            await type_and_send(pilot, prompt)
            await wait_for(pilot, lambda: len(replies(app)) == count and len(replies(app)[-1].steps) >= 5, what="first steps")
            await wait_for(pilot, lambda: status.info.live and status.info.reply.mean_acceptance_length is not None, timeout=10, what="live figures")
            # while streaming: this reply's own figures, from step sizes, marked as live (~)
            live = status.info.reply
            assert live.acceptance_rate != 0.99 and live.mean_acceptance_length != 5.9 and "len ~" in status.text
            await pilot.press("escape")
            view = await reply_ended(pilot, count, "the cut")
            if view.cut:
                break
        else:
            pytest.fail("every reply ended before Escape reached it")
        partial = view.text
        assert partial.strip()
        await pilot.pause(1.0)
        assert view.text == partial  # nothing more arrived after the cut
        footer = str(view.query_one(".footer").render())
        assert "cut" in footer and "tok/s" in footer  # the cut reply shows its own statistics
        assert view.stats.output_tokens == sum(len(s.token_ids) for s in view.steps)
        assert status.info.reply is view.stats and "live" not in status.text  # one ReplyStats, from the engine to the status bar
        assert "len ~" in status.text  # a cut reply's figures come from step sizes, and the bar says so
        last = app.session.conversation.messages[-1]
        assert (last["role"], last["content"]) == ("assistant", partial)


async def test_file_refuses_a_binary_file_with_a_message(shared_engine, tmp_path):
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\x00\x01\x02binary")
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await type_and_send(pilot, f"/file {binary}")
        await wait_for(pilot, lambda: any("is a binary file; only text files can be attached" in n.message for n in app._notifications), timeout=10, what="the binary file refused")
        assert app.session.conversation.attachments == []


async def test_switching_profile_stops_the_old_engine_and_shows_the_new_name(shared_engine):
    config, problems = parse_config(SWITCH_CONFIG, "switch.toml")
    assert not problems
    app = TermchatApp(config=config, profile="plain", resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        own = app.engine
        assert own.owned and group_alive(own.pid)
        assert app.query_one(StatusBar).info.profile.name == "plain"
        await type_and_send(pilot, "hi")
        await reply_ended(pilot, 1, "reply on plain")
        assert replies(app)[-1].stats.acceptance_rate is None  # no speculation on this profile
        # the picker: F2, then choose `local` (the first row)
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, ProfilePicker), timeout=10, what="picker")
        await pilot.press("home", "enter")
        await wait_for(pilot, lambda: app.profile.name == "local" and app.engine is not None and app.engine.state == "ready", what="switch")
        assert group_alive(own.pid) == []  # the old engine's processes are gone
        assert app.query_one(StatusBar).info.profile.name == "local"
        assert "local" in app.query_one(StatusBar).text
        assert replies(app)[0].text  # the conversation stays on screen
        await asyncio.sleep(0)


async def test_draft_tint_marks_the_text_from_accepted_drafts(shared_engine):
    app = TermchatApp(resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        view = await ask(pilot, "Repeat this code exactly: def add(a, b): return a + b; def sub(a, b): return a - b; def mul(a, b): return a * b")
        multi = [s for s in view.steps if len(s.token_ids) > 1]
        assert multi, "no step accepted a draft; the tint would have nothing to show"
        await pilot.press("f8")
        await wait_for(pilot, lambda: view.has_class("tinted"), timeout=30, what="tint")
        content = view.query_one(".tint").content
        tinted = "".join(content.plain[span.start:span.end] for span in content.spans)
        assert content.plain == "".join(s.text for s in view.steps)
        assert tinted and len(tinted) < len(content.plain)  # some text from drafts, not all
        # a tinted piece never includes a step's own last token
        assert all(app.chat_screen.token_text.get(s.token_ids[-1]) is not None for s in multi)
        await pilot.press("f8")
        await wait_for(pilot, lambda: not view.has_class("tinted"), timeout=10, what="tint off")
