"""The profile picker: every profile with its model, draft and method."""

from __future__ import annotations

from textual.binding import Binding
from textual.containers import Vertical
from termchat.ui.screens.modal import Modal
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from termchat.profiles import measured as bench_results
from termchat.models import short_name
from termchat.profiles import Profile
from termchat.ui.text import plain


def describe(index: int, profile: Profile, current: str, warm: str = "") -> str:
    """One row: key, name, target model, draft/method (short names), and
    whether its engine is warm (switching to it attaches in a second)."""
    key = f"{index + 1}" if index < 9 else " "
    mark = "●" if profile.name == current else " "
    target = (profile.endpoint.split("//")[-1] + " " if profile.endpoint else "") + short_name(profile.model)
    if profile.speculative:
        draft = profile.speculative.label()
    else:
        draft = "no speculation"
    return f"{key} {mark} {profile.name:<15} {target:<44.44} {draft}" + (f"  [{warm}]" if warm else "")


def warm_profiles() -> dict[str, str]:
    """Profile name -> how its warm engine stands ("warm, 4m left", "warm, in use")."""
    from termchat.engine import registry

    marks = {}
    for engine in registry.running_engines():
        if engine.keep_alive is None:  # `termchat serve`'s: not warm, there until serve ends
            continue
        if engine.users:
            marks[engine.profile] = "warm, in use"
        else:
            marks[engine.profile] = f"warm, {engine.left_s / 60:.0f}m left" if engine.left_s >= 60 else f"warm, {engine.left_s:.0f}s left"
    return marks


def measured(name: str) -> str:
    """A second line with the profile's last measured speed-ups, when there are any."""
    found = bench_results.summary(name)
    return f"\n      last bench: {found}" if found else ""


class ProfilePicker(Modal[str | None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]
    CSS_PATH = "picker.tcss"

    def __init__(self, profiles: dict[str, Profile], current: str):
        super().__init__()
        self.profiles = profiles
        self.current = current
        self.warm = warm_profiles()  # read here, not in compose: a slow compose widened a race (below)

    def compose(self):
        warm = self.warm
        with Vertical():
            yield Label("Switch profile: Enter picks, Escape cancels, Alt+1..9 from the chat. Speed-ups: termchat bench.\nwarm: its engine is still running (keep_alive) and attaches at once.")
            yield OptionList(*[Option(plain(describe(i, p, self.current, warm.get(name, "")) + measured(name)), id=name) for i, (name, p) in enumerate(self.profiles.items())])

    def on_mount(self) -> None:
        found = self.query(OptionList)
        if not found:  # dismissed (Escape, Ctrl+Q) before it was mounted: the monkey, seeds 60171, 60563
            return
        options = found.first()
        names = list(self.profiles)
        if self.current in names:
            options.highlighted = names.index(self.current)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)
