"""Control sequences from the model reach no terminal (the TUI, the REPL, ask)."""

from __future__ import annotations

import re

from termchat.cli import terminal_text
from termchat.repl import ReplyPrinter
from termchat.sanitize import inert
from termchat.ui.app import TermchatApp

from .conftest import streamed_view

# A stand-in reply (scripted, not from the engine) carrying what a hostile or
# broken model could print: OSC 52 clipboard write, colours, cursor moves,
# screen clear, a bell, a C1 CSI, a title change.
HOSTILE = [
    "Hello \x1b]52;c;cm0gLXJmIH4=\x07there",
    " \x1b[31mred\x1b[0m \x1b[2J\x1b[H",
    "\x07ding \x9b6n \x1b]0;owned\x1b\\ title\n",
    "```python\nprint('x')\x1b[1A\x1b[K\n```\n",
    "tab\tand ünïcödé ✓\n",
]
RAW = "".join(HOSTILE)


def test_inert_strips_every_sequence_and_keeps_text():
    clean = inert(RAW)
    assert "\x1b" not in clean and "\x07" not in clean and "\x9b" not in clean
    assert "Hello there" in clean and "red" in clean and "tab\tand ünïcödé ✓\n" in clean


def test_ask_makes_output_inert_on_a_terminal_and_passes_a_pipe_unchanged():
    assert terminal_text(RAW, is_terminal=False) == RAW
    assert "\x1b" not in terminal_text(RAW, is_terminal=True)


def test_repl_printer_emits_only_its_own_colour_codes():
    out: list[str] = []
    printer = ReplyPrinter(out.append, color=True)
    for piece in HOSTILE:
        printer.feed(piece)
    printer.close()
    text = "".join(out)
    sequences = re.findall(r"\x1b\[[0-9;]*[A-Za-z]|\x1b[^\[]", text)
    assert sequences and all(s.endswith("m") and s.startswith("\x1b[") for s in sequences), sequences
    assert "\x07" not in text and "]52;" not in text
    plain: list[str] = []
    printer = ReplyPrinter(plain.append, color=False)
    for piece in HOSTILE:
        printer.feed(piece)
    printer.close()
    assert "\x1b" not in "".join(plain) and "print('x')" in "".join(plain)


async def test_tui_shows_the_reply_inert():
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(100, 30)) as pilot:
        view = await streamed_view(app, HOSTILE)
        await pilot.pause()
        source = view.body.source
        assert "\x1b" not in source and "\x07" not in source and "Hello there" in source
        screen = app.export_screenshot()
        assert "]52;" not in screen and "\x07" not in screen
