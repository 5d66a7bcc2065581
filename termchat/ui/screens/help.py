"""F1: every binding and slash command, generated from the app's own tables."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.binding import Binding
from textual.containers import VerticalScroll
from termchat.ui.screens.modal import Modal
from textual.widgets import Markdown, Static

from termchat.profiles.advisor import ACCEPTANCE_HIGH, ACCEPTANCE_LOW
from termchat.slash import help_rows



class HelpScreen(Modal):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]
    CSS_PATH = "help.tcss"

    def __init__(self, bindings: list[tuple[str, str]]):
        super().__init__()
        self.rows = bindings

    def compose(self):
        status = (
            "Acceptance = accepted draft tokens / proposed (`acc ~` while a reply streams: from step sizes). "
            f"For draft models, EAGLE and MTP it is coloured by the rules of thumb: **red** below {ACCEPTANCE_LOW:.0%} "
            f"(speculation costs more than it gives), **yellow** {ACCEPTANCE_LOW:.0%}-{ACCEPTANCE_HIGH:.0%} (a moderate gain), **green** from {ACCEPTANCE_HIGH:.0%}. "
            "ngram and suffix propose only where they find a match, so their rate is not comparable: "
            "`len` (mean acceptance length, tokens per verification step) is coloured instead, against what a "
            "step costs on this engine as `termchat bench` measured it. `T` is the temperature used; "
            "`↓code` means it was lowered because the prompt is about code."
        )
        with VerticalScroll():
            yield Markdown("# termchat help\n\n## Keys")
            yield Static(_table(self.rows), classes="keys")
            yield Markdown("## Slash commands")
            yield Static(_table(help_rows()), classes="keys")
            yield Markdown(f"## The status bar\n\n{status}\n\nEscape closes this screen.")


def _table(rows: list[tuple[str, str]]) -> Table:
    """One line per row: a compact two-column list (a Markdown table takes two lines a row)."""
    table = Table(box=None, show_header=False, padding=(0, 2, 0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for key, text in rows:
        table.add_row(Text(key), Text(text))  # Text: "[N]" in a usage is not markup
    return table
