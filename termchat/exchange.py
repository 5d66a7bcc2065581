"""One prompt and its reply, stored as it happens: used by the TUI, the REPL and `ask`.

Order matters for losing nothing: the user message is written before the
request is sent; the reply is written as it streams (ReplyWriter: at least
once a second) and flagged `cut` or `interrupted` when it does not finish.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from termchat.conversation import Conversation, TemperatureChoice
from termchat.engine.client import ChatStream, Sampling
from termchat.engine.endpoint import Engine
from termchat.engine.stats import ReplyStats, Step
from termchat.profiles import Profile
from termchat.store import COMPLETE, CUT, INTERRUPTED, ReplyWriter, Store, StoreError


@dataclass
class Recorder:
    """Where an exchange is written; `store` None means not at all (--no-save)."""

    store: Store | None
    conversation_id: int | None
    error: StoreError | None = None  # the first write failure, for the caller to show
    last_user_id: int | None = None
    last_reply_id: int | None = None

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
        self.last_user_id = self.last_reply_id = None
        if self.store is None or self.conversation_id is None:
            return
        try:
            self.last_user_id = self.store.add_message(self.conversation_id, "user", text, profile=profile.name)
        except StoreError as exc:
            self.error = self.error or exc

    def writer(self, profile: Profile, choice: TemperatureChoice) -> ReplyWriter:
        store = self.store if self.error is None else None
        writer = ReplyWriter(store, self.conversation_id, profile=profile.name, model=profile.model, draft=profile.speculative.model if profile.speculative else None, method=profile.method, temperature=choice.value, lowered=choice.lowered)
        self.last_reply_id = writer.message_id
        return writer


@dataclass
class Outcome:
    text: str
    stats: ReplyStats | None
    status: str


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
) -> Outcome:
    """Send `prompt` (already chosen its temperature), stream, store. Raises
    CancelledError (reply cut) and ReplyInterrupted (engine gone) after storing."""
    recorder.user(prompt, profile)
    conversation.add("user", prompt, recorder.last_user_id)
    writer = recorder.writer(profile, choice)
    sampling = Sampling(temperature=choice.value, top_p=profile.top_p, max_tokens=max_tokens or profile.max_tokens, seed=seed)
    stream = ChatStream(engine, conversation.request(profile), sampling)
    try:
        async for step in stream:
            writer.append(step.text)
            result = on_step(step)
            if asyncio.iscoroutine(result):
                await result
    except (asyncio.CancelledError, KeyboardInterrupt):
        _end(conversation, recorder, writer, CUT, stream.live_stats(CUT) if stream.steps else None)
        raise
    except BaseException:  # ReplyInterrupted (engine gone) and anything else
        _end(conversation, recorder, writer, INTERRUPTED, stream.live_stats(INTERRUPTED) if stream.steps else None)
        raise
    _end(conversation, recorder, writer, COMPLETE, stream.stats)
    return Outcome(stream.text, stream.stats, COMPLETE)


def _end(conversation: Conversation, recorder: Recorder, writer: ReplyWriter, status: str, stats: ReplyStats | None) -> None:
    writer.finish(status, stats)
    recorder.error = recorder.error or writer.error
    if writer.text:
        conversation.add("assistant", writer.text, recorder.last_reply_id)
