"""What /apply would change, as a coloured diff: written only on "y"."""

from __future__ import annotations

from pathlib import Path

from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.highlight import highlight
from termchat.ui.screens.modal import Modal
from textual.widgets import Label, Static

from termchat.coding.apply import Change, git_status
from termchat.sanitize import inert
from termchat.ui.text import plain


class ApplyDiff(Modal[bool]):
    CSS_PATH = "apply_diff.tcss"
    BINDINGS = [Binding("y,enter", "dismiss(True)", "Apply"), Binding("n,escape", "dismiss(False)", "Cancel")]

    def __init__(self, changes: list[Change], root: Path):
        super().__init__()
        self.changes, self.root = changes, root

    def compose(self):
        with Vertical():
            for change in self.changes:
                what = "new file" if change.old is None else "no change" if change.unchanged else "changes"
                status = git_status(change.path)
                yield Label(plain(f"{change.path} — {what}" + (f" · {status}" if status else "")), classes="file")
            with VerticalScroll():
                for change in self.changes:
                    yield Static(highlight(inert(change.diff(self.root)) or "(identical)", language="diff"), classes="diff")
            yield Label("y or Enter writes (atomically; /undo restores) · n or Escape cancels: nothing is written", classes="keys")
