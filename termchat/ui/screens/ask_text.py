"""A one-line question (a file name to save to, a new name...)."""

from __future__ import annotations

from textual.binding import Binding
from textual.containers import Vertical
from termchat.ui.screens.modal import Modal
from textual.widgets import Input, Label

from termchat.ui.text import plain


class AskText(Modal[str | None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]
    CSS_PATH = "ask_text.tcss"

    def __init__(self, question: str, value: str = ""):
        super().__init__()
        self.question = question
        self.value = value

    def compose(self):
        with Vertical():
            yield Label(plain(self.question))
            yield Input(value=self.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)
