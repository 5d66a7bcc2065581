"""The chat screen: one conversation, its engine, and whether speculation pays.

It paints at once and starts the engine in the background (a child process:
nothing vLLM prints reaches the terminal), showing start-up progress and the
log tail. A prompt typed before the engine is ready waits and goes when it
is. The conversation widget streams replies and posts what happens; this
screen turns that into the status bar. The slash commands and code-block
actions are in `ChatCommands` (chat_commands.py).
"""

from __future__ import annotations

import asyncio
import inspect
import time

from textual import work
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer

from termchat.profiles import measured
from termchat.slash import dispatch
from termchat.chat.conversation import TemperatureChoice
from termchat.engine.endpoint import EngineState
from termchat.engine.process import ManagedEngine
from termchat.engine.stats import ReplyStats
from termchat.errors import UserError
from termchat.chat.reply import Reply
from termchat.profiles import Profile
from termchat.chat.session import ChatSession
from termchat.ui.screens.chat_commands import ChatCommands
from termchat.ui.widgets.chat_view import ChatView, ReplyEnded, ReplyProgress, ReplyStarted
from termchat.ui.widgets.engine_panel import EnginePanel
from termchat.ui.widgets.message import MessageView
from termchat.ui.widgets.prompt import PromptArea
from termchat.ui.widgets.status import StatusBar


class ChatScreen(ChatCommands, Screen):
    CSS_PATH = "chat.tcss"
    # the footer shows the first eight (they fit 120 columns); F1 lists them all
    BINDINGS = [
        Binding("f1", "app.help", "Help", tooltip="every key and slash command"),
        Binding("f2", "pick_profile", "Profiles", tooltip="list the profiles (model, draft, method) and switch"),
        Binding("f3", "history", "History", tooltip="stored conversations and their branches: search, open, rename, delete, export"),
        Binding("escape", "cancel", "Cancel", tooltip="stop the reply (the partial text stays, marked as cut) or the running command"),
        Binding("ctrl+r", "regenerate", "Regenerate", tooltip="ask the last prompt again"),
        Binding("ctrl+g", "copy_code", "Copy code", tooltip="copy the last code block to the clipboard"),
        Binding("f4", "toggle_auto_temperature", "Auto temp", tooltip="automatic code temperature on/off for this session"),
        Binding("f8", "toggle_tint", "Draft tint", tooltip="tint the text that came from accepted drafts"),
        # not Ctrl+E / Ctrl+Y / F6 / F7: the prompt (a TextArea) uses those
        Binding("ctrl+l", "edit_last", "Edit last", show=False, tooltip="edit the last prompt: the conversation branches there (the old branch is kept)"),
        Binding("ctrl+s", "save_code", "Save code", show=False, tooltip="save the last code block to a new file"),
        Binding("f9", "apply_code", "Apply code", show=False, tooltip="apply the last code block to a file (diff first, undo with /undo)"),
        Binding("ctrl+o", "add_output", "Add output", show=False, tooltip="add the last command's output to your next message"),
        Binding("ctrl+n", "new_conversation", "New chat", show=False, tooltip="start a new conversation"),
        Binding("f5", "restart_engine", "Restart engine", show=False, tooltip="stop and start the engine of this profile"),
        *[Binding(f"alt+{i}", f"switch_index({i - 1})", f"Profile {i}", show=False) for i in range(1, 10)],
    ]

    def __init__(self, session: ChatSession, start_engine: bool = True, resume: bool = True):
        super().__init__()
        self.session = session
        self.start_on_mount = start_engine
        self.resume = resume
        # a prompt sent while the engine starts: at most one, sent when it is ready
        self.pending: tuple[MessageView, str, TemperatureChoice] | None = None
        # held by every action that changes the conversation (and by sending):
        # they take turns, each whole, in the order the user gave them
        self.changing = asyncio.Lock()
        self.live_turn: Reply | None = None  # the reply whose live figures the status bar shows
        self.tint = False
        self.token_text: dict[int, str] = {}
        self.init_commands()

    def run_worker(self, work, *args, **kwargs):
        """No new work once the app quits: it would run while the screens are
        taken down (a profile picked as Ctrl+Q lands: the monkey, seed 10680)."""
        if getattr(self.app, "quitting", False):
            if inspect.iscoroutine(work):
                work.close()
            return None
        return super().run_worker(work, *args, **kwargs)

    @property
    def engines(self):
        return self.app.engines

    @property
    def chat(self) -> ChatView:
        return self.query_one(ChatView)

    def compose(self):
        yield ChatView(self.session, id="chat")
        yield EnginePanel(id="engine-panel")
        yield PromptArea(id="prompt")
        yield StatusBar(id="status")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.show_profile()
        self.chat.anchor()
        self.query_one(PromptArea).focus()
        problem = self.session.open_store()
        if problem:
            self.notify(problem, severity="error", timeout=15)
        if self.resume and self.session.store is not None:
            latest = self.session.store.latest()
            if latest is not None:
                self.call_after_refresh(lambda: self.run_worker(self.open_conversation(latest.id)))
        app = self.app
        if app.config_error:
            self.panel.show("Configuration problem", app.config_error + "\n\nFix the file and restart termchat, or press F2 to pick a built-in profile.", failed=True)
            self.status(engine=EngineState.NOT_STARTED, engine_detail="(no config)")
        elif app.requested_profile and app.requested_profile not in app.config.profiles:
            known = ", ".join(app.config.profiles)
            self.panel.show("Unknown profile", f"There is no profile '{app.requested_profile}'. Using '{self.session.profile.name}'. Known: {known}", failed=True)
            self.start_engine()
        elif self.start_on_mount:
            self.start_engine()
        else:
            self.panel.display = False

    @property
    def panel(self) -> EnginePanel:
        return self.query_one(EnginePanel)

    # ---- status -----------------------------------------------------------------------

    def status(self, **changes) -> None:
        for bar in self.query(StatusBar):  # none while the app exits (a switch ending then: seed 10680)
            bar.refresh_info(**changes)

    def show_profile(self) -> None:
        profile = self.session.profile
        self.status(profile=profile, reply=None, context_used=None, step_cost=measured.step_cost(profile.name))

    # ---- engine -----------------------------------------------------------------------

    @work(group="engine", exclusive=True)
    async def start_engine(self, switch: bool = False, restart: bool = False) -> None:
        """Start (or, with `switch`, leave the old and start) the profile's
        engine; `restart` stops the old one even if it would stay warm."""
        profile = self.session.profile
        if switch:
            async with self.changing:
                self.stop_fixing()
                await self.chat.end_reply()  # cut and stored before its engine goes
            self.status(engine=EngineState.STOPPING, engine_detail="")
            await self.engines.stop(kill=restart)  # gone (or warm, within the memory budget) before the new one starts
        self.advise(profile)
        self.status(engine=EngineState.STARTING, engine_detail="")
        self.panel.show(f"Starting the engine for '{profile.name}'…")
        try:
            await self.engines.start(profile)
        except UserError as exc:
            self.status(engine=EngineState.FAILED, engine_detail="")
            self.panel.show(f"The engine for '{profile.name}' did not start", f"{exc}\n\nF5 retries, F2 picks another profile.", failed=True)
            async with self.changing:  # nothing waits on an engine that failed
                if await self.withdraw_pending():
                    self.say("the prompt that was waiting is back in the prompt box")
            return
        self.status(engine=EngineState.READY, engine_detail="")
        self.panel.display = False
        async with self.changing:
            if self.pending is not None and self.engines.ready and not self.app.quitting:
                view, prompt, choice = self.pending
                self.pending = None
                self.chat.stream_reply(view, self.engines.engine, prompt, choice)

    def on_engine_progress(self, engine: ManagedEngine) -> None:
        elapsed = time.monotonic() - engine.started_at
        self.status(engine=EngineState.STARTING, engine_detail=f"{elapsed:.0f}s")
        expect = engine.start_phase() or "usually 10-30 s on a CPU"
        self.panel.show(f"Starting the engine for '{engine.profile.name}' ({elapsed:.0f} s; {expect})", engine.log_tail(8))

    @work(group="advice")
    async def advise(self, profile: Profile) -> None:
        """The advisor's warnings for this profile, as dismissible notices."""
        from termchat.profiles.advisor import warnings_for

        for finding in await asyncio.to_thread(warnings_for, profile):
            self.notify(f"{finding.rule}: {finding.message}", title=f"advice for '{profile.name}'", severity="warning", timeout=20)

    async def switch_profile(self, name: str) -> None:
        if name not in self.app.config.profiles:
            self.error(f"unknown profile '{name}'; known: {', '.join(self.app.config.profiles)}")
            return
        self.app.config_error = None
        self.session.profile = self.app.config.profiles[name]
        self.show_profile()
        await self.chat.note(f"switched to profile '{name}'")
        self.start_engine(switch=True)

    def engine_failed(self, message: str, gone: bool) -> None:
        if not gone and self.engines.engine is not None and self.engines.engine.alive():
            # the engine is up but this reply broke (a malformed stream, an error, a timeout)
            self.status(engine=EngineState.READY, engine_detail="")
            self.notify(message, severity="error", timeout=20)
            return
        self.engines.mark_failed()
        self.status(engine=EngineState.FAILED, engine_detail="")
        self.panel.show("The engine stopped", f"{message}\n\nF5 restarts it; your conversation stays.", failed=True)

    # ---- sending, and what the conversation reports -------------------------------------

    async def on_prompt_area_submitted(self, event: PromptArea.Submitted) -> None:
        text = event.text.strip()
        if text.startswith("/"):
            await dispatch(self, text)
        else:
            await self.send(text)

    async def send(self, text: str) -> None:
        """Send a prompt. A reply still streaming is ended first (cut, kept and
        stored before this prompt); while the engine starts, one prompt waits
        and a second is refused and left in the prompt box."""
        async with self.changing:
            await self._send(text)

    async def _send(self, text: str) -> None:  # with self.changing held
        if self.app.quitting:  # a prompt that waited for the lock while Ctrl+Q settled: nothing more is sent
            return
        if self.pending is not None:
            self.put_back(text)
            self.error("a prompt is already waiting for the engine; this one is back in the prompt box (Escape withdraws the waiting one)")
            return
        if await self.chat.end_reply():
            await self.chat.note("the reply above was cut to send your next prompt")
        # the code detector (rules and the model's topic probe) off the event loop: a big paste must not hold a frame
        text, choice = await asyncio.to_thread(self.session.prepare, text)
        view = await self.chat.show_prompt(text, f"{self.session.profile.name} · {choice.label()}")
        if not self.engines.ready:
            self.pending = (view, text, choice)
            await view.finish(None, "waiting for the engine; it will be sent when it is ready (Escape withdraws it)")
            return
        self.chat.stream_reply(view, self.engines.engine, text, choice)

    def put_back(self, text: str) -> None:
        """Put a prompt that was not sent back in the prompt box (after what is there)."""
        area = self.query_one(PromptArea)
        area.text = "\n\n".join(part for part in (area.text.rstrip(), text) if part)
        area.move_cursor(area.document.end)

    async def withdraw_pending(self) -> bool:
        """Take back the prompt waiting for the engine: off the screen, into the prompt box."""
        if self.pending is None:
            return False
        view, text, _ = self.pending
        self.pending = None
        for widget in (view.prompt_view, view):
            if widget is not None and widget.is_attached:
                await widget.remove()
        self.put_back(text)
        return True

    async def settle(self) -> None:
        """Step 3 of the reply lifecycle (session.py), with self.changing held:
        before an action changes the conversation, end what runs on it. A
        streaming reply is cut (kept, stored, marked) and waited for; a prompt
        waiting for the engine goes back to the prompt box; a running /run or
        /test is stopped (its block keeps the output); a fix loop ends."""
        self.stop_fixing()
        if await self.withdraw_pending():
            self.say("the prompt that was waiting for the engine is back in the prompt box")
        await self.stop_command()
        await self.chat.end_reply()
        self.workers.cancel_group(self.chat, "tint")

    def on_reply_started(self, event: ReplyStarted) -> None:
        if event.turn.ended:  # late news: its ReplyEnded follows
            return
        self.live_turn = event.turn
        # this reply's own figures from its first step on, never the previous reply's
        choice = event.turn.choice
        self.status(engine=EngineState.WAITING, engine_detail="", live=True, reply=ReplyStats(temperature=choice.value), lowered=choice.lowered)

    def on_reply_progress(self, event: ReplyProgress) -> None:
        if event.turn is not self.live_turn or event.turn.ended:  # late news of a reply that ended
            return
        if event.stats is None:
            self.status(engine=EngineState.WAITING, engine_detail=f"{event.waiting:.0f}s for the first token")
        else:
            self.status(engine=EngineState.STREAMING, engine_detail="", reply=event.stats)

    def on_reply_ended(self, event: ReplyEnded) -> None:
        newer = self.live_turn is not None and event.turn is not self.live_turn and not self.live_turn.ended
        bars = list(self.query(StatusBar))  # none while the app exits
        if not newer and bars:  # a newer reply's live figures stay
            self.live_turn = None
            info = bars[0].info
            changes = {"engine": EngineState.READY if self.engines.engine else info.engine, "engine_detail": "", "live": False}
            if event.stats is not None:
                changes.update(reply=event.stats, context_used=event.stats.context_tokens)
                if event.stats.decode_tokens_per_s:
                    changes["history"] = info.history + [event.stats.decode_tokens_per_s]
            self.status(**changes)
        if event.how == "broken":
            self.engine_failed(event.error, event.engine_gone)

    async def open_conversation(self, conversation_id: int) -> None:
        """Show a stored conversation (or branch) and continue it."""
        async with self.changing:
            await self.settle()
            await self._open(conversation_id)

    async def _open(self, conversation_id: int) -> None:  # with self.changing held, settled
        try:
            messages = self.session.load(conversation_id)
        except UserError as exc:  # deleted meanwhile, or the database failed
            return self.error(str(exc))
        last = await self.chat.show_stored(messages)
        self.status(context_used=last.context_tokens if last else None)
        record = self.session.store.conversation(conversation_id)
        branch = f" (a branch of conversation {record.parent_id})" if record.parent_id else ""
        await self.chat.note(f"conversation {conversation_id}: {record.title}{branch}")

    def type_command(self, command) -> None:
        """Put a slash command in the prompt, for its argument to be typed."""
        area = self.query_one(PromptArea)
        area.text = command.name + (" " if command.argument else "")
        area.move_cursor(area.document.end)
        area.focus()

    # ---- what a front-end shows ----------------------------------------------------------

    def say(self, text: str) -> None:
        self.notify(text)

    def error(self, text: str) -> None:
        self.notify(text, severity="error", timeout=10)
