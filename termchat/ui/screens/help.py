"""F1: every binding and slash command, generated from the app's own tables."""

from __future__ import annotations

from rich.table import Table
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown, Static

SLASH_HELP = {
    "/profile NAME": "switch to another profile (stops the old engine first)",
    "/temp X": "use temperature X for the next message only",
    "/system TEXT": "set the system prompt for this conversation",
    "/file PATH": "attach a text file to the next prompt, in a fenced block",
    "/clear": "start a new conversation",
    "/help": "this screen",
}


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 84; height: 90%; border: thick $primary; background: $surface; padding: 0 1; }
    """

    def __init__(self, bindings: list[tuple[str, str]]):
        super().__init__()
        self.rows = bindings

    def compose(self):
        status = (
            "Acceptance = accepted draft tokens / proposed (`acc ~` while a reply streams: from step sizes). "
            "For draft models, EAGLE and MTP it is coloured by the rules of thumb: **red** below 40% "
            "(speculation costs more than it gives), **yellow** 40-60% (a moderate gain), **green** from 60%. "
            "ngram and suffix propose only where they find a match, so their rate is not comparable: "
            "`len` (mean acceptance length, tokens per verification step) is coloured instead, against what a "
            "step costs on this engine as `termchat bench` measured it. `T` is the temperature used; "
            "`↓code` means it was lowered because the prompt is about code."
        )
        with VerticalScroll():
            yield Markdown("# termchat help\n\n## Keys")
            yield Static(_table(self.rows), classes="keys")
            yield Markdown("## Slash commands")
            yield Static(_table(list(SLASH_HELP.items())), classes="keys")
            yield Markdown(f"## The status bar\n\n{status}\n\nEscape closes this screen.")


def _table(rows: list[tuple[str, str]]) -> Table:
    """One line per row: a compact two-column list (a Markdown table takes two lines a row)."""
    table = Table(box=None, show_header=False, padding=(0, 2, 0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for key, text in rows:
        table.add_row(key, text)
    return table
