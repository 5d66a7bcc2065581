"""The chat screen's slash commands (one coroutine per row of `termchat.slash`)
and its actions on code blocks, commands, tests and branches.

Nothing is written or run without the user's say-so: `/apply` shows the diff
and writes on "y"; `/run` and `/test` run only what was typed (or the
project's test command); their output reaches the model only with Ctrl+O or
`/fix`; the fix loop runs by itself only for the rounds asked for.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual import work
from textual.worker import WorkerState

from termchat.chat.store import COMPLETE
from termchat.coding import apply
from termchat.coding.commands import CodingCommands
from termchat.slash import SessionCommands, code_block
from termchat.errors import UserError
from termchat.files import write_export
from termchat.coding.shell import CommandRun
from termchat.ui.screens.apply_diff import ApplyDiff
from termchat.ui.screens.ask_text import AskText
from termchat.ui.screens.confirm import Confirm
from termchat.ui.screens.history import HistoryScreen
from termchat.ui.screens.picker import ProfilePicker
from termchat.ui.widgets.chat_view import wait_for_worker
from termchat.ui.widgets.command_output import CommandOutput
from termchat.coding.reply_code import CodeBlock
from termchat.ui.widgets.prompt import PromptArea


class ChatCommands(SessionCommands, CodingCommands):
    def init_commands(self) -> None:
        self.init_coding()
        self.running: CommandRun | None = None

    # ---- the shared commands -------------------------------------------------------------

    async def do_profile(self, arg: str) -> None:
        if arg:
            await self.switch_profile(arg)
        else:
            self.action_pick_profile()

    async def do_clear(self, arg: str) -> None:
        await self.action_new_conversation()

    async def do_restart(self, arg: str) -> None:
        self.action_restart_engine()

    async def do_help(self, arg: str) -> None:
        self.app.action_help()

    async def do_quit(self, arg: str) -> None:
        await self.app.action_quit()

    # ---- code blocks ----------------------------------------------------------------------

    def block(self, number: int | None, what: str) -> CodeBlock:
        return code_block(self.chat.code_blocks(), number, what)

    def action_copy_code(self, number: int | None = None) -> None:
        try:
            block = self.block(number, "copy")
        except UserError as exc:
            return self.say(str(exc))
        self.app.copy_to_clipboard(block.code)
        self.say(f"copied {len(block.code.splitlines())} lines of {block.language or 'code'} to the clipboard")
        if block.warning:
            self.notify(block.warning, severity="warning", timeout=15)

    def action_save_code(self, number: int | None = None) -> None:
        try:
            block = self.block(number, "save")
        except UserError as exc:
            return self.say(str(exc))

        def save(name: str | None) -> None:
            if not name:
                return
            path = Path(name).expanduser()
            if path.exists():
                return self.error(f"{path} exists; choose another name (or /apply {name} to change it, with a diff)")
            try:
                path.write_text(block.code)
            except OSError as exc:
                return self.error(f"could not save {path}: {exc.strerror}")
            self.say(f"saved {len(block.code.splitlines())} lines to {path}")

        self.app.push_screen(AskText("Save the code block to file:", f"snippet.{block.extension}"), save)

    def action_apply_code(self, number: int | None = None) -> None:
        try:
            block = self.block(number, "apply")
        except UserError as exc:
            return self.say(str(exc))
        if apply.is_patch(block.code, block.language):
            self.run_worker(self.apply_flow(block, None))
            return
        guess = str(self.applied[0]) if len(self.applied) == 1 else ""
        self.app.push_screen(AskText("Apply the code block to file (a diff is shown first):", guess), lambda path: path and self.run_worker(self.apply_flow(block, path)))

    # ---- the coding commands' hooks (coding/commands.py) -------------------------------

    def code_blocks(self) -> list[CodeBlock]:
        return self.chat.code_blocks()

    def last_reply_blocks(self) -> list[CodeBlock]:
        replies = self.chat.replies()
        return replies[-1].code_blocks() if replies else []

    def warn(self, text: str) -> None:
        self.notify(text, severity="warning", timeout=15)

    async def start(self, flow, loop: bool = False) -> None:
        """A flow runs as a worker: the screen keeps handling keys meanwhile.
        The fix loop's is in the group `fix`, which ending the loop cancels."""
        self.run_worker(flow, group="fix" if loop else "coding", exclusive=loop)

    async def confirm(self, question: str, keys: str) -> bool:
        return bool(await self.app.push_screen_wait(Confirm(question, keys)))

    async def review(self, changes: list[apply.Change]) -> bool:
        return bool(await self.app.push_screen_wait(ApplyDiff(changes, Path.cwd())))

    def shown(self, changes: list[apply.Change]) -> None:
        pass  # the loop's writes are named in the "applied:" line; /undo restores them

    async def run_shell(self, command: str, tests: bool) -> CommandRun | None:
        worker = self.run_command(command, tests=tests)
        await wait_for_worker(worker)
        return worker.result if worker.state == WorkerState.SUCCESS else None

    async def ask_reply(self, prompt: str) -> bool:
        """Send `prompt` and wait until its reply has ended; whether it came whole."""
        before = self.chat.current
        await self.send(prompt)
        while self.chat.current is before and self.pending is not None:  # waiting for the engine
            await asyncio.sleep(0.05)
        if self.chat.current is before:  # refused, or withdrawn while waiting
            return False
        reply = self.chat.current[1]
        while not reply.ended:
            await asyncio.sleep(0.05)
        return reply.status == COMPLETE

    def tests_passed(self, run: CommandRun, fixed: bool) -> None:
        self.say("tests pass" + (" after the fix" if fixed else ""))

    def tests_failed(self, run: CommandRun, summary: str) -> None:
        if not self.fixing:
            self.notify("tests fail: /fix sends the failure summary and asks for a fix (/fix 3: up to 3 rounds of fix, apply, test)", severity="warning", timeout=15)

    @property
    def fixing(self) -> bool:
        """A /fix loop (or its one request) is running."""
        return any(w.group == "fix" and not w.is_finished for w in self.app.workers if w.node is self)

    def stop_fixing(self) -> None:
        self.workers.cancel_group(self, "fix")

    # ---- commands and tests -------------------------------------------------------------

    async def do_run(self, arg: str) -> None:
        if not arg:
            raise UserError("/run needs a command, e.g. /run ls -l")
        self.run_command(arg, tests=False)

    @work(group="command", exclusive=True)
    async def run_command(self, command: str, tests: bool) -> CommandRun:
        run = self.running = CommandRun(command)
        block = CommandOutput(run)
        try:  # from the mount on: a stop while it mounts must still clear `running`
            await self.chat.mount(block)
            self.chat.anchor()
            async for text in run.chunks():
                block.write(text)
        except asyncio.CancelledError:  # a newer /run or /test took its place: this one was stopped
            block.finish()
            raise
        finally:
            if self.running is run:  # not the newer command's
                self.running = None
        self.last_run = run
        if not tests:
            block.finish()
        elif run.exit_code == 0:
            block.finish("tests pass")
        else:
            block.finish("/fix asks for a fix · Ctrl+O adds the output")
        await self.offer_to_stop(run)
        return run

    async def do_add(self, arg: str) -> None:
        self.action_add_output()

    def action_add_output(self) -> None:
        if self.last_run is None:
            return self.say("no command output yet: /run COMMAND or /test first")
        self.session.conversation.attachments.append(self.last_run.for_model())
        self.say(f"the output of `{self.last_run.command}` goes with your next message")

    async def action_cancel(self) -> None:
        """Escape: stop the running command, else take back the prompt waiting
        for the engine, else cut the streaming reply (and end a fix loop)."""
        if self.running is not None:
            self.running.stop()
        elif self.pending is not None:
            async with self.changing:
                if await self.withdraw_pending():
                    self.say("the waiting prompt is back in the prompt box")
        else:
            self.stop_fixing()
            await self.chat.end_reply()

    async def stop_command(self) -> None:
        """Stop the running /run or /test (its block keeps the output) and wait until it has ended."""
        for worker in [w for w in self.app.workers if w.node is self and w.group == "command"]:
            if not worker.is_finished:
                if not worker.is_cancelled:
                    worker.cancel()  # the command's process group is killed, its block finished
                await wait_for_worker(worker)

    # ---- branches, regenerate, new conversation ---------------------------------------------

    async def do_edit(self, arg: str) -> None:
        async with self.changing:
            await self.settle()  # a cut reply is part of what is edited
            message = self.session.prompt_to_edit(arg)
            number = next(i for i, m in enumerate(self.session.conversation.prompts(), start=1) if m is message)
            old = self.session.conversation_id
            branch = self.session.branch_at(message)  # a StoreError changes nothing
            if branch is not None:
                await self._open(branch)
                self.say(f"editing message {number} on a new branch; the old branch stays as conversation {old} (F3)")
            else:
                await self.chat.remove_from_prompt(number - 1)
            self.put_back(message["content"])
            self.query_one(PromptArea).focus()

    async def action_edit_last(self) -> None:
        try:
            await self.do_edit("")
        except UserError as exc:
            self.error(str(exc))

    async def action_regenerate(self) -> None:
        async with self.changing:
            await self.settle()  # a streaming reply is cut and stored first: that is what is regenerated
            try:
                prompt = self.session.drop_last_exchange()
            except UserError as exc:  # the database stayed locked: nothing was changed
                return self.error(str(exc))
            if prompt is None:
                return self.say("nothing to regenerate yet")
            await self.chat.remove_from_prompt(-1)
            await self._send(prompt)

    async def action_new_conversation(self) -> None:
        async with self.changing:
            await self.settle()
            await self._new_conversation()
        self.say("new conversation")

    async def _new_conversation(self) -> None:  # with self.changing held, settled
        self.session.new_conversation()  # a new stored conversation starts with the next prompt
        await self.chat.remove_children()
        self.status(context_used=None)

    def action_toggle_auto_temperature(self) -> None:
        conversation = self.session.conversation
        conversation.auto_temperature = not conversation.auto_temperature
        self.status(auto_temperature=conversation.auto_temperature)
        self.say("automatic code temperature " + ("on" if conversation.auto_temperature else "off for this session"))

    def action_toggle_tint(self) -> None:
        self.tint = not self.tint
        self.chat.show_tint(self.tint, self.engines.engine, self.token_text)

    # ---- profiles, history ----------------------------------------------------------------

    def action_pick_profile(self) -> None:
        self.app.push_screen(ProfilePicker(self.app.config.profiles, self.session.profile.name), lambda name: name and self.run_worker(self.switch_profile(name), group="switch", exclusive=True))

    def action_switch_index(self, index: int) -> None:
        names = list(self.app.config.profiles)
        if index < len(names):
            self.run_worker(self.switch_profile(names[index]), group="switch", exclusive=True)

    def action_restart_engine(self) -> None:
        self.start_engine(switch=True, restart=True)

    def action_history(self) -> None:
        if self.session.store is None:
            return self.error("the history database is not available this session")

        def chosen(result) -> None:
            if result:
                action, conversation_id = result
                if action == "open":
                    self.run_worker(self.open_conversation(conversation_id))
                else:
                    self.export(conversation_id, action.removeprefix("export-"))

        async def deleting(conversation_id: int) -> None:
            """Before the open conversation is deleted: end its reply, start a new one."""
            async with self.changing:
                if conversation_id == self.session.conversation_id:
                    await self.settle()
                    await self._new_conversation()
                    self.say("the conversation on screen was deleted; a new one starts")

        self.app.push_screen(HistoryScreen(self.session.store, self.session.conversation_id, deleting), chosen)

    def export(self, conversation_id: int, fmt: str) -> None:
        store = self.session.store

        def write(name: str, force: bool) -> None:
            text = store.export_markdown(conversation_id) if fmt == "md" else store.export_json(conversation_id)
            try:
                self.say(f"exported conversation {conversation_id} to {write_export(name, text, force=force)}")
            except UserError as exc:
                self.error(str(exc))

        def save(name: str | None) -> None:
            if not name:
                return
            if not Path(name).expanduser().is_file():
                return write(name, force=False)
            self.app.push_screen(AskText(f"{name} exists. Overwrite it? (y/N)", ""), lambda answer: write(name, True) if (answer or "").strip().lower() in ("y", "yes") else self.say("not exported: the file was left as it is"))

        self.app.push_screen(AskText(f"Export conversation {conversation_id} as {fmt.upper()} to:", f"conversation-{conversation_id}.{fmt}"), save)

