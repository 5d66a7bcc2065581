"""The conversation list with its branches: search, open, rename, delete, export."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable

from textual.binding import Binding
from textual.containers import Vertical
from termchat.ui.screens.modal import Modal
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from termchat.errors import UserError
from termchat.chat.store import ConversationRecord, Store, day
from termchat.ui.text import plain


def in_branch_order(records: list[ConversationRecord]) -> list[tuple[ConversationRecord, int]]:
    """Each conversation followed by its branches (indented by depth), newest first at each level."""
    listed = {r.id for r in records}
    children: dict[int, list[ConversationRecord]] = defaultdict(list)
    for r in records:
        if r.parent_id in listed:
            children[r.parent_id].append(r)
    ordered: list[tuple[ConversationRecord, int]] = []

    def walk(record: ConversationRecord, depth: int) -> None:
        ordered.append((record, depth))
        for child in children[record.id]:
            walk(child, depth + 1)

    for r in records:
        if r.parent_id not in listed:
            walk(r, 0)
    return ordered


class HistoryScreen(Modal[tuple[str, int] | None]):
    """Dismisses with (action, conversation id): open, export-md, export-json."""

    BINDINGS = [
        Binding("escape", "dismiss(None)", "Close"),
        # priority: the search Input would take Ctrl+D (delete right) otherwise
        Binding("ctrl+r", "rename", "Rename", priority=True),
        Binding("ctrl+d", "delete", "Delete", priority=True),
        Binding("ctrl+x", "export('md')", "Export Markdown", priority=True),
        Binding("ctrl+j", "export('json')", "Export JSON", priority=True),
    ]
    CSS_PATH = "history.tcss"

    def __init__(self, store: Store, current: int | None = None, deleting: Callable[[int], Awaitable[None]] | None = None):
        super().__init__()
        self.store = store
        self.current = current  # the conversation on screen, marked ●
        self.deleting = deleting  # awaited before the conversation on screen is deleted
        self.pending_delete: int | None = None

    def compose(self):
        with Vertical():
            yield Label("Conversations, newest first, each with its branches (↳: an edited message started it). Type to search; Enter opens; Ctrl+R renames; Ctrl+D deletes; Ctrl+X / Ctrl+J export Markdown / JSON; Escape closes.")
            yield Input(placeholder="search titles and messages")
            yield OptionList()

    def on_mount(self) -> None:
        self.refresh_list()
        self.query_one(Input).focus()

    def refresh_list(self, search: str = "") -> None:
        options = self.query_one(OptionList)
        options.clear_options()
        for c, depth in in_branch_order(self.store.conversations(search=search)):
            when = day(c.updated)
            branch = "  " * (depth - 1) + "↳ " if depth else ""
            mark = "● " if c.id == self.current else ""
            options.add_option(Option(plain(f"{when}  {c.profile:<14.14} {branch}{mark}{c.title}"), id=str(c.id)))
        if options.option_count:
            options.highlighted = 0

    def on_input_changed(self, event: Input.Changed) -> None:
        self.pending_delete = None
        self.refresh_list(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        selected = self._selected()
        if selected is not None:
            self.dismiss(("open", selected))

    def on_key(self, event) -> None:
        if event.key in ("down", "up") and self.query_one(Input).has_focus:
            options = self.query_one(OptionList)
            options.action_cursor_down() if event.key == "down" else options.action_cursor_up()
            event.stop()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(("open", int(event.option.id)))

    def _selected(self) -> int | None:
        options = self.query_one(OptionList)
        if options.highlighted is None or not options.option_count:
            return None
        return int(options.get_option_at_index(options.highlighted).id)

    def action_rename(self) -> None:
        from termchat.ui.screens.ask_text import AskText

        selected = self._selected()
        if selected is None:
            return

        def renamed(title: str | None) -> None:
            if title:
                try:
                    self.store.rename(selected, title)
                except UserError as exc:  # locked by another process, or gone
                    return self.notify(str(exc), severity="error", timeout=10)
                self.refresh_list(self.query_one(Input).value)

        self.app.push_screen(AskText("New title:", self.store.conversation(selected).title), renamed)

    async def action_delete(self) -> None:
        selected = self._selected()
        if selected is None:
            return
        try:
            title = self.store.conversation(selected).title
        except UserError as exc:
            return self.notify(str(exc), severity="error", timeout=10)
        if self.pending_delete != selected:
            self.pending_delete = selected
            self.notify(f"press Ctrl+D again to delete '{title}'", severity="warning")
            return
        self.pending_delete = None
        if self.deleting is not None:
            await self.deleting(selected)  # the one on screen: its reply ends and is stored first, the screen starts anew
        try:
            self.store.delete(selected)
        except UserError as exc:  # locked by another process: nothing was deleted
            return self.notify(str(exc), severity="error", timeout=10)
        self.notify("deleted")
        self.refresh_list(self.query_one(Input).value)

    def action_export(self, fmt: str) -> None:
        selected = self._selected()
        if selected is not None:
            self.dismiss((f"export-{fmt}", selected))
