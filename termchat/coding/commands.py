"""`/apply`, `/test` and `/fix`: one implementation for the TUI and the REPL.

What these commands decide (which command runs, what needs the user's yes,
what is written, when the fix loop goes on or stops) is written once here.
A front-end only shows things its own way, through these hooks:

- `say(text)`, `error(text)`, `warn(text)`: a line, an error, a warning;
- `code_blocks()`: every code block of the conversation, in order;
- `last_reply_blocks()`: the code blocks of the last reply;
- `await confirm(question, keys)`: a yes/no question (no is the default);
- `await review(changes)`: show the diffs and ask before writing;
- `shown(changes)`: show the diffs the fix loop writes without asking;
- `await run_shell(command, tests)`: run a command, its output streamed;
  the finished CommandRun, or None when it was replaced or cancelled;
- `await ask_reply(prompt)`: send a prompt; whether its reply came whole;
- `tests_passed(run)`, `tests_failed(run, summary)`: how a test run ended;
- `start(flow, loop)`: run a flow (`loop`: the fix loop, which ending the loop cancels): the REPL awaits it (a reply or a command runs in
  the foreground there), the TUI runs it as a worker (its screen must keep
  handling keys: Escape stops a command, a new conversation ends the loop).

Nothing is written or run without the user's say-so: `/apply` shows the
diff first; a test command or interpreter that came with the project runs
once approved; the fix loop writes on its own only for the rounds asked for.
"""

from __future__ import annotations

from collections.abc import Coroutine
from pathlib import Path

from termchat.coding import apply, project, project_tests
from termchat.coding.apply import Change, UndoStack
from termchat.coding.reply_code import CodeBlock
from termchat.coding.shell import CommandRun, change_folder
from termchat.errors import UserError
from termchat.slash import apply_arguments, code_block

APPROVE_KEYS = "y runs it · n, Enter or Escape: nothing runs"
STOP_KEYS = "y stops them · n, Enter or Escape: they keep running"


class CodingCommands:
    """The coding commands' state and flows; see the module's docstring for the hooks."""

    def init_coding(self) -> None:
        self.undo = UndoStack()
        self.last_run: CommandRun | None = None
        self.last_failure: tuple[str, str] | None = None  # (test command, failure summary)
        self.applied: list[Path] = []  # the files the last /apply wrote (where a fix goes)

    # ---- /cd, /undo ------------------------------------------------------------------------

    async def do_cd(self, arg: str) -> None:
        self.say(change_folder(arg))

    async def do_undo(self, arg: str) -> None:
        self.say(self.undo.undo())

    # ---- /apply ---------------------------------------------------------------------------

    async def do_apply(self, arg: str) -> None:
        number, path = apply_arguments(arg)
        await self.start(self.apply_flow(code_block(self.code_blocks(), number, "apply"), path))

    async def apply_flow(self, block: CodeBlock, path: str | None) -> None:
        try:
            changes = apply.plan(block.code, block.language, path, Path.cwd())
        except UserError as exc:
            return self.error(str(exc))
        if block.warning:
            self.warn(block.warning)
        if not await self.review(changes):
            return self.say("nothing written")
        self.write_changes(changes)

    def write_changes(self, changes: list[Change]) -> bool:
        try:
            self.say("applied: " + apply.write(changes, self.undo))
        except UserError as exc:
            self.error(str(exc))
            return False
        self.applied = [c.path for c in changes]
        return True

    # ---- /test ----------------------------------------------------------------------------

    async def do_test(self, arg: str) -> None:
        command, source = project_tests.resolve_test_command(arg, self.session.profile.test_command, Path.cwd())
        await self.start(self.test_flow(command, source))

    async def test_flow(self, command: str, source: Path | None = None) -> CommandRun | None:
        """Run the tests (a command that came with the project once approved);
        the finished run, or None when nothing ran to the end."""
        if source is not None and not project.approved(source, command):
            if not await self.confirm(project.approval_question(source, command), APPROVE_KEYS):
                self.say(f"nothing run; /test COMMAND runs a command you type, or edit {source.name}")
                return None
            try:
                project.approve(source, command)
            except OSError as exc:
                self.error(f"could not remember the approval ({exc.strerror or exc}); it will be asked again")
        run = await self.run_shell(command, tests=True)
        if run is None:
            return None
        if run.exit_code == 0 and not run.ended_by:
            fixed = self.last_failure is not None
            self.last_failure = None
            self.tests_passed(run, fixed)
        else:
            self.last_failure = (command, project_tests.failure_summary(run.output))
            self.tests_failed(run, self.last_failure[1])
        return run

    async def offer_to_stop(self, run: CommandRun) -> None:
        """Processes a command left running outside its group: stopped on the user's word."""
        if run.escaped and await self.confirm(run.stop_question(), STOP_KEYS):
            self.say(run.stop_escaped())
        elif run.escaped:
            self.say("they keep running")

    # ---- /fix -----------------------------------------------------------------------------

    async def do_fix(self, arg: str) -> None:
        """One request; with ROUNDS, the loop: fix, apply where the last /apply wrote, test."""
        if self.last_failure is None:
            raise UserError("no failing /test to fix; run /test first")
        await self.start(self.fix_flow(project_tests.fix_rounds(arg)), loop=True)

    async def fix_flow(self, rounds: int) -> None:
        for _ in range(max(rounds, 1)):
            command, summary = self.last_failure
            request = project_tests.fix_request(command, summary, project_tests.fix_files(self.applied, summary, Path.cwd()))
            if not await self.ask_reply(request) or not rounds:
                return
            blocks = self.last_reply_blocks()
            try:
                changes = project_tests.plan_fix([(b.language, b.code) for b in blocks], self.applied, Path.cwd())
            except UserError as exc:
                return self.error(str(exc))
            for warning in dict.fromkeys(b.warning for b in blocks if b.warning):
                self.warn(warning)
            self.shown(changes)
            if not self.write_changes(changes):
                return
            run = await self.test_flow(command)
            if run is None or run.ended_by == "stopped":
                return self.say("the fix loop stopped with the tests")
            if self.last_failure is None:
                return
        self.warn("the tests still fail after the rounds asked for; the changes stay (/undo restores them one by one)")

    # ---- the front-end's part -------------------------------------------------------------

    async def start(self, flow: Coroutine, loop: bool = False) -> None:  # pragma: no cover - each front-end has its own
        raise NotImplementedError
