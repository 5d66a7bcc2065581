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

from termchat.profiles.advisor import band
from termchat.engine.endpoint import EngineState
from termchat.engine.server_counters import APPROXIMATE
from termchat.engine.stats import ReplyStats
from termchat.models import short_name
from termchat.profiles import Profile

LEVEL_STYLE = {"low": "bold $error", "moderate": "bold $warning", "strong": "bold $success"}


@dataclass
class StatusInfo:
    profile: Profile | None = None
    engine: EngineState = EngineState.NOT_STARTED
    engine_detail: str = ""  # "12s", "3s for the first token", "(no config)"
    reply: ReplyStats | None = None  # this reply's figures (live: from step sizes) or the last one's
    live: bool = False
    lowered: bool = False  # the temperature was lowered for code
    auto_temperature: bool = True
    context_used: int | None = None
    step_cost: float | None = None  # measured by the bench for this profile
    history: list[float] = field(default_factory=list)  # tok/s of the replies so far


STATE_STYLE = {EngineState.READY: "$success", EngineState.STREAMING: "$accent", EngineState.FAILED: "bold $error"}


def render(info: StatusInfo) -> Content:
    p = info.profile
    parts: list[Content] = [Content.styled(f" {p.name if p else ''} ", "bold $text on $primary-muted")]
    # order = priority: what is cut first on a narrow terminal comes last
    model = short_name((p.model or p.endpoint or "") if p else "", drop_instruct=True)
    if p and p.speculative:
        model += f" ← {p.speculative.label()}"
    parts.append(Content(model))
    parts.append(Content.styled(f"{info.engine} {info.engine_detail}".strip(), STATE_STYLE.get(info.engine, "$warning")))
    r = info.reply or ReplyStats()
    if r.decode_tokens_per_s is not None:
        parts.append(Content(f"{'live ' if info.live else ''}{'~' if r.tokens_estimated else ''}{r.decode_tokens_per_s:.1f} tok/s"))
    method = p.method if p else None
    level, _ = band(method, r.acceptance_rate, r.tokens_per_step, info.step_cost)
    style = LEVEL_STYLE.get(level, "bold")
    adaptive = bool(p and p.speculative and p.speculative.adaptive)
    # where the figures come from: ~ from step sizes (while streaming, or a server that
    # reports nothing), ≈ a server's totals while other requests ran; none: exact
    mark = "~" if info.live or r.acceptance_source == "step sizes" else "≈" if r.acceptance_source == APPROXIMATE else ""
    if r.unknown:  # the server's figures could not be trusted: the reason is in the reply's details
        parts.append(Content.styled("acc ?", "$warning"))
    elif r.acceptance_rate is not None:
        parts.append(Content.assemble(f"acc {mark}", (f"{r.acceptance_rate:.0%}", "bold" if adaptive else style)))
    if r.mean_acceptance_length is not None:
        parts.append(Content.assemble(f"len {mark}", (f"{r.mean_acceptance_length:.2f}", style if adaptive else "")))
    if r.temperature is not None:
        parts.append(Content(f"T {r.temperature:g}" + (" ↓code" if info.lowered else "")))
    if not info.auto_temperature:
        parts.append(Content.styled("auto-T off", "$warning"))
    if p and p.max_model_len:
        parts.append(Content(f"ctx {info.context_used or 0}/{p.max_model_len}"))
    return Content(" │ ").join(parts)


class StatusBar(Horizontal):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.info = StatusInfo()

    def compose(self):
        yield Static(id="status-text", markup=False)
        yield Sparkline([], summary_function=max, id="speed-history")

    def on_mount(self) -> None:
        self.refresh_info()

    def refresh_info(self, **changes) -> None:
        for key, value in changes.items():
            setattr(self.info, key, value)
        # not composed yet, or taken down as the app exits: the info is kept, shown on mount
        for text in self.query("#status-text").results(Static):
            text.update(render(self.info))
        for sparkline in self.query(Sparkline):
            sparkline.data = list(self.info.history[-12:])

    @property
    def text(self) -> str:
        return render(self.info).plain
