"""termchat's modal screens (and command palette): dismissed once, and only from the top.

Textual's `dismiss` pops whatever screen is on top: a second Enter landing
while a picker or the command palette closes (found by the keyboard monkey),
or the dismissal of a screen that has another one over it, popped the wrong
screen, down to "ScreenStackError: Can't pop screen" and the app's end.
"""

from __future__ import annotations

from typing import TypeVar

from textual.await_complete import AwaitComplete
from textual.command import CommandList, CommandPalette
from textual.screen import ModalScreen

T = TypeVar("T")


class DismissOnce:
    _dismissed = False

    def dismiss(self, result=None) -> AwaitComplete:
        if self._dismissed or self.app.screen is not self:
            return AwaitComplete.nothing()
        self._dismissed = True
        return super().dismiss(result)


class Modal(DismissOnce, ModalScreen[T]):
    pass


class Palette(DismissOnce, CommandPalette):
    """Its search runs in a worker per keystroke; one still running as Enter
    dismissed the palette queried the removed list (NoMatches 'CommandList',
    the monkey once keys were typed one by one)."""

    def dismiss(self, result=None) -> AwaitComplete:
        self._cancel_gather_commands()
        return super().dismiss(result)

    def _watch__list_visible(self) -> None:
        if self.query(CommandList) and self.query("#--input"):
            super()._watch__list_visible()
