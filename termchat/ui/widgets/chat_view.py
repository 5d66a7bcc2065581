"""The conversation on screen: messages, notes, command output, and the reply
that is streaming.

It streams one reply at a time (a worker in the "reply" group: Escape cancels
it) and posts what happens as messages (`ReplyStarted`, `ReplyProgress`,
`ReplyEnded`); the chat screen turns them into the status bar and, when the
engine died, the engine panel. What it writes to the store goes through
`exchange`, like every front-end.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from textual import work
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Static
from textual.worker import Worker, WorkerCancelled, WorkerError, WorkerFailed

from termchat.chat.conversation import TemperatureChoice
from termchat.engine import stats as stats_mod
from termchat.engine.client import ReplyInterrupted
from termchat.engine.endpoint import Engine
from termchat.engine.stats import ReplyStats, Step
from termchat.errors import UserError
from termchat.chat.reply import LOOPED, Reply
from termchat.profiles import Profile
from termchat.sanitize import inert
from termchat.chat.session import ChatSession
from termchat.chat.store import CUT
from termchat.chat.store import Message as StoredMessage
from termchat.coding.reply_code import CodeBlock
from termchat.ui.widgets.message import MessageView

LIVE_EVERY_S = 0.25  # how often the live figures are posted while a reply streams


@dataclass
class ReplyStarted(Message):
    """Every reply message names its turn: the screen shows the live figures of
    the turn that started last and ignores news of a turn that has already
    ended (messages from two message loops may arrive late, never wrong)."""

    turn: Reply


@dataclass
class ReplyProgress(Message):
    """Live figures from step sizes (marked ~ in the status bar); `waiting` is set
    while no token has come yet."""

    turn: Reply
    stats: ReplyStats | None
    waiting: float | None = None


@dataclass
class ReplyEnded(Message):
    """How the reply ended: "complete", "cut" (Escape), "failed" (the engine
    answered with an error), "broken" (the stream broke; `engine_gone` says
    whether the engine died)."""

    turn: Reply | None  # None: not a reply of this view (a test's stand-in end)
    how: str
    stats: ReplyStats | None
    error: str = ""
    engine_gone: bool = False


async def wait_for_worker(worker: Worker) -> None:
    """Until `worker` has ended, however it ends (a failure is Textual's to
    report); at most a few seconds for one that never starts."""
    for _ in range(300):
        if worker.is_finished:
            return
        try:
            await worker.wait()
            return
        except (WorkerCancelled, WorkerFailed):
            return
        except WorkerError:  # not started yet
            await asyncio.sleep(0.01)


class ChatView(VerticalScroll):
    def __init__(self, session: ChatSession, **kwargs):
        super().__init__(**kwargs)
        self.session = session
        self.current: tuple[MessageView, Reply] | None = None  # the last reply started, and its turn

    async def note(self, text: str) -> None:
        await self.mount(Static(f"— {inert(text)} —", classes="note", markup=False))

    async def show_prompt(self, text: str, header: str) -> MessageView:
        """The user's message and an empty reply under it; the reply's view."""
        prompt_view = MessageView("user", "you", text)
        view = MessageView("assistant", header)
        view.prompt_view = prompt_view
        await self.mount_all([prompt_view, view])
        self.anchor()
        return view

    async def show_stored(self, messages: list[StoredMessage]) -> ReplyStats | None:
        """A stored conversation, as it was; the last reply's statistics."""
        await self.remove_children()
        views = []
        for m in messages:
            if m.role == "user":
                views.append(MessageView("user", "you", m.content))
            else:
                header = f"{m.profile or 'assistant'} · T={m.temperature:g}" if m.temperature is not None else (m.profile or "assistant")
                views.append(MessageView("assistant", header, m.content))
            views[-1].message_id = m.id
        await self.mount_all(views)
        last = None
        for view, m in zip(views, messages):
            if m.role == "assistant":
                last = m.stats or last
                await view.finish(m.stats, f"⚑ {m.flagged}" if m.flagged else "", "cut" if m.flagged else "")
        self.anchor()
        return last

    def replies(self) -> list[MessageView]:
        return [v for v in self.query(MessageView) if v.role == "assistant"]

    def code_blocks(self) -> list[CodeBlock]:
        return [block for view in self.replies() for block in view.code_blocks()]

    async def remove_from_prompt(self, index: int) -> None:
        """Remove the user's message number `index` (0-based; -1 the last) and all after it."""
        children = list(self.children)
        users = [i for i, v in enumerate(children) if isinstance(v, MessageView) and v.role == "user"]
        if users:
            for view in children[users[index]:]:
                await view.remove()

    # ---- the reply ------------------------------------------------------------------------

    @property
    def streaming(self) -> bool:
        """Is a reply running (or about to)?"""
        return (self.current is not None and not self.current[1].ended) or any(not w.is_finished for w in self._reply_workers())

    def _reply_workers(self) -> list:
        return [w for w in self.app.workers if w.node is self and w.group == "reply"]

    async def end_reply(self) -> bool:
        """End the running reply the defined way (cut: kept, stored and marked
        as such, its figures in the status bar) and return once it has ended.
        Every action that changes the conversation awaits this first, so the
        cut reply is stored in the conversation it belongs to, before the
        change. Whether a reply was running."""
        ended = False
        current = self.current  # this call's reply: a newer one begun while it waits is not its to end
        for worker in self._reply_workers():
            if not worker.is_finished:
                ended = True
                if not worker.is_cancelled:  # once: a second cancel would cut its own ending short
                    worker.cancel()
                await wait_for_worker(worker)
        if current is not None:
            view, turn = current
            if self.current is current:
                self.current = None
            if not turn.ended:  # cancelled before its worker ran a line: end it here
                ended = True
                turn.end(CUT, None)
                self._link(view, turn)
                view.cut = True
                await view.finish(None, "✂ cut before it began", "cut")
                self.post_message(ReplyEnded(turn, "cut", None))
        return ended

    def abandon(self) -> None:
        """On quit, after the workers were cancelled: a turn whose worker never
        ran a line is stored as cut, not left `streaming`."""
        if self.current is not None and not self.current[1].ended:
            self.current[1].end(CUT, None)

    def stream_reply(self, view: MessageView, engine: Engine, prompt: str, choice: TemperatureChoice) -> None:
        """Send `prompt` and stream its reply into `view`.

        The turn begins here, before anything is awaited: the prompt is stored
        and in the conversation at once, so a reply ended before its request
        went out is still a turn (cut, empty), as the screen shows it. Its
        owner (the conversation and recorder) is captured now and never read
        again from the session."""
        turn = self.session.begin_reply(prompt, choice)
        self.current = (view, turn)
        self._stream(view, engine, turn, self.session.profile)

    @work(group="reply")
    async def _stream(self, view: MessageView, engine: Engine, turn: Reply, profile: Profile) -> None:
        steps: list[Step] = []
        sent, shown = time.monotonic(), 0.0
        choice = turn.choice

        def live() -> ReplyStats:
            return stats_mod.from_steps(steps, sent, profile.speculative, choice.value)

        async def on_step(step: Step) -> None:
            nonlocal shown
            steps.append(step)  # first: a cut during the view's await must still count this step
            await view.append(step)
            if len(steps) == 1 or step.at - shown > LIVE_EVERY_S:
                shown = step.at
                self.post_message(ReplyProgress(turn, live()))

        def waiting() -> None:  # a silent endpoint is visible, second by second
            if not steps:
                self.post_message(ReplyProgress(turn, None, waiting=time.monotonic() - sent))

        told = False  # the screen hears of the end exactly once, however it ends

        def tell(how: str, stats: ReplyStats | None, error: str = "", gone: bool = False) -> None:
            nonlocal told
            if not told:
                told = True
                self.post_message(ReplyEnded(turn, how, stats, error, gone))

        ticker = None
        try:
            try:
                self.post_message(ReplyStarted(turn))
                await view.finish(None)  # clears "waiting for the engine"
                ticker = self.set_interval(1.0, waiting)
                outcome = await turn.stream(engine, profile, on_step)
            finally:
                if ticker is not None:
                    ticker.stop()
        except asyncio.CancelledError:
            cut = live() if steps else None
            turn.end(CUT, cut)  # when cut before the stream began; else already ended
            self._link(view, turn)
            view.cut = True
            view.stats = cut
            tell("cut", cut)  # before any await: the status bar must hear of it
            await view.finish(cut, "✂ cut: the partial reply is kept" + (" (figures from step sizes)" if cut else ""), "cut")
            raise
        except ReplyInterrupted as exc:
            self._link(view, turn)
            cut = live() if steps else None
            view.cut = True
            gone = False
            try:
                gone = not await self.app.engines.alive_after()
            finally:  # a cut landing in that await must not leave the bar live
                tell("broken", cut, str(exc), gone)
            await view.finish(cut, "✗ the engine stopped mid-reply; the partial reply is kept" if gone else f"✗ {exc}", "failed")
            return
        except UserError as exc:
            self._link(view, turn)
            tell("failed", None, str(exc))
            await view.finish(None, f"✗ {exc}", "failed")
            return
        self._link(view, turn)
        if outcome.looped:  # stopped by the loop watch: kept, marked and stored as cut
            self.session.after_loop()
            view.cut = True
            tell("cut", outcome.stats)
            await view.finish(outcome.stats, LOOPED, "cut")
            return
        # told before the view is drawn: a cut landing in that await (a settle) must not
        # leave the status bar live with nothing running (the monkey, seed 40080)
        tell("complete", outcome.stats)
        await view.finish(outcome.stats)

    def _link(self, view: MessageView, turn: Reply) -> None:
        """Link the reply's views to their stored messages; show a store failure once."""
        view.message_id = turn.writer.message_id
        if view.prompt_view is not None:
            view.prompt_view.message_id = turn.user_id
        if turn.recorder.error is not None:
            self.notify(str(turn.recorder.error), severity="error", timeout=15)
            turn.recorder.error = None

    # ---- draft tint -------------------------------------------------------------------

    @work(group="tint", exclusive=True)
    async def show_tint(self, on: bool, engine: Engine | None, token_text: dict[int, str]) -> None:
        """Tint the text that came from accepted drafts (token texts from /detokenize, cached)."""
        views = self.replies()
        if on and engine is not None:
            wanted = {s.token_ids[-1] for v in views for s in v.steps if len(s.token_ids) > 1} - set(token_text)
            token_text.update(await engine.detokenize(wanted))
        for view in views:
            if view.is_attached:  # a new conversation may have removed it meanwhile
                view.show_tint(on, lambda step: token_text.get(step.token_ids[-1], ""))
        self.notify("draft tint " + ("on: highlighted text came from accepted drafts" if on else "off"))
