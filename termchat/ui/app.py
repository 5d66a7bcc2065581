"""The Textual app: it routes, screens and widgets do the work.

It holds what outlives a screen: the config, the engine controller (shared
rules with the REPL: the old engine is gone before the new one starts), the
themes and their saved choice. The chat screen (screens/chat.py) owns the
conversation; the command palette's entries come from `ui/palette.py`.
"""

from __future__ import annotations

import asyncio
import json

from textual.app import App
from textual.binding import Binding
from textual.command import SimpleProvider
from textual.theme import ThemeProvider
from textual.worker import NoActiveWorker, get_current_worker

from termchat import paths
from termchat.engine.controller import EngineController
from termchat.errors import UserError
from termchat.profiles import Config, builtin_profiles, load_config
from termchat.sanitize import inert
from termchat.chat.session import ChatSession
from termchat.chat.store import Store
from termchat.ui.palette import TermchatCommands
from termchat.ui.screens.chat import ChatScreen
from termchat.ui.screens.help import HelpScreen
from termchat.ui.screens.modal import Palette
from termchat.ui.themes import highlight_theme, load_all
from termchat.ui.widgets.chat_view import wait_for_worker
from termchat.ui.widgets.message import ThemedFence

DEFAULT_THEME = "termchat-dark"
UI_STATE = "ui.json"
QUIT_WAIT_S = 5.0  # for the streaming reply to be stored on quit
# every widget's style, beside its module (screens name their own in CSS_PATH)
WIDGET_CSS = ["app.tcss", "widgets/chat_view.tcss", "widgets/message.tcss", "widgets/prompt.tcss", "widgets/status.tcss", "widgets/engine_panel.tcss", "widgets/command_output.tcss"]


def _read_ui_state() -> dict:
    """The remembered UI settings; {} for anything else (a link, a FIFO, a list)."""
    state = paths.read_json(paths.state_dir() / UI_STATE)
    return {k: v for k, v in state.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(state, dict) else {}


def _write_ui_state(**changes) -> None:
    state = {**_read_ui_state(), **changes}
    try:
        paths.write_private(paths.state_dir() / UI_STATE, json.dumps(state).encode())
    except OSError:
        pass  # remembering the theme is a convenience, never a failure


class TermchatApp(App):
    CSS_PATH = WIDGET_CSS
    TITLE = "termchat"
    COMMANDS = App.COMMANDS | {TermchatCommands}
    BINDINGS = [
        Binding("ctrl+t", "cycle_theme", "Theme", show=False, tooltip="next theme (remembered)"),
    ]

    def __init__(self, config: Config | None = None, config_error: str | None = None, profile: str | None = None, theme: str | None = None, start_engine: bool = True, resume: bool = True, store: Store | None = None):
        super().__init__()
        self.config = config or Config(builtin_profiles())
        self.config_error = config_error
        self.quitting = False  # Ctrl+Q or /quit has begun: no new work starts
        self.requested_profile = profile
        known = profile in self.config.profiles or profile is None
        self.session = ChatSession(self.config, self.config.get(profile if known else None), store)
        self.engines = EngineController(on_progress=lambda engine: self.chat_screen.on_engine_progress(engine))
        self.chat_screen = ChatScreen(self.session, start_engine=start_engine and not config_error, resume=resume)
        self.termchat_themes, self.theme_problems = load_all()
        for item in self.termchat_themes.values():
            self.register_theme(item.theme)
        self.theme_names = list(self.termchat_themes)
        self._initial_theme = theme

    @property
    def engine(self):
        """The current engine (None while none is up)."""
        return self.engines.engine

    @property
    def profile(self):
        return self.session.profile

    def get_css_variables(self) -> dict[str, str]:
        """Textual's own themes (palette: "Change theme") have no code background: use their surface."""
        variables = super().get_css_variables()
        variables.setdefault("code-background", variables.get("surface", "#1e1e1e"))
        return variables

    def get_default_screen(self) -> ChatScreen:
        return self.chat_screen

    def on_mount(self) -> None:
        self.theme_changed_signal.subscribe(self, self._on_theme_changed)
        self.apply_theme(self._choose_theme())
        for problem in self.theme_problems:
            self.notify(problem, severity="warning", timeout=10)

    def on_unmount(self) -> None:
        self.engines.stop_now()

    async def action_quit(self) -> None:
        """Ctrl+Q and /quit: the streaming reply is ended and stored first, as
        before any change of conversation (session.py); never more than a few
        seconds of waiting."""
        screen = self.chat_screen
        self.quitting = True  # from now on the chat screen starts no work (ChatScreen.run_worker)

        async def settled() -> None:
            async with screen.changing:
                await screen.settle()

        if screen.is_attached:
            try:
                async with asyncio.timeout(QUIT_WAIT_S):
                    await settled()
            except TimeoutError:
                pass
        # what still runs (a switch, an engine start, advice) ends before the screens
        # are taken down, not after, where its next query fails (the monkey, seed 10680)
        try:
            me = get_current_worker()  # /quit from a worker must not wait for itself
        except NoActiveWorker:
            me = None
        others = [worker for worker in self.workers if not worker.is_finished and worker is not me]
        for worker in others:
            worker.cancel()
        try:
            async with asyncio.timeout(1.0):
                for worker in others:
                    await wait_for_worker(worker)
        except TimeoutError:
            pass
        if screen.is_attached:
            screen.chat.abandon()
        self.exit()

    def action_show_help_panel(self) -> None:
        """Textual's key panel (from the palette): not once quitting, when the chat
        screen is being taken down (mounting it then raised: the monkey, seed 60171)."""
        if self.quitting or not self.screen.is_mounted:
            return
        super().action_show_help_panel()

    def action_command_palette(self) -> None:
        """Textual's palette, dismissed once (a second Enter popped the chat screen)."""
        if self.use_command_palette and not Palette.is_open(self):
            self.push_screen(Palette(id="--command-palette"))

    # the palettes Textual's own commands open ("Theme" opens search_themes) are dismissed once too:
    # a second Enter on them popped the chat screen (the monkey, seed 10791)
    def search_commands(self, commands, placeholder: str = "Search for commands…"):
        return self.push_screen(Palette(providers=[SimpleProvider(self.screen, commands)], placeholder=placeholder))

    def search_themes(self) -> None:
        self.push_screen(Palette(providers=[ThemeProvider], placeholder="Search for themes…"))

    def notify(self, message: str, *, title: str = "", severity="information", timeout: float | None = None, markup: bool = False) -> None:
        """Every notification, from any screen: its text is never markup and
        never reaches the terminal as an escape sequence (it often quotes a
        file name, a title or a server's error)."""
        super().notify(inert(str(message)), title=inert(title), severity=severity, timeout=timeout, markup=False)

    # ---- themes -----------------------------------------------------------------------

    def _choose_theme(self) -> str:
        for name in (self._initial_theme, self.profile.theme, _read_ui_state().get("theme"), self.config.theme, DEFAULT_THEME):
            if name and name in self.termchat_themes:
                return name
            if name and name == self._initial_theme:
                self.notify(f"unknown theme '{name}'; known: {', '.join(self.theme_names)}", severity="warning")
        return DEFAULT_THEME

    def apply_theme(self, name: str) -> None:
        ThemedFence.code_theme = highlight_theme(self.termchat_themes[name].code_style)
        self.theme = name

    def _on_theme_changed(self, theme) -> None:
        """Also for themes chosen in the command palette: re-highlight code."""
        if theme.name in self.termchat_themes:
            ThemedFence.code_theme = highlight_theme(self.termchat_themes[theme.name].code_style)
            for fence in self.screen.query(ThemedFence):
                fence.notify_style_update()

    def action_cycle_theme(self) -> None:
        names = self.theme_names
        name = names[(names.index(self.theme) + 1) % len(names)] if self.theme in names else names[0]
        self.apply_theme(name)
        _write_ui_state(theme=name)
        self.notify(f"theme: {name}")

    # ---- help -------------------------------------------------------------------------

    def binding_rows(self) -> list[tuple[str, str]]:
        rows = [("Enter", "send"), ("Shift+Enter, Ctrl+J", "new line in the prompt"), ("Ctrl+P", "command palette"), ("Ctrl+Q", "quit")]
        for binding in [*self.BINDINGS, *ChatScreen.BINDINGS]:
            if not binding.action.startswith("switch_index"):
                rows.append(("+".join(part.capitalize() for part in binding.key.split("+")), binding.tooltip or binding.description))
        rows.append(("Alt+1 … Alt+9", "switch to profile 1-9 of the picker"))
        return rows

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.binding_rows()))


def run_app(config_file: str | None = None, profile: str | None = None, theme: str | None = None) -> int:
    """Start the TUI; a bad config is shown inside it, not as a traceback."""
    config, error = None, None
    try:
        config = load_config(config_file)
    except UserError as exc:
        error = str(exc)
    TermchatApp(config=config, config_error=error, profile=profile, theme=theme).run()
    return 0
