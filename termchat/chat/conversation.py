"""One conversation's state, independent of any UI: the messages so far, the
system prompt, and how the next prompt's temperature is chosen."""

from __future__ import annotations

from dataclasses import dataclass, field

from termchat.detect.classify import temperature_for
from termchat.errors import UserError
from termchat.profiles import Profile


def parse_temperature(text: str) -> float:
    """`/temp X`: a number from 0 to 2, or a UserError saying so."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 2:
        raise UserError("/temp takes a number from 0 to 2, e.g. /temp 0.3")
    return value


GUARD_NAMES = {"frequency_penalty": "freq", "presence_penalty": "pres", "repetition_penalty": "rep"}


@dataclass(frozen=True)
class TemperatureChoice:
    value: float
    lowered: bool  # the code temperature was applied
    reason: str
    kind: str = ""  # "code" | "text": what the detector said ("" when it was not asked)
    guard: tuple[tuple[str, float], ...] = ()  # the loop guard a text prompt gets (Profile.guard)

    def label(self) -> str:
        guard = "".join(f", {GUARD_NAMES.get(key, key)} {value:g}" for key, value in self.guard)
        return f"T={self.value:g}{guard}" + (" ↓code" if self.lowered else "") + f" ({self.reason})"


@dataclass
class Conversation:
    system_prompt: str = ""
    # user/assistant turns: {"role", "content", "id"}; id is the stored message's (None if not stored)
    messages: list[dict] = field(default_factory=list)
    auto_temperature: bool = True
    forced_temperature: float | None = None  # `/temp X`, for the next message only
    attachments: list[str] = field(default_factory=list)  # `/file` blocks for the next message
    stronger_guard: bool = False  # the next message after a looping reply gets chat/loops.STRONGER

    def add(self, role: str, content: str, message_id: int | None = None) -> None:
        self.messages.append({"role": role, "content": content, "id": message_id})

    def prompts(self) -> list[dict]:
        """The user's turns, in order (what /edit N counts)."""
        return [m for m in self.messages if m["role"] == "user"]

    def cut_before(self, message: dict) -> list[dict]:
        """Forget `message` and everything after it (an edit, a regeneration); returns what was cut."""
        at = next(i for i, m in enumerate(self.messages) if m is message)
        self.messages, cut = self.messages[:at], self.messages[at:]
        return cut

    def with_attachments(self, prompt: str) -> str:
        """`prompt` followed by the files attached since the last message (then forgotten)."""
        text = "\n\n".join([prompt, *self.attachments])
        self.attachments = []
        return text

    def choose_temperature(self, prompt: str, profile: Profile) -> TemperatureChoice:
        value, kind = temperature_for(prompt, profile.temperature, profile.code_temperature, self.auto_temperature)
        guard = tuple(profile.guard(kind.kind).items())
        if self.forced_temperature is not None:
            value, self.forced_temperature = self.forced_temperature, None
            return TemperatureChoice(value, False, "set with /temp", kind.kind, guard)
        if not self.auto_temperature:
            return TemperatureChoice(value, False, f"auto off; {kind.kind} prompt", kind.kind, guard)
        if kind.is_code:
            return TemperatureChoice(value, value < profile.temperature, f"code: {kind.reason}", kind.kind, guard)
        return TemperatureChoice(value, False, "text prompt", kind.kind, guard)

    def request(self, profile: Profile) -> list[dict]:
        """The messages to send: system prompt first, then the turns."""
        system = self.system_prompt or profile.system_prompt
        turns = [{"role": m["role"], "content": m["content"]} for m in self.messages]
        return ([{"role": "system", "content": system}] if system else []) + turns
