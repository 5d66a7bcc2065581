"""F1: every binding and slash command, generated from the app's own tables."""

from __future__ import annotations

from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

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
        lines = ["# termchat help", "", "## Keys", "", "| key | does |", "| --- | --- |"]
        lines += [f"| `{key}` | {text} |" for key, text in self.rows]
        lines += ["", "## Slash commands", "", "| command | does |", "| --- | --- |"]
        lines += [f"| `{cmd}` | {text} |" for cmd, text in SLASH_HELP.items()]
        lines += [
            "",
            "## The status bar",
            "",
            "Acceptance = accepted draft tokens / proposed. **Red** below 40%: speculation costs "
            "more than it gives. **Yellow** 40-60%: a moderate gain. **Green** 60% and above: a strong gain. "
            "`len` is the mean acceptance length (tokens per verification step). `T` is the temperature used; "
            "`↓code` means it was lowered because the prompt is about code.",
            "",
            "Escape closes this screen.",
        ]
        with VerticalScroll():
            yield Markdown("\n".join(lines))
