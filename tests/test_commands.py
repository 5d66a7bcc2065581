"""One slash-command table: every front-end has every command, and both help texts list them."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from termchat.slash import COMMANDS, dispatch, find, help_rows, help_text
from termchat.errors import UserError
from termchat.repl import Repl
from termchat.ui.app import TermchatApp
from termchat.ui.screens.chat import ChatScreen
from termchat.ui.screens.help import HelpScreen


@pytest.mark.parametrize("front", [Repl, ChatScreen])
def test_every_front_end_implements_every_command(front):
    missing = [c.name for c in COMMANDS if not callable(getattr(front, c.handler, None))]
    assert missing == []


def test_commands_are_found_with_their_argument_and_aliases():
    command, arg = find("/apply 2 src/add.py")
    assert (command.name, arg) == ("/apply", "2 src/add.py")
    assert find("/exit")[0].name == "/quit"
    with pytest.raises(UserError, match="unknown command /nope; /help lists them"):
        find("/nope x")


async def test_a_command_error_reaches_the_front_end_as_one_message():
    class Front:
        errors: list[str] = []

        def error(self, text):
            self.errors.append(text)

        async def do_temp(self, arg):
            raise UserError("/temp takes a number from 0 to 2, e.g. /temp 0.3")

    front = Front()
    await dispatch(front, "/temp hot")
    await dispatch(front, "/bogus")
    assert front.errors == ["/temp takes a number from 0 to 2, e.g. /temp 0.3", "unknown command /bogus; /help lists them"]


def test_the_repl_help_lists_every_command():
    text = help_text()
    assert all(c.usage in text for c in COMMANDS)


async def test_the_tui_help_screen_lists_every_command():
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(120, 60)) as pilot:
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        console = Console(width=200, record=True, file=io.StringIO())
        for keys in app.screen.query(".keys"):
            console.print(keys.content)
        shown = console.export_text()
        for usage, _ in help_rows():
            assert usage in shown, usage
