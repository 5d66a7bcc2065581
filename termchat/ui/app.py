"""The Textual app: chat on a speculative engine, and show whether it pays.

It paints at once and starts the engine in the background (a child process:
nothing vLLM prints reaches the terminal), showing start-up progress and the
log tail. A prompt typed before the engine is ready waits and goes when it is.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Footer, Static

from termchat import paths
from termchat.advisor import ADAPTIVE_METHODS
from termchat.attach import fenced_file
from termchat.bench import results as bench_results
from termchat.conversation import Conversation, TemperatureChoice, parse_temperature
from termchat.engine import server
from termchat.engine import stats as stats_mod
from termchat.engine.client import ReplyInterrupted
from termchat.engine.stats import ReplyStats, Step
from termchat.errors import UserError
from termchat.exchange import Recorder, exchange
from termchat.store import Store, StoreError, write_export
from termchat.profiles import Config, Profile, builtin_profiles, load_config
from termchat.sanitize import clean_code, inert
from termchat.ui.screens.ask_text import AskText
from termchat.ui.screens.help import HelpScreen
from termchat.ui.screens.history import HistoryScreen
from termchat.ui.screens.picker import ProfilePicker
from termchat.ui.themes import highlight_theme, load_all
from termchat.ui.widgets.message import MessageView, ThemedFence
from termchat.ui.widgets.prompt import PromptArea
from termchat.ui.widgets.status import StatusBar

DEFAULT_THEME = "termchat-dark"
UI_STATE = "ui.json"


def _read_ui_state() -> dict:
    try:
        return json.loads((paths.state_dir() / UI_STATE).read_text())
    except (OSError, ValueError):
        return {}


def _write_ui_state(**changes) -> None:
    state = {**_read_ui_state(), **changes}
    try:
        paths.private_file(paths.state_dir() / UI_STATE).write_text(json.dumps(state))
    except OSError:
        pass  # remembering the theme is a convenience, never a failure


class TermchatApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "termchat"
    # the footer shows the first eight (they fit 120 columns); F1 lists them all
    BINDINGS = [
        Binding("f1", "help", "Help", tooltip="every key and slash command"),
        Binding("f2", "pick_profile", "Profiles", tooltip="list the profiles (model, draft, method) and switch"),
        Binding("f3", "history", "History", tooltip="stored conversations: search, open, rename, delete, export"),
        Binding("escape", "cancel_reply", "Cancel", tooltip="stop the reply; the partial text stays, marked as cut"),
        Binding("ctrl+r", "regenerate", "Regenerate", tooltip="ask the last prompt again"),
        Binding("ctrl+g", "copy_code", "Copy code", tooltip="copy the last code block to the clipboard"),
        Binding("f4", "toggle_auto_temperature", "Auto temp", tooltip="automatic code temperature on/off for this session"),
        Binding("f8", "toggle_tint", "Draft tint", tooltip="tint the text that came from accepted drafts"),
        # not Ctrl+E / Ctrl+Y / F6 / F7: the prompt (a TextArea) uses those
        Binding("ctrl+l", "edit_last", "Edit last", show=False, tooltip="put the last prompt back in the input (its reply is removed)"),
        Binding("ctrl+s", "save_code", "Save code", show=False, tooltip="save the last code block to a file"),
        Binding("ctrl+n", "new_conversation", "New chat", show=False, tooltip="start a new conversation"),
        Binding("ctrl+t", "cycle_theme", "Theme", show=False, tooltip="next theme (remembered)"),
        Binding("f5", "restart_engine", "Restart engine", show=False, tooltip="stop and start the engine of this profile"),
        *[Binding(f"alt+{i}", f"switch_index({i - 1})", f"Profile {i}", show=False) for i in range(1, 10)],
    ]

    def __init__(self, config: Config | None = None, config_error: str | None = None, profile: str | None = None, theme: str | None = None, start_engine: bool = True, resume: bool = True, store: Store | None = None):
        super().__init__()
        self.resume = resume
        self.store = store
        self.recorder: Recorder | None = None
        self.config = config or Config(builtin_profiles())
        self.config_error = config_error
        self.start_engine_on_mount = start_engine and not config_error
        self.profile: Profile = self.config.get(profile) if profile in self.config.profiles or profile is None else self.config.get(None)
        self.requested_profile = profile
        self.engine: server.Engine | None = None
        self.conversation = Conversation()
        self.pending: tuple[MessageView, str, TemperatureChoice] | None = None
        self.tint = False
        self.token_text: dict[int, str] = {}
        self.termchat_themes, self.theme_problems = load_all()
        for item in self.termchat_themes.values():
            self.register_theme(item.theme)
        self.theme_names = list(self.termchat_themes)
        self._initial_theme = theme

    # ---- layout -----------------------------------------------------------------------

    def compose(self):
        yield VerticalScroll(id="chat")
        with Vertical(id="engine-panel"):
            yield Static(id="engine-status", markup=False)
            yield Static(id="engine-log", markup=False)
        yield PromptArea(id="prompt")
        yield StatusBar(id="status")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.theme_changed_signal.subscribe(self, self._on_theme_changed)
        self.apply_theme(self._choose_theme())
        self._status_for_profile()
        self.query_one("#chat").anchor()
        self.query_one(PromptArea).focus()
        for problem in self.theme_problems:
            self.notify(problem, severity="warning", timeout=10)
        self._open_store()
        if self.config_error:
            self._panel("Configuration problem", self.config_error + "\n\nFix the file and restart termchat, or press F2 to pick a built-in profile.", failed=True)
            self.status(engine="no config")
        elif self.requested_profile and self.requested_profile not in self.config.profiles:
            self._panel("Unknown profile", f"There is no profile '{self.requested_profile}'. Using '{self.profile.name}'. Known: {', '.join(self.config.profiles)}", failed=True)
            self.start_engine(self.profile)
        elif self.start_engine_on_mount:
            self.start_engine(self.profile)
        else:
            self.query_one("#engine-panel").display = False

    # ---- history ----------------------------------------------------------------------

    def _open_store(self) -> None:
        if self.store is None:
            try:
                self.store = Store()
            except StoreError as exc:
                self.notify(f"{exc} Conversations will not be saved this session.", severity="error", timeout=15)
                return
        if self.resume:
            latest = self.store.latest()
            if latest is not None:
                self.call_after_refresh(lambda: self.run_worker(self.load_conversation(latest.id)))

    async def load_conversation(self, conversation_id: int) -> None:
        """Show a stored conversation and continue it."""
        self.workers.cancel_group(self, "reply")
        conv = self.store.conversation(conversation_id)
        messages = self.store.messages(conversation_id)
        chat = self.query_one("#chat")
        await chat.remove_children()
        self.conversation = Conversation(system_prompt=conv.system_prompt, auto_temperature=self.conversation.auto_temperature)
        self.recorder = Recorder(self.store, conversation_id)
        views = []
        for m in messages:
            if m.role == "user":
                view = MessageView("user", "you", m.content)
            else:
                header = f"{m.profile or 'assistant'} · T={m.temperature:g}" if m.temperature is not None else (m.profile or "assistant")
                view = MessageView("assistant", header, m.content)
            view.message_id = m.id
            views.append((view, m))
            self.conversation.messages.append({"role": m.role, "content": m.content})
        await chat.mount_all([v for v, _ in views])
        last: ReplyStats | None = None
        for view, m in views:
            if m.role == "assistant":
                stats = ReplyStats(**{k: v for k, v in (m.stats or {}).items() if k in ReplyStats.__dataclass_fields__}) if m.stats else None
                last = stats or last
                note = f"⚑ {m.flagged}" if m.flagged else ""
                await view.finish(stats, note, "cut" if m.flagged else "")
        self.status(context_used=last.context_tokens if last else None)
        await self._note(f"conversation {conversation_id}: {conv.title}")
        chat.anchor()

    def _recorder(self) -> Recorder:
        if self.recorder is None:
            self.recorder = Recorder.start(self.store, self.profile, self.conversation.system_prompt)
        return self.recorder

    def action_history(self) -> None:
        if self.store is None:
            self.notify("the history database is not available this session", severity="error")
            return

        def chosen(result) -> None:
            if not result:
                return
            action, conversation_id = result
            if action == "open":
                self.run_worker(self.load_conversation(conversation_id))
            else:
                fmt = action.removeprefix("export-")
                self._export(conversation_id, fmt)

        self.push_screen(HistoryScreen(self.store), chosen)

    def _export(self, conversation_id: int, fmt: str) -> None:
        def write(name: str, force: bool) -> None:
            text = self.store.export_markdown(conversation_id) if fmt == "md" else self.store.export_json(conversation_id)
            try:
                path = write_export(name, text, force=force)
            except UserError as exc:
                self.notify(str(exc), severity="error")
                return
            self.notify(f"exported conversation {conversation_id} to {path}")

        def save(name: str | None) -> None:
            if not name:
                return
            if not Path(name).expanduser().is_file():
                write(name, force=False)
                return

            def confirmed(answer: str | None) -> None:
                if (answer or "").strip().lower() in ("y", "yes"):
                    write(name, force=True)
                else:
                    self.notify("not exported: the file was left as it is")

            self.push_screen(AskText(f"{name} exists. Overwrite it? (y/N)", ""), confirmed)

        self.push_screen(AskText(f"Export conversation {conversation_id} as {fmt.upper()} to:", f"conversation-{conversation_id}.{fmt}"), save)

    def notify(self, message: str, *, title: str = "", severity="information", timeout: float | None = None, markup: bool = False) -> None:
        """Every notification, from any screen: its text is never markup and
        never reaches the terminal as an escape sequence (it often quotes a
        file name, a title or a server's error)."""
        super().notify(inert(str(message)), title=inert(title), severity=severity, timeout=timeout, markup=False)

    def on_unmount(self) -> None:
        if self.engine is not None:
            self.engine.stop()

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
            for fence in self.query(ThemedFence):
                fence.notify_style_update()

    def action_cycle_theme(self) -> None:
        names = self.theme_names
        name = names[(names.index(self.theme) + 1) % len(names)] if self.theme in names else names[0]
        self.apply_theme(name)
        _write_ui_state(theme=name)
        self.notify(f"theme: {name}")

    # ---- status -----------------------------------------------------------------------

    def status(self, **changes) -> None:
        self.query_one(StatusBar).refresh_info(**changes)

    def _status_for_profile(self) -> None:
        p = self.profile
        draft = ""
        if p.speculative:
            draft = p.speculative.get("model") or p.method
            draft += f" k={p.num_speculative_tokens}"
        self.status(profile=p.name, model=p.model or p.endpoint or "", draft=draft, context_max=p.max_model_len, context_used=None, acceptance=None, mean_length=None, tokens_per_s=None, temperature=None, method=p.method, step_cost=bench_results.step_cost(p.name), tokens_per_step=None)

    def _panel(self, title: str, body: str = "", failed: bool = False) -> None:
        panel = self.query_one("#engine-panel")
        panel.display = True
        panel.set_class(failed, "failed")
        self.query_one("#engine-status", Static).update(title)
        self.query_one("#engine-log", Static).update(inert(body))

    # ---- engine -----------------------------------------------------------------------

    def start_engine(self, profile: Profile) -> None:
        self._start_engine(profile)

    @work(group="advice")
    async def _advise(self, profile: Profile) -> None:
        """The advisor's warnings for this profile, as dismissible notices."""
        from termchat.advisor import warnings_for

        for finding in await asyncio.to_thread(warnings_for, profile):
            self.notify(f"{finding.rule}: {finding.message}", title=f"advice for '{profile.name}'", severity="warning", timeout=20)

    @work(group="engine", exclusive=True)
    async def _start_engine(self, profile: Profile) -> None:
        self._advise(profile)
        self.status(engine="starting")
        self._panel(f"Starting the engine for '{profile.name}'…")

        def launched(engine: server.ManagedEngine) -> None:
            self.engine = engine  # so that a switch or quit stops it while it warms up

        try:
            engine = await server.open_engine_async(profile, progress=lambda line: self._engine_progress(), launched=launched)
        except UserError as exc:
            self.status(engine="failed")
            self._panel(f"The engine for '{profile.name}' did not start", f"{exc}\n\nF5 retries, F2 picks another profile.", failed=True)
            return
        self.engine = engine
        self.status(engine="ready")
        self.query_one("#engine-panel").display = False
        if self.pending is not None:
            view, prompt, choice = self.pending
            self.pending = None
            self._reply(view, prompt, choice)

    def _engine_progress(self) -> None:
        engine = self.engine
        elapsed = time.monotonic() - engine.started_at
        self.status(engine=f"starting {elapsed:.0f}s")
        self._panel(f"Starting the engine for '{engine.profile.name}' ({elapsed:.0f} s; about 30-45 s on a CPU)", engine.log_tail(8))

    async def switch_profile(self, name: str) -> None:
        if name not in self.config.profiles:
            self.notify(f"unknown profile '{name}'; known: {', '.join(self.config.profiles)}", severity="error")
            return
        self.workers.cancel_group(self, "reply")
        self.workers.cancel_group(self, "engine")
        old, self.engine = self.engine, None
        if old is not None:
            self.status(engine="stopping")
            await asyncio.to_thread(old.stop)  # the old process is gone before the new one starts
        self.profile = self.config.profiles[name]
        self._status_for_profile()
        await self._note(f"switched to profile '{name}'")
        self.start_engine(self.profile)

    def action_switch_index(self, index: int) -> None:
        names = list(self.config.profiles)
        if index < len(names):
            self.run_worker(self.switch_profile(names[index]), group="switch", exclusive=True)

    def action_pick_profile(self) -> None:
        def chosen(name: str | None) -> None:
            if name:
                self.config_error = None
                self.run_worker(self.switch_profile(name), group="switch", exclusive=True)

        self.push_screen(ProfilePicker(self.config.profiles, self.profile.name), chosen)

    def action_restart_engine(self) -> None:
        self.run_worker(self.switch_profile(self.profile.name), group="switch", exclusive=True)

    # ---- chat -------------------------------------------------------------------------

    async def _note(self, text: str) -> None:
        await self.query_one("#chat").mount(Static(f"— {inert(text)} —", classes="note", markup=False))

    async def on_prompt_area_submitted(self, event: PromptArea.Submitted) -> None:
        text = event.text.strip()
        if text.startswith("/"):
            await self.slash(text)
            return
        await self.send(text)

    async def send(self, text: str) -> None:
        text = self.conversation.with_attachments(text)
        choice = self.conversation.choose_temperature(text, self.profile)
        chat = self.query_one("#chat")
        await chat.mount(MessageView("user", "you", text))
        view = MessageView("assistant", f"{self.profile.name} · {choice.label()}")
        await chat.mount(view)
        chat.anchor()
        self.status(temperature=choice.value, lowered=choice.lowered)
        if self.engine is None or self.engine.state not in ("ready",):
            self.pending = (view, text, choice)
            await view.finish(None, "waiting for the engine; it will be sent when it is ready")
            return
        self._reply(view, text, choice)

    @work(group="reply", exclusive=True)
    async def _reply(self, view: MessageView, prompt: str, choice: TemperatureChoice) -> None:
        await view.finish(None)
        profile, engine = self.profile, self.engine
        recorder = self._recorder()
        # this reply's own figures from its first step on, never the previous reply's
        self.status(engine="streaming", live=True, tokens_per_s=None, acceptance=None, mean_length=None)
        steps: list[Step] = []
        sent, shown = time.monotonic(), 0.0

        def partial() -> ReplyStats:
            """Live figures from step sizes; the server's exact ones come with the last chunk.
            Tokens per step are exact for every method; an acceptance rate needs the
            number of drafts proposed, which step sizes give only for fixed-k methods."""
            live = stats_mod.compute(steps, sent, profile.num_speculative_tokens, temperature=choice.value)
            if profile.method in ADAPTIVE_METHODS:
                live.acceptance_rate = None
            return live

        async def on_step(step: Step) -> None:
            nonlocal shown
            if not steps:
                ticker.stop()
                self.status(engine="streaming")
            await view.append(step)
            steps.append(step)
            if step.at - shown > 0.25:
                shown = step.at
                live = partial()
                self.status(tokens_per_s=live.decode_tokens_per_s, acceptance=live.acceptance_rate, mean_length=live.mean_acceptance_length, tokens_per_step=live.tokens_per_step)

        def waiting() -> None:  # a silent endpoint is visible, second by second
            if not steps:
                self.status(engine=f"waiting {time.monotonic() - sent:.0f}s for the first token")

        ticker = self.set_interval(1.0, waiting)
        try:
            try:
                outcome = await exchange(engine, profile, self.conversation, prompt, choice, recorder, on_step)
            finally:
                ticker.stop()
        except asyncio.CancelledError:
            self._ids(view, recorder)
            view.cut = True
            cut = partial() if steps else None
            await view.finish(cut, "✂ cut: the partial reply is kept" + (" (figures from step sizes)" if cut else ""), "cut")
            self._after_reply(cut)
            raise
        except ReplyInterrupted as exc:
            self._ids(view, recorder)
            cut = partial() if steps else None
            gone = not await self._still_alive()
            await view.finish(cut, "✗ the engine stopped mid-reply; the partial reply is kept" if gone else f"✗ {exc}", "failed")
            view.cut = True
            self._after_reply(cut)
            self._engine_failed(str(exc), gone)
            return
        except UserError as exc:
            self._ids(view, recorder)
            await view.finish(None, f"✗ {exc}", "failed")
            self.status(engine="ready", live=False)
            return
        self._ids(view, recorder)
        self._after_reply(outcome.stats)
        await view.finish(outcome.stats)

    def _ids(self, view: MessageView, recorder: Recorder) -> None:
        """Link the views to their stored messages; show a store failure once."""
        views = list(self.query(MessageView))
        view.message_id = recorder.last_reply_id
        if len(views) >= 2 and views[-2].role == "user":
            views[-2].message_id = recorder.last_user_id
        if recorder.error is not None:
            self.notify(str(recorder.error), severity="error", timeout=15)
            recorder.error = None

    def _after_reply(self, stats: ReplyStats | None) -> None:
        info = self.query_one(StatusBar).info
        changes = {"engine": "ready" if self.engine else info.engine, "live": False}
        if stats is not None:
            history = info.history + ([stats.decode_tokens_per_s] if stats.decode_tokens_per_s else [])
            changes.update(
                tokens_per_s=stats.decode_tokens_per_s,
                acceptance=stats.acceptance_rate,
                mean_length=stats.mean_acceptance_length,
                tokens_per_step=stats.tokens_per_step,
                context_used=stats.context_tokens,
                history=history,
            )
        self.status(**changes)

    async def _still_alive(self, seconds: float = 1.0) -> bool:
        """Is the engine still up after a broken reply? (a killed engine's socket
        can close a moment before its process is seen to end)"""
        end = time.monotonic() + seconds
        while self.engine is not None and self.engine.alive():
            if time.monotonic() > end:
                return True
            await asyncio.sleep(0.1)
        return False

    def _engine_failed(self, message: str, gone: bool | None = None) -> None:
        if self.engine is not None and not gone and self.engine.alive():
            # the engine is up but this reply broke (a malformed stream, an error, a timeout)
            self.status(engine="ready")
            self.notify(message, severity="error", timeout=20)
            return
        if self.engine is not None:
            self.engine.state = "failed"
        self.status(engine="failed")
        self._panel("The engine stopped", f"{message}\n\nF5 restarts it; your conversation stays.", failed=True)

    def action_cancel_reply(self) -> None:
        self.workers.cancel_group(self, "reply")

    async def _drop_last_exchange(self) -> str | None:
        """Remove the last prompt and its reply from screen, context and store."""
        views = list(self.query(MessageView))
        users = [i for i, v in enumerate(views) if v.role == "user"]
        if not users:
            return None
        self.workers.cancel_group(self, "reply")
        await asyncio.sleep(0)
        last = users[-1]
        prompt = views[last].text
        for view in views[last:]:
            if self.store is not None and getattr(view, "message_id", None):
                try:
                    self.store.delete_message(view.message_id)
                except StoreError as exc:
                    self.notify(str(exc), severity="error")
            await view.remove()
        while self.conversation.messages and self.conversation.messages[-1]["role"] == "assistant":
            self.conversation.messages.pop()
        if self.conversation.messages:
            self.conversation.messages.pop()
        return prompt

    async def action_regenerate(self) -> None:
        prompt = await self._drop_last_exchange()
        if prompt is None:
            self.notify("nothing to regenerate yet")
            return
        await self.send(prompt)

    async def action_edit_last(self) -> None:
        prompt = await self._drop_last_exchange()
        if prompt is None:
            self.notify("no prompt to edit yet")
            return
        area = self.query_one(PromptArea)
        area.text = prompt
        area.focus()

    async def action_new_conversation(self) -> None:
        self.workers.cancel_group(self, "reply")
        self.conversation = Conversation(auto_temperature=self.conversation.auto_temperature)
        self.recorder = None  # a new stored conversation starts with the next prompt
        await self.query_one("#chat").remove_children()
        self.status(context_used=None)
        self.notify("new conversation")

    def action_toggle_auto_temperature(self) -> None:
        self.conversation.auto_temperature = not self.conversation.auto_temperature
        self.status(auto_temperature=self.conversation.auto_temperature)
        self.notify("automatic code temperature " + ("on" if self.conversation.auto_temperature else "off for this session"))

    # ---- code blocks ------------------------------------------------------------------

    def code_blocks(self) -> list[tuple[str, str]]:
        return [block for view in self.query(MessageView) if view.role == "assistant" for block in view.code_blocks()]

    def action_copy_code(self, index: int = -1) -> None:
        blocks = self.code_blocks()
        if not blocks:
            self.notify("no code block to copy yet")
            return
        language, code = blocks[index]
        code, warning = clean_code(code)
        self.copy_to_clipboard(code)
        self.notify(f"copied {len(code.splitlines())} lines of {language or 'code'} to the clipboard")
        if warning:
            self.notify(warning, severity="warning", timeout=15)

    def action_save_code(self, index: int = -1) -> None:
        blocks = self.code_blocks()
        if not blocks:
            self.notify("no code block to save yet")
            return
        language, code = blocks[index]
        code, warning = clean_code(code)
        extension = {"python": "py", "py": "py", "javascript": "js", "js": "js", "typescript": "ts", "rust": "rs", "bash": "sh", "sh": "sh", "go": "go", "java": "java", "c": "c", "cpp": "cpp"}.get(language.lower(), "txt")

        def save(name: str | None) -> None:
            if not name:
                return
            path = Path(name).expanduser()
            if path.exists():
                self.notify(f"{path} exists; choose another name", severity="error")
                return
            try:
                path.write_text(code)
            except OSError as exc:
                self.notify(f"could not save {path}: {exc.strerror}", severity="error")
                return
            self.notify(f"saved {len(code.splitlines())} lines to {path}")
            if warning:
                self.notify(warning, severity="warning", timeout=15)

        self.push_screen(AskText("Save the code block to file:", f"snippet.{extension}"), save)

    # ---- draft tint -------------------------------------------------------------------

    def action_toggle_tint(self) -> None:
        self.tint = not self.tint
        self._apply_tint()

    @work(group="tint", exclusive=True)
    async def _apply_tint(self) -> None:
        views = [v for v in self.query(MessageView) if v.role == "assistant"]
        if self.tint and self.engine is not None:
            wanted = {s.token_ids[-1] for v in views for s in v.steps if len(s.token_ids) > 1} - set(self.token_text)
            await self._detokenize(wanted)
        for view in views:
            view.show_tint(self.tint, self._last_token_text)
        self.notify("draft tint " + ("on: highlighted text came from accepted drafts" if self.tint else "off"))

    def _last_token_text(self, step: Step) -> str:
        return self.token_text.get(step.token_ids[-1], "")

    async def _detokenize(self, ids: set[int]) -> None:
        """The text of single tokens, from the server's /detokenize (cached)."""
        self.token_text.update(await self.engine.detokenize(ids))

    # ---- slash commands ---------------------------------------------------------------

    async def slash(self, text: str) -> None:
        command, _, arg = text.partition(" ")
        arg = arg.strip()
        if command == "/profile":
            if not arg:
                self.action_pick_profile()
            else:
                await self.switch_profile(arg)
        elif command == "/temp":
            try:
                value = parse_temperature(arg)
            except UserError as exc:
                self.notify(str(exc), severity="error")
                return
            self.conversation.forced_temperature = value
            self.notify(f"the next message uses temperature {value:g}")
        elif command == "/system":
            self.conversation.system_prompt = arg
            if self.recorder is not None and self.recorder.conversation_id and self.store is not None:
                self.store.set_system_prompt(self.recorder.conversation_id, arg)
            self.notify("system prompt set" if arg else "system prompt back to the profile's")
        elif command == "/file":
            try:
                block = fenced_file(arg)
            except UserError as exc:
                self.notify(str(exc), severity="error", timeout=8)
                return
            self.conversation.attachments.append(block)
            self.notify(f"attached {arg}; it goes with your next message")
        elif command == "/clear":
            await self.action_new_conversation()
        elif command == "/help":
            self.action_help()
        else:
            self.notify(f"unknown command {command}; /help lists them", severity="error")

    # ---- help and the command palette ---------------------------------------------------

    def binding_rows(self) -> list[tuple[str, str]]:
        rows = [("Enter", "send"), ("Shift+Enter, Ctrl+J", "new line in the prompt"), ("Ctrl+P", "command palette"), ("Ctrl+Q", "quit")]
        rows += [("+".join(part.capitalize() for part in b.key.split("+")), b.tooltip or b.description) for b in self.BINDINGS if not b.action.startswith("switch_index")]
        rows.append(("Alt+1 … Alt+9", "switch to profile 1-9 of the picker"))
        return rows

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.binding_rows()))

    def get_system_commands(self, screen):
        yield from super().get_system_commands(screen)
        yield SystemCommand("Help", "every key and slash command", self.action_help)
        yield SystemCommand("Pick profile", "list the profiles and switch", self.action_pick_profile)
        for name, profile in self.config.profiles.items():
            yield SystemCommand(f"Switch to profile {name}", f"{profile.model or profile.endpoint} · {profile.method or 'no speculation'}", lambda n=name: self.run_worker(self.switch_profile(n), group="switch", exclusive=True))
        yield SystemCommand("Regenerate the last reply", "ask again", self.action_regenerate)
        yield SystemCommand("Edit the last prompt", "put it back in the input", self.action_edit_last)
        yield SystemCommand("New conversation", "clear the screen and the context", self.action_new_conversation)
        yield SystemCommand("History", "stored conversations: open, rename, delete, export", self.action_history)
        yield SystemCommand("Cycle theme", "next termchat theme", self.action_cycle_theme)
        yield SystemCommand("Toggle automatic code temperature", "lower T for code prompts, or not", self.action_toggle_auto_temperature)
        yield SystemCommand("Toggle draft tint", "highlight text from accepted drafts", self.action_toggle_tint)
        yield SystemCommand("Restart the engine", "stop and start the current profile's engine", self.action_restart_engine)
        for number, (language, code) in enumerate(self.code_blocks(), start=1):
            first = code.strip().splitlines()[0][:40] if code.strip() else ""
            yield SystemCommand(f"Copy code block {number}", f"{language or 'code'}: {first}", lambda i=number - 1: self.action_copy_code(i))
            yield SystemCommand(f"Save code block {number}", f"{language or 'code'}: {first}", lambda i=number - 1: self.action_save_code(i))


def run_app(config_file: str | None = None, profile: str | None = None, theme: str | None = None) -> int:
    """Start the TUI; a bad config is shown inside it, not as a traceback."""
    config, error = None, None
    try:
        config = load_config(config_file)
    except UserError as exc:
        error = str(exc)
    TermchatApp(config=config, config_error=error, profile=profile, theme=theme).run()
    return 0
