"""The slash commands: one table for the TUI, the REPL and both help texts.

Each front-end implements one coroutine per command, named by `handler`
(`do_temp(arg)`...); `dispatch` finds the command and calls it, and a
UserError from it becomes one message in that front-end's own words.
`tests/test_commands.py` checks that every front-end has every handler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from termchat.errors import UserError

T = TypeVar("T")


@dataclass(frozen=True)
class Command:
    name: str  # "/apply"
    argument: str  # "[N] PATH": how the help writes what follows
    help: str  # one line
    aliases: tuple[str, ...] = ()

    @property
    def handler(self) -> str:
        return "do_" + self.name.removeprefix("/")

    @property
    def usage(self) -> str:
        return f"{self.name} {self.argument}".strip()


COMMANDS: tuple[Command, ...] = (
    Command("/profile", "[NAME]", "switch to another profile (stops the old engine first); no name: list them"),
    Command("/temp", "X", "use temperature X for the next message only"),
    Command("/set", "[KEY VALUE]", "change a sampling value for this session (repetition_penalty 1.1, top_k 40, stop \"###\"...); KEY off: the profile's; none: list them"),
    Command("/system", "[TEXT]", "set this conversation's system prompt (none: back to the profile's)"),
    Command("/file", "PATH", "attach a text file to the next message, in a fenced block"),
    Command("/apply", "[N] PATH", "write code block N (default: the last) to PATH: a diff first, written on confirmation; a patch is applied"),
    Command("/undo", "", "restore the file the last /apply changed (kept across restarts)"),
    Command("/cd", "[DIR]", "change the folder /run, /test, /apply and /file work in; no folder: show it"),
    Command("/run", "COMMAND", "run a shell command here; its output is shown, and sent only if you add it"),
    Command("/add", "", "add the last /run or /test output (trimmed, with the command and exit code) to your next message"),
    Command("/test", "[COMMAND]", "run the tests (the command, the profile's or project's, else pytest); on failure offer the summary"),
    Command("/fix", "[ROUNDS]", "send the last failure summary and ask for a fix; with ROUNDS, apply, test and repeat until green"),
    Command("/edit", "[N]", "edit your Nth message (default: the last) and resend: the conversation forks there, the old branch is kept"),
    Command("/clear", "", "start a new conversation"),
    Command("/restart", "", "stop and start this profile's engine"),
    Command("/help", "", "every key and command"),
    Command("/quit", "", "leave termchat", aliases=("/exit",)),
)
BY_NAME = {name: command for command in COMMANDS for name in (command.name, *command.aliases)}


def find(text: str) -> tuple[Command, str]:
    """The command a line names, and its argument; UserError if none."""
    word, _, arg = text.strip().partition(" ")
    command = BY_NAME.get(word.lower())
    if command is None:
        raise UserError(f"unknown command {word}; /help lists them")
    return command, arg.strip()


def code_block(blocks: list[T], number: int | None, what: str) -> T:
    """Block `number` (1-based; None: the last) of a conversation's code blocks, or a UserError."""
    if not blocks:
        raise UserError(f"no code block to {what} yet")
    if number is not None and not 1 <= number <= len(blocks):
        raise UserError(f"there are {len(blocks)} code blocks; give a number from 1 to {len(blocks)}")
    return blocks[(number or len(blocks)) - 1]


def apply_arguments(arg: str) -> tuple[int | None, str | None]:
    """`/apply [N] [PATH]`: the block number and the path, each None when not given."""
    words = arg.split(maxsplit=1)
    number = int(words.pop(0)) if words and words[0].isdigit() else None
    return number, words[0] if words else None


class SessionCommands:
    """The chat commands both front-ends carry out alike: each changes the chat
    session and says what it did. A front-end provides `session` (a
    ChatSession) and `say`; the folder and the files are coding's
    (coding/commands.py: /cd, /undo, /apply, /run, /test, /fix)."""

    async def do_temp(self, arg: str) -> None:
        self.say(self.session.set_temperature(arg))

    async def do_set(self, arg: str) -> None:
        self.say(self.session.set_knob(arg))

    async def do_system(self, arg: str) -> None:
        self.say(self.session.set_system(arg))

    async def do_file(self, arg: str) -> None:
        self.say(self.session.attach(arg))


async def dispatch(front, text: str) -> None:
    """Run a slash command on a front-end; its UserError goes to `front.error`."""
    try:
        command, arg = find(text)
        await getattr(front, command.handler)(arg)
    except UserError as exc:
        front.error(str(exc))


def help_rows() -> list[tuple[str, str]]:
    return [(c.usage, c.help) for c in COMMANDS]


def help_text() -> str:
    width = max(len(c.usage) for c in COMMANDS)
    return "\n".join(f"{c.usage:<{width}}  {c.help}" for c in COMMANDS)
