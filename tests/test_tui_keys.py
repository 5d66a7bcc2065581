"""Every app key reaches the app while the prompt (a TextArea) has focus.

TextArea binds Ctrl+E, Ctrl+Y, F6 and F7 itself; this catches a binding that
the prompt would swallow. No engine: the answers checked are the app's own
"nothing to do yet" notices and a switch to a remote profile."""

from __future__ import annotations

from termchat.profiles import parse_config
from termchat.ui.app import TermchatApp
from termchat.ui.screens.help import HelpScreen
from termchat.ui.screens.picker import ProfilePicker
from termchat.ui.widgets.prompt import PromptArea

from .conftest import wait_for

REMOTE = '[profiles.far]\nendpoint = "http://127.0.0.1:9/v1"\nmodel = "m"\n'


async def test_keys_reach_the_app_from_the_prompt():
    config, _ = parse_config(REMOTE, "keys.toml")
    app = TermchatApp(config=config, start_engine=False, resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        assert isinstance(app.focused, PromptArea)
        expected = {"ctrl+g": "no code block to copy yet", "ctrl+s": "no code block to save yet", "ctrl+l": "no prompt to edit yet", "ctrl+r": "nothing to regenerate yet", "f8": "draft tint on", "f4": "automatic code temperature off", "f9": "no code block to apply yet", "ctrl+o": "no command output yet"}
        for key, message in expected.items():
            await pilot.press(key)
            await wait_for(pilot, lambda: any(message in n.message for n in app._notifications), timeout=10, what=f"{key}: {message}")
        theme = app.theme
        await pilot.press("ctrl+t")
        assert app.theme != theme
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), timeout=10, what="help")
        await pilot.press("escape", "f2")
        await wait_for(pilot, lambda: isinstance(app.screen, ProfilePicker), timeout=10, what="picker")
        position = list(config.profiles).index("far") + 1  # after the built-in profiles
        await pilot.press("escape", f"alt+{position}")
        await wait_for(pilot, lambda: app.profile.name == "far", timeout=10, what="profile far")
        # Shift+Enter / Ctrl+J insert a newline; Enter sends
        await pilot.press("a", "ctrl+j", "b")
        assert app.query_one(PromptArea).text == "a\nb"
