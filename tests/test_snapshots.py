"""Pictures of the main screen, the help screen and the profile picker, in two themes.

No engine here: a fixed conversation is put on screen so the pictures are
stable. Update them after an intended change with `pytest --snapshot-update`.
"""

from __future__ import annotations

import pytest

from termchat.engine.endpoint import EngineState
from termchat.engine.stats import ReplyStats
from termchat.profiles import load_config
from termchat.ui.app import TermchatApp
from termchat.ui.widgets.message import MessageView
from termchat.ui.widgets.prompt import PromptArea

from .conftest import ROOT

REPLY = """Here is the function, with a test:

```python
def add(a: int, b: int) -> int:
    \"\"\"Return the sum of a and b.\"\"\"
    return a + b


def test_add():
    assert add(2, 3) == 5
```

Run it with `pytest`."""


async def fixed_conversation(pilot) -> None:
    app = pilot.app
    await pilot.pause()  # the chat screen has mounted (it shows the profile on mount)
    app.query_one(PromptArea).cursor_blink = False
    chat = app.query_one("#chat")
    await chat.mount(MessageView("user", "you", "Write an add function and a pytest test for it."))
    # the whole reply at once: these pictures are about the look (streaming
    # is covered by the Pilot tests and the UI benchmark)
    view = MessageView("assistant", "local · T=0 ↓code (code: words: function, pytest, test)", REPLY)
    await chat.mount(view)
    stats = ReplyStats(output_tokens=58, ttft_s=0.31, decode_tokens_per_s=31.4, acceptance_rate=0.62, mean_acceptance_length=3.1, temperature=0.0)
    await view.finish(stats)
    app.chat_screen.status(engine=EngineState.READY, reply=stats, lowered=True, context_used=142, history=[22.0, 25.5, 31.4])
    await pilot.pause()


@pytest.fixture(autouse=True)
def fixed_bench_results(monkeypatch):
    """The picker shows the last bench of each profile: fixed figures, not whatever a test benched."""
    monkeypatch.setattr("termchat.profiles.measured.summary", lambda name: "code 1.34x chat 0.92x" if name == "local-ngram" else "")
    monkeypatch.setattr("termchat.profiles.measured.step_cost", lambda name: None)


def make_app(theme: str) -> TermchatApp:
    return TermchatApp(config=load_config(ROOT / "config.example.toml"), theme=theme, start_engine=False, resume=False)


THEMES = ["termchat-dark", "termchat-light"]


@pytest.mark.parametrize("theme", THEMES)
def test_main_screen(snap_compare, theme):
    assert snap_compare(make_app(theme), terminal_size=(110, 36), run_before=fixed_conversation)


def pressing(key: str):
    """The fixed conversation, then one key (the screen it opens is the picture)."""

    async def before(pilot):
        await fixed_conversation(pilot)
        await pilot.press(key)
        await pilot.pause()

    return before


@pytest.mark.parametrize("theme", THEMES)
def test_help_screen(snap_compare, theme):
    assert snap_compare(make_app(theme), terminal_size=(110, 36), run_before=pressing("f1"))


@pytest.mark.parametrize("theme", THEMES)
def test_profile_picker(snap_compare, theme):
    assert snap_compare(make_app(theme), terminal_size=(110, 36), run_before=pressing("f2"))
