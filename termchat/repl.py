"""`termchat chat --plain`: a line-mode REPL on prompt-toolkit.

For terminals or people who prefer a line interface (SSH, screen readers,
editors' terminals). Replies stream as plain text; code blocks are
highlighted line by line with pygments in ANSI; the statistics follow each
reply. Same store, slash commands and automatic code temperature as the TUI.
Ctrl+C cuts a reply (the partial text is kept); Ctrl+C twice at an empty
prompt, or Ctrl+D, exits.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from prompt_toolkit import PromptSession
from prompt_toolkit.history import FileHistory
from prompt_toolkit.key_binding import KeyBindings
from pygments import highlight
from pygments.formatters import Terminal256Formatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound

from termchat import paths
from termchat.attach import fenced_file
from termchat.conversation import Conversation, parse_temperature
from termchat.engine import server
from termchat.engine.client import ReplyInterrupted
from termchat.errors import UserError
from termchat.exchange import Recorder, exchange
from termchat.profiles import Config
from termchat.sanitize import Sanitizer, inert
from termchat.store import Store, StoreError

HELP = """Enter sends; Alt+Enter or Ctrl+J inserts a newline. Ctrl+C cuts a reply; Ctrl+C twice or Ctrl+D exits.
/profile NAME  switch profile      /temp X     temperature for the next message
/system TEXT   system prompt        /file PATH  attach a text file to the next message
/clear         new conversation     /restart    restart the engine      /help  this text"""

DIM, RESET = "\x1b[2m", "\x1b[0m"


class ReplyPrinter:
    """Writes a streamed reply: prose at once, code fences highlighted per line.

    Everything from the model is made inert first; only our own SGR colour
    codes reach the terminal."""

    def __init__(self, write: Callable[[str], None], color: bool = True, style: str = "monokai"):
        self.write, self.color = write, color
        self.formatter = Terminal256Formatter(style=style)
        self.pending = ""  # the current line's text not yet written
        self.clean = Sanitizer()
        self.in_fence = False
        self.lexer = TextLexer()

    def feed(self, text: str) -> None:
        self.pending += self.clean.feed(text)
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            self._line(line)
        if not self.in_fence and self.pending and not self.pending.lstrip().startswith(("`", "~")):
            self.write(self.pending)  # prose: show it as it comes
            self._partial = True
            self.pending = ""

    _partial = False

    def _line(self, line: str) -> None:
        marker = line.strip()
        if not self._partial and marker.startswith(("```", "~~~")):
            self.in_fence = not self.in_fence
            if self.in_fence:
                try:
                    self.lexer = get_lexer_by_name(marker[3:].strip() or "text")
                except ClassNotFound:
                    self.lexer = TextLexer()
            self.write((DIM + line + RESET if self.color else line) + "\n")
        elif self.in_fence and self.color:
            self.write(highlight(line, self.lexer, self.formatter).rstrip("\n") + "\n")
        else:
            self.write(line + "\n")
        self._partial = False

    def close(self) -> None:
        if self.pending:
            self.write(self.pending)
            self.pending = ""
        self.write("\n")


class Repl:
    def __init__(self, config: Config, profile: str | None = None, input=None, output=None, write: Callable[[str], None] | None = None, history_file: Path | None = None, store: Store | None = None, color: bool | None = None):
        self.config = config
        self.profile = config.get(profile)
        self.write = write or (lambda text: (sys.stdout.write(text), sys.stdout.flush()))
        self.color = sys.stdout.isatty() if color is None else color
        history_file = history_file or paths.data_dir() / "repl-history"
        paths.private_file(history_file)  # the prompts typed: 0600 in a 0700 folder
        keys = KeyBindings()

        @keys.add("enter")
        def _(event):
            event.current_buffer.validate_and_handle()

        @keys.add("escape", "enter")
        @keys.add("c-j")
        def _(event):
            event.current_buffer.insert_text("\n")

        self.session = PromptSession(history=FileHistory(str(history_file)), input=input, output=output, multiline=True, key_bindings=keys)
        self.store = store
        self.conversation = Conversation()
        self.recorder: Recorder | None = None
        self.engine: server.Engine | None = None

    def say(self, text: str) -> None:
        """termchat's own lines; they often quote a server error or a file name, so inert too."""
        text = inert(text)
        self.write((DIM + text + RESET if self.color else text) + "\n")

    # ---- engine ------------------------------------------------------------------------

    async def start_engine(self) -> bool:
        profile = self.profile
        def launched(engine: server.ManagedEngine) -> None:
            self.engine = engine  # so that Ctrl+C stops it while it warms up
            self.say(f"starting the engine for '{profile.name}' (about 30-45 s on a CPU)…")

        if server.plain_http_warning(profile):
            self.say(f"warning: {server.plain_http_warning(profile)}")
        try:
            self.engine = await server.open_engine_async(profile, launched=launched)
        except UserError as exc:
            self.say(f"the engine did not start: {exc}\n/restart tries again, /profile NAME picks another profile.")
            self.engine = None
            return False
        self.say(f"profile {profile.name}: {profile.model}" + (f" with {profile.method} k={profile.num_speculative_tokens}" if profile.speculative else "") + " — ready. /help for commands.")
        return True

    def stop_engine(self) -> None:
        if self.engine is not None:
            self.engine.stop()
            self.engine = None

    # ---- the loop ----------------------------------------------------------------------

    async def run(self) -> int:
        await self.start_engine()
        interrupts = 0
        try:
            while True:
                try:
                    text = await self.session.prompt_async(f"{self.profile.name}> ")
                except KeyboardInterrupt:
                    interrupts += 1
                    if interrupts >= 2:
                        return 0
                    self.say("(Ctrl+C again to exit)")
                    continue
                except EOFError:
                    return 0
                interrupts = 0
                text = text.strip()
                if not text:
                    continue
                if text.startswith("/"):
                    if await self.slash(text) == "quit":
                        return 0
                    continue
                await self.send(text)
        finally:
            self.stop_engine()

    async def send(self, text: str) -> None:
        if self.engine is None or not self.engine.alive():
            if not await self.start_engine():
                return
        text = self.conversation.with_attachments(text)
        if self.recorder is None:
            self.recorder = Recorder.start(self._store(), self.profile, self.conversation.system_prompt)
        choice = self.conversation.choose_temperature(text, self.profile)
        self.say(f"[{choice.label()}]")
        printer = ReplyPrinter(self.write, self.color)
        task = asyncio.ensure_future(exchange(self.engine, self.profile, self.conversation, text, choice, self.recorder, lambda step: printer.feed(step.text)))
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGINT, task.cancel)
            handler = True
        except (NotImplementedError, RuntimeError, ValueError):
            handler = False
        try:
            outcome = await task
            printer.close()
            self.say(outcome.stats.summary())
        except asyncio.CancelledError:
            printer.close()
            self.say("✂ cut: the partial reply is kept")
        except ReplyInterrupted as exc:
            printer.close()
            self.say(f"✗ {exc}\nThe partial reply is kept. Your next prompt restarts the engine (or type /restart).")
            self.engine = None
        except UserError as exc:
            printer.close()
            self.say(f"✗ {exc}")
        finally:
            if handler:
                loop.remove_signal_handler(signal.SIGINT)
        if self.recorder.error:
            self.say(str(self.recorder.error))
            self.recorder.error = None

    _store_failed = False

    def _store(self) -> Store | None:
        if self.store is None and not self._store_failed:
            try:
                self.store = Store()
            except StoreError as exc:
                self._store_failed = True
                self.say(f"{exc} Replies will not be saved this session.")
        return self.store

    async def slash(self, text: str) -> str | None:
        command, _, arg = text.partition(" ")
        arg = arg.strip()
        if command in ("/quit", "/exit"):
            return "quit"
        if command == "/help":
            self.say(HELP)
        elif command == "/profile":
            if arg not in self.config.profiles:
                self.say(f"profiles: {', '.join(self.config.profiles)}")
                return None
            self.stop_engine()
            self.profile = self.config.profiles[arg]
            await self.start_engine()
        elif command == "/restart":
            self.stop_engine()
            await self.start_engine()
        elif command == "/temp":
            try:
                value = parse_temperature(arg)
            except UserError as exc:
                self.say(str(exc))
                return None
            self.conversation.forced_temperature = value
            self.say(f"the next message uses temperature {value:g}")
        elif command == "/system":
            self.conversation.system_prompt = arg
            self.say("system prompt set" if arg else "system prompt back to the profile's")
        elif command == "/file":
            try:
                self.conversation.attachments.append(fenced_file(arg))
                self.say(f"attached {arg}; it goes with your next message")
            except UserError as exc:
                self.say(str(exc))
        elif command == "/clear":
            self.conversation = Conversation(auto_temperature=self.conversation.auto_temperature)
            self.recorder = None
            self.say("new conversation")
        else:
            self.say(f"unknown command {command}; /help lists them")
        return None


def run_repl(config: Config, profile: str | None) -> int:
    return asyncio.run(Repl(config, profile).run())
