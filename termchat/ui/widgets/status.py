"""The status bar: is speculation paying, right now?

The colour comes from the rule that fits the method (advisor.band): for
fixed-k methods (draft models, EAGLE, MTP) the acceptance rate against the
article's bands (red below 40%, yellow 40-60%, green from 60%); for ngram and
suffix, which propose only where they find a match, the tokens per step
against what a step costs on this engine (from the last `termchat bench` of
the profile; no colour until it has been measured).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from textual.containers import Horizontal
from textual.content import Content
from textual.widgets import Sparkline, Static

from termchat.advisor import ADAPTIVE_METHODS, band
from termchat.models import short_name

LEVEL_STYLE = {"low": "bold $error", "moderate": "bold $warning", "strong": "bold $success"}


@dataclass
class StatusInfo:
    profile: str = ""
    model: str = ""
    draft: str = ""
    engine: str = "not started"
    tokens_per_s: float | None = None
    live: bool = False
    acceptance: float | None = None
    mean_length: float | None = None
    temperature: float | None = None
    lowered: bool = False
    auto_temperature: bool = True
    context_used: int | None = None
    context_max: int | None = None
    method: str | None = None
    step_cost: float | None = None  # measured by the bench for this profile
    tokens_per_step: float | None = None
    history: list[float] = field(default_factory=list)


def render(info: StatusInfo) -> Content:
    parts: list[Content] = [Content.styled(f" {info.profile} ", "bold $text on $primary-muted")]
    # order = priority: what is cut first on a narrow terminal comes last
    model = short_name(info.model, drop_instruct=True)
    if info.draft:
        model += f" ← {short_name(info.draft, drop_instruct=True)}"
    parts.append(Content(model))
    state_style = {"ready": "$success", "streaming": "$accent", "failed": "bold $error"}.get(info.engine.split()[0], "$warning")
    parts.append(Content.styled(info.engine, state_style))
    if info.tokens_per_s is not None:
        label = "live " if info.live else ""
        parts.append(Content(f"{label}{info.tokens_per_s:.1f} tok/s"))
    level, _ = band(info.method, info.acceptance, info.tokens_per_step, info.step_cost)
    style = LEVEL_STYLE.get(level, "bold")
    adaptive = info.method in ADAPTIVE_METHODS
    if info.acceptance is not None:
        # while streaming: derived from step sizes (~); after the reply: the server's exact figure
        parts.append(Content.assemble("acc ~" if info.live else "acc ", (f"{info.acceptance:.0%}", "bold" if adaptive else style)))
    if info.mean_length is not None:
        parts.append(Content.assemble("len ~" if info.live else "len ", (f"{info.mean_length:.2f}", style if adaptive else "")))
    if info.temperature is not None:
        mark = " ↓code" if info.lowered else ""
        parts.append(Content(f"T {info.temperature:g}{mark}"))
    if not info.auto_temperature:
        parts.append(Content.styled("auto-T off", "$warning"))
    if info.context_max:
        parts.append(Content(f"ctx {info.context_used or 0}/{info.context_max}"))
    return Content(" │ ").join(parts)


class StatusBar(Horizontal):
    DEFAULT_CSS = """
    StatusBar { height: 1; background: $panel; }
    StatusBar #status-text { width: 1fr; height: 1; }
    StatusBar Sparkline { width: 12; height: 1; margin: 0 1; }
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.info = StatusInfo()

    def compose(self):
        yield Static(id="status-text", markup=False)
        yield Sparkline([], summary_function=max, id="speed-history")

    def refresh_info(self, **changes) -> None:
        for key, value in changes.items():
            setattr(self.info, key, value)
        self.query_one("#status-text", Static).update(render(self.info))
        self.query_one(Sparkline).data = list(self.info.history[-12:])

    @property
    def text(self) -> str:
        return render(self.info).plain
