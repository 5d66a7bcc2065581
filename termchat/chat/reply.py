"""A reply: one object begins, streams, records and ends it, for the TUI, the
REPL and `ask` alike (each front-end only shows it its own way).

Its lifecycle, enforced here:
1. `Reply.begin()` (through `ChatSession.begin_reply()`) runs before anything
   is sent and awaits nothing: the prompt is stored and in the conversation,
   the reply's row is written (empty, `streaming`). The conversation and the
   recorder it belongs to are captured then and never read again from the
   session.
2. `await reply.stream(engine, on_step)` sends the conversation up to this
   prompt and streams; the reply is written as it streams (ReplyWriter: at
   least once a second).
3. `end()` runs exactly once, however the reply ends (complete, cut by
   Escape or Ctrl+C, broken, or before its request went out): the reply is
   stored with its status and added to its conversation, even when empty, so
   user and assistant turns alternate.

Order matters for losing nothing: the user message is written before the
request is sent, and a reply that does not finish is flagged `cut` or
`interrupted`, never lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from termchat.chat.conversation import Conversation, TemperatureChoice
from termchat.chat.loops import LoopWatch
from termchat.chat.store import COMPLETE, CUT, INTERRUPTED, STREAMING, Store, StoreError, transient
from termchat.engine.client import ChatStream, Sampling
from termchat.engine.endpoint import Engine
from termchat.engine.stats import ReplyStats, Step
from termchat.profiles import Profile
from termchat.sanitize import valid


@dataclass
class Recorder:
    """Where an exchange is written; `store` None means not at all (--no-save)."""

    store: Store | None
    conversation_id: int | None
    error: StoreError | None = None  # the first write failure, for the caller to show
    last_user_id: int | None = None

    @classmethod
    def start(cls, store: Store | None, profile: Profile, system_prompt: str = "") -> Recorder:
        """A recorder for a new conversation. If the store cannot take one, a
        recorder that stores nothing and holds the error for the caller to show:
        the reply still goes ahead."""
        if store is None:
            return cls(None, None)
        try:
            return cls(store, store.new_conversation(profile.name, system_prompt=system_prompt))
        except StoreError as exc:
            return cls(None, None, error=exc)

    def user(self, text: str, profile: Profile) -> None:
        self.last_user_id = None
        if self.store is None or self.conversation_id is None:
            return
        try:
            self.last_user_id = self.store.add_message(self.conversation_id, "user", text, profile=profile.name)
        except StoreError as exc:
            self.error = self.error or exc

    def writer(self, profile: Profile, choice: TemperatureChoice) -> ReplyWriter:
        store = self.store if self.error is None else None
        return ReplyWriter(store, self.conversation_id, profile=profile.name, model=profile.model, draft=profile.speculative.model if profile.speculative else None, method=profile.method, temperature=choice.value, lowered=choice.lowered)


@dataclass
class Outcome:
    text: str
    stats: ReplyStats | None
    status: str
    looped: bool = False  # ended because it repeated itself (chat/loops.py): stored as cut


LOOPED = "⟳ stopped: the reply was repeating itself (kept, marked as cut); Ctrl+R regenerates it with a stronger guard against repeats"


@dataclass
class Reply:
    """One prompt and its reply, as the conversation and the store hold them
    (the lifecycle in this module's docstring)."""

    conversation: Conversation
    recorder: Recorder
    writer: ReplyWriter
    choice: TemperatureChoice
    user_id: int | None  # the stored prompt's row (None when not stored)
    request: list[dict]  # what is sent: the conversation up to this prompt
    knobs: dict  # the session's `/set` sampling values, over the profile's
    ended: bool = False
    status: str = STREAMING  # how it ended, once it has (COMPLETE, CUT, INTERRUPTED)

    @classmethod
    def begin(cls, conversation: Conversation, recorder: Recorder, prompt: str, profile: Profile, choice: TemperatureChoice, knobs: dict | None = None) -> Reply:
        prompt = valid(prompt)[0]  # nothing undecodable reaches SQLite, httpx or the tokenizer
        recorder.user(prompt, profile)
        conversation.add("user", prompt, recorder.last_user_id)
        return cls(conversation, recorder, recorder.writer(profile, choice), choice, recorder.last_user_id, conversation.request(profile), dict(knobs or {}))

    def end(self, status: str, stats: ReplyStats | None) -> None:
        if self.ended:
            return
        self.ended = True
        self.status = status
        self.writer.finish(status, stats)
        self.recorder.error = self.recorder.error or self.writer.error
        # even when empty (cut before the first token, failed): the reply is
        # stored and on screen, and the turns must alternate for the model
        self.conversation.add("assistant", self.writer.text, self.writer.message_id)

    async def stream(self, engine: Engine, profile: Profile, on_step: Callable[[Step], Awaitable[None] | None], max_tokens: int | None = None, seed: int | None = None) -> Outcome:
        """Send the request, stream, store, end. Raises CancelledError (reply
        cut) and ReplyInterrupted (engine gone) after ending the reply."""
        knobs = profile.sampling(self.knobs, dict(self.choice.guard))  # the loop guard chosen with the temperature
        knobs["max_tokens"] = max_tokens or knobs["max_tokens"]
        knobs["seed"] = seed if seed is not None else knobs["seed"]
        sampling = Sampling(temperature=self.choice.value, **knobs)
        stream = ChatStream(engine, self.request, sampling)
        watch = LoopWatch()
        steps = aiter(stream)
        try:
            async for step in steps:
                self.writer.append(step.text)
                result = on_step(step)
                if asyncio.iscoroutine(result):
                    await result
                if watch.feed(step.text):
                    break
        except (asyncio.CancelledError, KeyboardInterrupt):
            self.end(CUT, stream.live_stats(CUT) if stream.steps else None)  # ended before anything is awaited
            await _close(steps)
            raise
        except BaseException:  # ReplyInterrupted (engine gone) and anything else
            self.end(INTERRUPTED, stream.live_stats(INTERRUPTED) if stream.steps else None)
            await _close(steps)
            raise
        await _close(steps)  # a loop stopped: the connection closes now, and the server aborts the request
        if watch.looping:
            stats = stream.live_stats(CUT)
            self.end(CUT, stats)
            return Outcome(stream.text, stats, CUT, looped=True)
        self.end(COMPLETE, stream.stats)
        return Outcome(stream.text, stream.stats, COMPLETE)


async def _close(steps) -> None:
    """Close a reply's stream where it stands (not when the generator is
    collected, which printed asyncgen errors); a failure to close is not the
    reply's error."""
    with contextlib.suppress(Exception):
        await steps.aclose()


class ReplyWriter:
    """Writes a streaming reply: at once (empty), then at least once a second.

    The whole text stays in memory, so a write that fails loses nothing: while
    another process holds the database's lock, streaming writes wait at most
    STREAM_WAIT (the screen must not freeze) and are retried at the next one;
    the final write keeps trying for up to FINAL_WAIT, so the end of a reply
    is never lost to a passing lock. Other errors (disk full, read-only) stop
    the writing for this reply; the first one is kept in `error` for the
    caller to show."""

    STREAM_WAIT = 0.05
    FINAL_WAIT = 15.0

    def __init__(self, store: Store | None, conversation_id: int | None, interval: float = 1.0, **meta):
        self.store, self.interval = store, interval
        self.text = ""
        self.error: StoreError | None = None
        self.message_id: int | None = None
        self._flushed = time.monotonic()
        self._flushed_len = 0
        if store is not None and conversation_id is not None:
            try:
                self.message_id = store.add_message(conversation_id, "assistant", "", status=STREAMING, **meta)
            except StoreError as exc:
                self.error = exc

    def append(self, text: str) -> None:
        self.text += text
        if time.monotonic() - self._flushed >= self.interval:
            self.flush()

    def flush(self, status: str | None = None, stats: ReplyStats | None = None, wait: float | None = None) -> bool:
        """Write what is new; False if a lock kept it from the database this time."""
        if self.message_id is None or self.error is not None:
            return True
        if status is None and len(self.text) == self._flushed_len:
            return True
        text = self.text
        try:
            with self.store.waiting_at_most(self.STREAM_WAIT if wait is None else wait):
                self.store.update_message(self.message_id, text, status, stats)
        except StoreError as exc:
            self._flushed = time.monotonic()  # try again after the interval, not at every step
            if not transient(exc):
                self.error = exc
            return False
        self._flushed, self._flushed_len = time.monotonic(), len(text)
        return True

    def finish(self, status: str = COMPLETE, stats: ReplyStats | None = None) -> None:
        deadline = time.monotonic() + self.FINAL_WAIT
        while not self.flush(status=status, stats=stats, wait=1.0) and self.error is None:
            if time.monotonic() > deadline:
                self.error = StoreError(f"the history database {self.store.path} stayed locked for {self.FINAL_WAIT:.0f} s; the end of this reply was not saved (it is still on screen)")
                return
            time.sleep(0.1)
