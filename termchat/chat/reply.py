"""One prompt and its reply, stored as it happens: used by the TUI, the REPL and `ask`.

Order matters for losing nothing: the user message is written before the
request is sent; the reply is written as it streams (ReplyWriter: at least
once a second) and flagged `cut` or `interrupted` when it does not finish.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from termchat.chat.conversation import Conversation, TemperatureChoice
from termchat.engine.client import ChatStream, Sampling
from termchat.engine.endpoint import Engine
from termchat.engine.stats import ReplyStats, Step
from termchat.profiles import Profile
from termchat.chat.store import COMPLETE, CUT, INTERRUPTED, ReplyWriter, Store, StoreError


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


@dataclass
class Turn:
    """One prompt and its reply, as the conversation and the store hold them.

    Begun before anything is sent, without awaiting anything: the prompt is
    stored and in the conversation, the reply's row written (empty). Ended
    exactly once, however the reply ends (even before its request went out):
    stored with its status and added to its conversation, even when empty."""

    conversation: Conversation
    recorder: Recorder
    writer: ReplyWriter
    choice: TemperatureChoice
    user_id: int | None  # the stored prompt's row (None when not stored)
    request: list[dict]  # what is sent: the conversation up to this prompt
    knobs: dict  # the session's `/set` sampling values, over the profile's
    ended: bool = False

    @classmethod
    def begin(cls, conversation: Conversation, recorder: Recorder, prompt: str, profile: Profile, choice: TemperatureChoice, knobs: dict | None = None) -> Turn:
        recorder.user(prompt, profile)
        conversation.add("user", prompt, recorder.last_user_id)
        return cls(conversation, recorder, recorder.writer(profile, choice), choice, recorder.last_user_id, conversation.request(profile), dict(knobs or {}))

    def end(self, status: str, stats: ReplyStats | None) -> None:
        if self.ended:
            return
        self.ended = True
        self.writer.finish(status, stats)
        self.recorder.error = self.recorder.error or self.writer.error
        # even when empty (cut before the first token, failed): the reply is
        # stored and on screen, and the turns must alternate for the model
        self.conversation.add("assistant", self.writer.text, self.writer.message_id)


async def exchange(
    engine: Engine,
    profile: Profile,
    conversation: Conversation,
    prompt: str,
    choice: TemperatureChoice,
    recorder: Recorder,
    on_step: Callable[[Step], Awaitable[None] | None],
    max_tokens: int | None = None,
    seed: int | None = None,
    knobs: dict | None = None,
) -> Outcome:
    """Send `prompt` (already chosen its temperature), stream, store. Raises
    CancelledError (reply cut) and ReplyInterrupted (engine gone) after storing."""
    turn = Turn.begin(conversation, recorder, prompt, profile, choice, knobs)
    return await stream_turn(engine, profile, turn, on_step, max_tokens, seed)


async def stream_turn(
    engine: Engine,
    profile: Profile,
    turn: Turn,
    on_step: Callable[[Step], Awaitable[None] | None],
    max_tokens: int | None = None,
    seed: int | None = None,
) -> Outcome:
    """Stream a begun turn's reply and end the turn (see `exchange`)."""
    knobs = profile.sampling(turn.knobs)
    knobs["max_tokens"] = max_tokens or knobs["max_tokens"]
    knobs["seed"] = seed if seed is not None else knobs["seed"]
    sampling = Sampling(temperature=turn.choice.value, **knobs)
    stream = ChatStream(engine, turn.request, sampling)
    try:
        async for step in stream:
            turn.writer.append(step.text)
            result = on_step(step)
            if asyncio.iscoroutine(result):
                await result
    except (asyncio.CancelledError, KeyboardInterrupt):
        turn.end(CUT, stream.live_stats(CUT) if stream.steps else None)
        raise
    except BaseException:  # ReplyInterrupted (engine gone) and anything else
        turn.end(INTERRUPTED, stream.live_stats(INTERRUPTED) if stream.steps else None)
        raise
    turn.end(COMPLETE, stream.stats)
    return Outcome(stream.text, stream.stats, COMPLETE)
