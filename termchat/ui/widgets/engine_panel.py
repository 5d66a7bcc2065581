"""The engine panel: start-up progress with the log tail, or why the engine failed."""

from __future__ import annotations

from textual.containers import Vertical
from textual.widgets import Static

from termchat.sanitize import inert


class EnginePanel(Vertical):
    def compose(self):
        yield Static(id="engine-status", markup=False)
        yield Static(id="engine-log", markup=False)

    def show(self, title: str, body: str = "", failed: bool = False) -> None:
        self.display = True
        self.set_class(failed, "failed")
        self.query_one("#engine-status", Static).update(inert(title))
        self.query_one("#engine-log", Static).update(inert(body))
