"""Command palette entries that change at run time: the chat's actions, one
per profile, one per code block (copy, save, apply) and the slash commands.

Profile names and code come from files and from the model: every entry is
shown as plain Content and its help is escaped (the palette would otherwise
read both as markup).
"""

from __future__ import annotations

from collections.abc import Callable

from textual.command import DiscoveryHit, Hit, Provider
from textual.content import Content
from textual.markup import escape

from termchat.slash import COMMANDS
from termchat.sanitize import inert


class TermchatCommands(Provider):
    """Built once per opening of the palette (the screen behind it cannot
    change while it is open), not once per keystroke."""

    _entries: list[tuple[str, str, Callable]] = []

    async def startup(self) -> None:
        self._entries = self.entries()

    def entries(self) -> list[tuple[str, str, Callable]]:
        chat = self.app.chat_screen
        entries = [
            ("Pick profile", "list the profiles and switch", chat.action_pick_profile),
            ("Regenerate the last reply", "ask again", chat.action_regenerate),
            ("Edit the last prompt", "the conversation branches there; the old branch is kept", chat.action_edit_last),
            ("New conversation", "clear the screen and the context", chat.action_new_conversation),
            ("History", "stored conversations and branches: open, rename, delete, export", chat.action_history),
            ("Cycle theme", "next termchat theme", self.app.action_cycle_theme),
            ("Toggle automatic code temperature", "lower T for code prompts, or not", chat.action_toggle_auto_temperature),
            ("Toggle draft tint", "highlight text from accepted drafts", chat.action_toggle_tint),
            ("Restart the engine", "stop and start the current profile's engine", chat.action_restart_engine),
            ("Add the last command's output", "to your next message", chat.action_add_output),
        ]
        for name, profile in self.app.config.profiles.items():
            method = profile.speculative.label() if profile.speculative else "no speculation"
            entries.append((f"Switch to profile {name}", f"{profile.model or profile.endpoint} · {method}", lambda n=name: chat.run_worker(chat.switch_profile(n), group="switch", exclusive=True)))
        for number, block in enumerate(chat.chat.code_blocks(), start=1):
            about = f"{block.language or 'code'}: {block.first_line()}"
            entries.append((f"Copy code block {number}", about, lambda i=number: chat.action_copy_code(i)))
            entries.append((f"Save code block {number}", about, lambda i=number: chat.action_save_code(i)))
            entries.append((f"Apply code block {number} to a file", about, lambda i=number: chat.action_apply_code(i)))
        for command in COMMANDS:
            entries.append((f"Type {command.usage}", command.help, lambda c=command: chat.type_command(c)))
        return entries

    async def discover(self):
        for name, help_text, callback in self._entries:
            yield DiscoveryHit(Content(inert(name)), callback, text=name, help=escape(inert(help_text)))

    async def search(self, query: str):
        matcher = self.matcher(query)
        for name, help_text, callback in self._entries:
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, Content(inert(name)), callback, text=name, help=escape(inert(help_text)))
