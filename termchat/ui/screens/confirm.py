"""A yes/no question about something that came from elsewhere (a project's
test command): shown whole, answered "no" unless the user says "y"."""

from __future__ import annotations

from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Label

from termchat.ui.screens.modal import Modal
from termchat.ui.text import plain


class Confirm(Modal[bool]):
    BINDINGS = [Binding("y", "dismiss(True)", "Yes"), Binding("n,escape,enter", "dismiss(False)", "No")]
    CSS_PATH = "confirm.tcss"

    def __init__(self, question: str, keys: str = "y runs it · n, Enter or Escape: nothing runs"):
        super().__init__()
        self.question = question
        self.keys = keys

    def compose(self):
        with Vertical():
            yield Label(plain(self.question))
            yield Label(self.keys, classes="keys")
