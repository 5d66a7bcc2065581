"""A command's output in the conversation (`/run`, `/test`): a collapsible
block of its own, never sent to the model unless the user adds it (Ctrl+O)."""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Collapsible, Log

from termchat.sanitize import inert
from termchat.coding.shell import CommandRun


class CommandOutput(Collapsible):
    def __init__(self, run: CommandRun, **kwargs):
        super().__init__(Log(max_lines=2000, auto_scroll=True), title=self._label(run, "running… (Escape stops it)"), collapsed=False, **kwargs)
        self.run = run

    @staticmethod
    def _label(run: CommandRun, state: str) -> Content:
        return Content(inert(f"$ {run.command}  —  {state}"))  # never markup

    def write(self, text: str) -> None:
        self.query_one(Log).write(text)  # already inert (CommandRun sanitizes)

    def finish(self, hint: str = "Ctrl+O adds it to your next message") -> None:
        self.title = self._label(self.run, f"{self.run.outcome()} · {hint}")
        self.add_class("failed" if self.run.exit_code else "passed")

    @property
    def text(self) -> str:
        return "\n".join(self.query_one(Log).lines)
