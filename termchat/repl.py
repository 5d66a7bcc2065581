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
from prompt_toolkit.history import FileHistory, InMemoryHistory
from prompt_toolkit.input import Input, create_input
from prompt_toolkit.key_binding.key_processor import KeyPress
from prompt_toolkit.keys import Keys
from prompt_toolkit.key_binding import KeyBindings
from pygments import highlight
from pygments.formatters import Terminal256Formatter
from pygments.lexers import TextLexer, get_lexer_by_name
from pygments.util import ClassNotFound

from termchat.coding import apply
from termchat.coding.commands import STOP_KEYS, CodingCommands

from termchat import paths
from termchat.slash import SessionCommands, dispatch, help_text
from termchat.engine.client import ReplyInterrupted
from termchat.engine.controller import EngineController
from termchat.profiles.advisor import plain_http_warning
from termchat.errors import UserError
from termchat.profiles import Config
from termchat.coding.reply_code import CodeBlock, code_blocks
from termchat.sanitize import Sanitizer, inert, one_line
from termchat.chat.session import ChatSession
from termchat.coding.shell import CommandRun
from termchat.chat.store import Store

DIM, RESET = "\x1b[2m", "\x1b[0m"
HISTORY_LIMIT = 64 << 20  # a repl-history bigger than this is not read at start


class PasteInput(Input):
    """The terminal's input, with every run of printable characters that
    arrives in one read handed on as one bracketed paste. A terminal without
    bracketed paste (or a pipe) delivers a paste key by key, and prompt_toolkit
    looks up the key bindings for each, walking the whole layout twice: 50,000
    characters took 11.7 s. The text that lands is the same; control keys,
    Enter included, still arrive one by one."""

    RUN = 32  # shorter runs are typing: left as keys

    def __init__(self, inner: Input):
        self.inner = inner

    def _coalesced(self, keys: list[KeyPress]) -> list[KeyPress]:
        out: list[KeyPress] = []
        run: list[KeyPress] = []

        def flush() -> None:
            if len(run) >= self.RUN:
                out.append(KeyPress(Keys.BracketedPaste, "".join(k.data for k in run)))
            else:
                out.extend(run)
            run.clear()

        for key in keys:
            if not isinstance(key.key, Keys) and len(key.data) == 1 and key.data.isprintable():
                run.append(key)
            else:
                flush()
                out.append(key)
        flush()
        return out

    def read_keys(self) -> list[KeyPress]:
        return self._coalesced(self.inner.read_keys())

    def flush_keys(self) -> list[KeyPress]:
        return self._coalesced(self.inner.flush_keys())

    @property
    def closed(self) -> bool:
        return self.inner.closed

    def fileno(self) -> int:
        return self.inner.fileno()

    def typeahead_hash(self) -> str:
        return self.inner.typeahead_hash()

    def raw_mode(self):
        return self.inner.raw_mode()

    def cooked_mode(self):
        return self.inner.cooked_mode()

    def attach(self, input_ready_callback):
        return self.inner.attach(input_ready_callback)

    def detach(self):
        return self.inner.detach()

    def close(self) -> None:
        self.inner.close()


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


class Repl(SessionCommands, CodingCommands):
    """The line front-end: the same session, engine controller and slash
    commands as the TUI, shown as lines."""

    def __init__(self, config: Config, profile: str | None = None, input=None, output=None, write: Callable[[str], None] | None = None, history_file: Path | None = None, store: Store | None = None, color: bool | None = None):
        self.write = write or (lambda text: (sys.stdout.write(text), sys.stdout.flush()))
        self.color = sys.stdout.isatty() if color is None else color
        history_file = history_file or paths.data_dir() / "repl-history"
        try:
            paths.private_file(history_file)  # the prompts typed: 0600 in a 0700 folder, never through a link
            if history_file.stat().st_size > HISTORY_LIMIT:
                raise OSError(f"{history_file} is over {HISTORY_LIMIT >> 20} MiB")
            history = FileHistory(str(history_file))
        except OSError as exc:
            history = InMemoryHistory()
            self.write(f"termchat: the prompts of this session are not kept ({one_line(str(exc), 200)})\n")
        keys = KeyBindings()

        @keys.add("enter")
        def _(event):
            event.current_buffer.validate_and_handle()

        @keys.add("escape", "enter")
        @keys.add("c-j")
        def _(event):
            event.current_buffer.insert_text("\n")

        self.prompt = PromptSession(history=history, input=PasteInput(input or create_input()), output=output, multiline=True, key_bindings=keys)
        self.session = ChatSession(config, config.get(profile), store)
        self.engines = EngineController()
        self.init_coding()
        self.fixing = False
        self.next_text = ""  # put in the prompt for editing (/edit)
        self.quitting = False

    def say(self, text: str) -> None:
        """termchat's own lines; they often quote a server error or a file name, so inert too."""
        text = inert(text)
        self.write((DIM + text + RESET if self.color else text) + "\n")

    error = say
    warn = say

    # ---- engine ------------------------------------------------------------------------

    async def start_engine(self, restart: bool = False) -> bool:
        profile = self.session.profile
        if plain_http_warning(profile):
            self.say(f"warning: {plain_http_warning(profile)}")
        if not profile.is_remote:
            self.say(f"starting the engine for '{profile.name}' (usually 10-30 s on a CPU; the first start of a profile on a machine also compiles it, 1-3 min)…")
        try:
            await self.engines.switch(profile, kill=restart)
        except UserError as exc:
            self.say(f"the engine did not start: {exc}\n/restart tries again, /profile NAME picks another profile.")
            return False
        method = f" with {profile.speculative.label()}" if profile.speculative else ""
        self.say(f"profile {profile.name}: {profile.model}{method} — ready. /help for commands.")
        return True

    # ---- the loop ----------------------------------------------------------------------

    async def run(self) -> int:
        await self.start_engine()
        interrupts = 0
        try:
            while not self.quitting:
                try:
                    text = await self.prompt.prompt_async(f"{self.session.profile.name}> ", default=self.next_text)
                except KeyboardInterrupt:
                    interrupts += 1
                    if interrupts >= 2:
                        return 0
                    self.say("(Ctrl+C again to exit)")
                    continue
                except EOFError:
                    return 0
                interrupts, self.next_text = 0, ""
                text = text.strip()
                if text.startswith("/"):
                    await dispatch(self, text)
                elif text:
                    await self.send(text)
            return 0
        finally:
            self.engines.stop_now()

    async def send(self, text: str) -> bool:
        """Send a prompt and print the reply; whether it came whole."""
        if not self.engines.ready or not self.engines.engine.alive():
            if not await self.start_engine():
                return False
        problem = self.session.open_store()
        if problem:
            self.say(problem)
        text, choice = self.session.prepare(text)
        reply = self.session.begin_reply(text, choice)
        recorder = reply.recorder
        self.say(f"[{choice.label()}]")
        printer = ReplyPrinter(self.write, self.color)
        outcome = await self._interruptible(reply.stream(self.engines.engine, self.session.profile, lambda step: printer.feed(step.text)))
        printer.close()
        if isinstance(outcome, BaseException):
            if isinstance(outcome, ReplyInterrupted):
                self.say(f"✗ {outcome}\nThe partial reply is kept. Your next prompt restarts the engine (or type /restart).")
                self.engines.mark_failed()
            elif isinstance(outcome, UserError):
                self.say(f"✗ {outcome}")
            else:
                self.say("✂ cut: the partial reply is kept")
        else:
            if outcome.looped:
                self.session.after_loop()
                self.say("⟳ stopped: the reply was repeating itself (kept, marked as cut); your next prompt gets a stronger guard against repeats")
            self.say(outcome.stats.summary())
        if recorder.error:
            self.say(str(recorder.error))
            recorder.error = None
        return not isinstance(outcome, BaseException)

    async def _interruptible(self, coroutine, on_interrupt=None):
        """Run `coroutine`; Ctrl+C cancels it. Its result, or the exception that ended it."""
        task = asyncio.ensure_future(coroutine)
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGINT, on_interrupt or task.cancel)
            handler = True
        except (NotImplementedError, RuntimeError, ValueError):
            handler = False
        try:
            return await task
        except (asyncio.CancelledError, UserError) as exc:
            return exc
        finally:
            if handler:
                loop.remove_signal_handler(signal.SIGINT)

    # ---- the slash commands (termchat.slash) ------------------------------------------

    async def do_profile(self, arg: str) -> None:
        if arg not in self.session.config.profiles:
            self.say(f"profiles: {', '.join(self.session.config.profiles)}")
            return
        self.session.profile = self.session.config.profiles[arg]
        await self.start_engine()

    async def do_restart(self, arg: str) -> None:
        await self.start_engine(restart=True)

    async def do_clear(self, arg: str) -> None:
        self.session.new_conversation()
        self.say("new conversation")

    async def do_help(self, arg: str) -> None:
        self.say("Enter sends; Alt+Enter or Ctrl+J inserts a newline. Ctrl+C cuts a reply or a command; Ctrl+C twice or Ctrl+D exits.\n" + help_text())

    async def do_quit(self, arg: str) -> None:
        self.quitting = True

    async def do_edit(self, arg: str) -> None:
        message = self.session.prompt_to_edit(arg)
        old = self.session.conversation_id
        branch = self.session.branch_at(message)
        self.next_text = message["content"]
        self.say(f"editing on a new branch (conversation {branch}); the old branch stays as conversation {old}" if branch else "editing; the reply after it is forgotten")

    def _code_blocks(self) -> list[CodeBlock]:
        replies = [m["content"] for m in self.session.conversation.messages if m["role"] == "assistant"]
        return [block for reply in replies for block in code_blocks(reply)]

    # ---- the coding commands' hooks (coding/commands.py) -------------------------------

    def code_blocks(self) -> list[CodeBlock]:
        return self._code_blocks()

    def last_reply_blocks(self) -> list[CodeBlock]:
        return code_blocks(self.session.conversation.messages[-1]["content"])

    async def start(self, flow, loop: bool = False) -> None:
        await flow  # in the foreground: nothing else can be typed meanwhile

    async def confirm(self, question: str, keys: str) -> bool:
        self.say(question)
        answer = await self.prompt.prompt_async("stop them? (y/N) " if keys == STOP_KEYS else "run it? (y/N) ", default="")
        return answer.strip().lower() in ("y", "yes")

    async def review(self, changes: list[apply.Change]) -> bool:
        self.shown(changes)
        answer = await self.prompt.prompt_async("write it? (y/N) ", default="")
        return answer.strip().lower() in ("y", "yes")

    def shown(self, changes: list[apply.Change]) -> None:
        for change in changes:
            self.write(inert(change.diff(Path.cwd())) or f"{change.path}: no change\n")
            status = apply.git_status(change.path)
            if status:
                self.say(f"{change.path.name}: {status}")

    async def run_shell(self, command: str, tests: bool) -> CommandRun:
        return await self._run(command)

    async def ask_reply(self, prompt: str) -> bool:
        return await self.send(prompt)

    def tests_passed(self, run: CommandRun, fixed: bool) -> None:
        self.say("tests pass" + (" after the fix" if fixed else ""))

    def tests_failed(self, run: CommandRun, summary: str) -> None:
        self.say(f"tests fail ({run.outcome()}). /fix sends this summary and asks for a fix (/fix 3: up to 3 rounds of fix, apply, test):\n{summary}")

    async def do_run(self, arg: str) -> None:
        if not arg:
            raise UserError("/run needs a command, e.g. /run ls -l")
        await self._run(arg)
        self.say(f"{self.last_run.outcome()}; /add sends the output with your next message")

    async def _run(self, command: str) -> CommandRun:
        run = self.last_run = CommandRun(command)
        self.say(f"$ {command}")  # what runs is always on screen first (the TUI's block title)

        async def stream() -> None:
            async for text in run.chunks():
                self.write(text)

        await self._interruptible(stream(), on_interrupt=run.stop)
        await self.offer_to_stop(run)
        return run

    async def do_add(self, arg: str) -> None:
        if self.last_run is None:
            raise UserError("no command output yet: /run COMMAND or /test first")
        self.session.conversation.attachments.append(self.last_run.for_model())
        self.say(f"the output of `{self.last_run.command}` goes with your next message")


def run_repl(config: Config, profile: str | None) -> int:
    return asyncio.run(Repl(config, profile).run())
