"""One chat as both front-ends hold it: the profile, the live conversation,
and where it is stored.

The TUI and the REPL show things differently; what a command *does* (set the
temperature, attach a file, start over, branch at an edited message, open a
stored conversation) is decided here once, so the two cannot drift.

The reply lifecycle, for every front-end:

1. A reply starts with `begin_reply()`, the one way every front-end (the
   TUI, the REPL, `ask`) starts one: a `chat.reply.Reply`, which captures its
   owner (the live conversation and the recorder it is stored with) and reads
   and writes only those, never the session's current ones again.
2. It streams (`Reply.stream`); it ends complete, cut (Escape, Ctrl+C, or an
   action below), failed (the engine answered an error) or broken (the stream
   broke). Every ending stores the reply with its status and adds it to its
   owner's conversation, even when empty, so user and assistant turns
   alternate (chat/reply.py).
3. An action that changes the conversation (new, open, clear, edit/branch,
   regenerate, delete the open one, profile switch, restart, quit) first ends
   the running reply and waits until it has ended (step 2), and only then
   changes the conversation. The REPL gets this by construction (a reply
   runs in the foreground: no command can be typed before it ends); the TUI
   by `ChatScreen.settle()`, which every such action awaits first.

So the conversation sent to the model is always the stored branch on screen.
"""

from __future__ import annotations

from dataclasses import replace

from termchat.detect import topic_probe
from termchat.coding.attach import fenced_file
from termchat.chat.conversation import Conversation, TemperatureChoice, parse_temperature
from termchat.errors import UserError
from termchat.sanitize import valid
from termchat.chat.loops import STRONGER
from termchat.chat.reply import Recorder, Reply
from termchat.profiles import SESSION_KEYS, Config, Profile, check_session_key, parse_session_value
from termchat.chat.store import Message, Store, StoreError


class ChatSession:
    def __init__(self, config: Config, profile: Profile, store: Store | None = None):
        self.config = config
        self.profile = profile
        self.store = store
        self.store_failed = False
        self.conversation = Conversation()
        self.recorder: Recorder | None = None  # None: the next prompt starts a stored conversation
        self.knobs: dict = {}  # `/set KEY VALUE`: sampling values over any profile's, for this session
        topic_probe.warm_in_background()  # the code detector's model part, ready by the first prompt

    def open_store(self) -> str | None:
        """Open the history database if needed; the message to show once if it cannot be."""
        if self.store is None and not self.store_failed:
            try:
                self.store = Store()
            except StoreError as exc:
                self.store_failed = True
                return f"{exc} Conversations will not be saved this session."
        return None

    @property
    def conversation_id(self) -> int | None:
        return self.recorder.conversation_id if self.recorder else None

    def begin_reply(self, prompt: str, choice: TemperatureChoice) -> Reply:
        """A reply to `prompt`, begun now (step 1 of the lifecycle above):
        stored and in the live conversation before anything is sent."""
        if self.recorder is None:
            self.recorder = Recorder.start(self.store, self.profile, self.conversation.system_prompt)
        return Reply.begin(self.conversation, self.recorder, prompt, self.profile, choice, self.knobs)

    def prepare(self, text: str) -> tuple[str, TemperatureChoice]:
        """The prompt as it is sent (with attachments) and its temperature."""
        text = self.conversation.with_attachments(valid(text)[0])
        choice = self.conversation.choose_temperature(text, self.profile)
        if self.conversation.stronger_guard:  # the reply before looped: this one (a regeneration, say) gets more
            self.conversation.stronger_guard = False
            choice = replace(choice, guard=(*choice.guard, *STRONGER))
        if any(key in self.knobs for key, _ in choice.guard):  # `/set` wins over the guard
            choice = replace(choice, guard=tuple((k, v) for k, v in choice.guard if k not in self.knobs))
        return text, choice

    def after_loop(self) -> None:
        """A reply was stopped for repeating itself: the next prompt of this conversation gets the stronger guard."""
        self.conversation.stronger_guard = True

    # ---- what the shared slash commands do ---------------------------------------------

    def set_temperature(self, arg: str) -> str:
        self.conversation.forced_temperature = parse_temperature(arg)
        return f"the next message uses temperature {self.conversation.forced_temperature:g}"

    def set_knob(self, arg: str) -> str:
        """`/set`: list the sampling values; `/set KEY VALUE` changes one for
        this session (over every profile); `/set KEY off` goes back to the profile's."""
        key, _, text = arg.strip().partition(" ")
        text = text.strip()
        if not key:
            values = self.profile.sampling(self.knobs)
            shown = lambda key: "server default" if values[key] in (None, ()) else repr(values[key]) if key == "stop" else f"{values[key]:g}" if isinstance(values[key], float) else str(values[key])  # noqa: E731
            return "sampling: " + ", ".join(f"{key} {shown(key)}{' (set)' if key in self.knobs else ''}" for key in SESSION_KEYS) + ". /set KEY VALUE changes one for this session; /set KEY off goes back to the profile's"
        if text.lower() in ("off", "default", "none", "reset"):
            check_session_key(key)
            self.knobs.pop(key, None)
            return f"{key} is back to the profile's: {getattr(self.profile, key)!r}"
        if not text:
            raise UserError(f"/set {key} VALUE, e.g. /set repetition_penalty 1.1; /set {key} off goes back to the profile's")
        self.knobs[key] = parse_session_value(key, text)
        said = f"{key} = {self.knobs[key]!r} for the rest of this session (every profile)"
        return f"{said}; on '{self.profile.name}' {self.profile.seed_promise()}" if key == "seed" else said

    def set_system(self, arg: str) -> str:
        self.conversation.system_prompt = arg
        if self.store is not None and self.conversation_id:
            self.store.set_system_prompt(self.conversation_id, arg)
        return "system prompt set" if arg else "system prompt back to the profile's"

    def attach(self, arg: str) -> str:
        block, notice = fenced_file(arg)
        self.conversation.attachments.append(block)
        return f"attached {arg}; it goes with your next message" + (f" ({notice})" if notice else "")

    def new_conversation(self) -> None:
        self.conversation = Conversation(auto_temperature=self.conversation.auto_temperature)
        self.recorder = None

    def load(self, conversation_id: int) -> list[Message]:
        """Continue a stored conversation; its messages, to show."""
        record = self.store.conversation(conversation_id)
        messages = self.store.messages(conversation_id)
        self.conversation = Conversation(system_prompt=record.system_prompt, auto_temperature=self.conversation.auto_temperature)
        for m in messages:
            self.conversation.add(m.role, m.content, m.id)
        self.recorder = Recorder(self.store, conversation_id)
        return messages

    def prompt_to_edit(self, arg: str) -> dict:
        """The user turn `/edit [N]` names (1-based; default the last)."""
        prompts = self.conversation.prompts()
        if not prompts:
            raise UserError("no prompt to edit yet")
        try:
            number = int(arg) if arg else len(prompts)
        except ValueError:
            number = 0
        if not 1 <= number <= len(prompts):
            raise UserError(f"/edit takes a message number from 1 to {len(prompts)}")
        return prompts[number - 1]

    def branch_at(self, message: dict) -> int | None:
        """Edit `message`: the stored conversation forks before it (the old
        branch is kept as it is) and the live one continues on the new branch.
        Returns the new branch's id, to show it (None when nothing is stored)."""
        if self.store is None or not self.conversation_id or message.get("id") is None:
            self.conversation.cut_before(message)
            return None
        branch = self.store.fork(self.conversation_id, message["id"])
        self.load(branch)
        return branch

    def drop_last_exchange(self) -> str | None:
        """Remove the last prompt and its reply from the context and the store
        (regenerate); the prompt, or None if there is none."""
        prompts = self.conversation.prompts()
        if not prompts:
            return None
        last = prompts[-1]
        at = next(i for i, m in enumerate(self.conversation.messages) if m is last)
        ids = [m["id"] for m in self.conversation.messages[at:] if m["id"] is not None]
        if self.store is not None and ids:
            self.store.delete_messages(ids)  # one transaction: a StoreError changes nothing
        self.conversation.cut_before(last)
        return last["content"]
