"""One message in the conversation: header, streamed Markdown body, footer.

Replies are appended with Textual's `Markdown.append`, which parses only the
tail of the document: the cost per step stays flat as the reply grows, where
re-rendering the whole message per token grows with it (measured: ~2,100 vs
~5 chunks/s, NOTES-vllm-cpu.md).

The appends are paced (`Pacer`): a long code fence is highlighted and drawn
whole at every update, so at one update per engine step the view took 0.8 of
a core at 80 tok/s, from the cores the engine decodes on (a reply in the TUI
decoded at 0.45-0.6x of `termchat ask`). An update waits until the last
one's parsing and drawing cost at most VIEW_SHARE of a core (bench README,
"The chat view").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine

from textual.css.query import NoMatches
from textual.containers import Vertical
from textual.content import Content
from textual.highlight import HighlightTheme, highlight
from textual.widgets import Markdown, Static
from textual.widgets.markdown import MarkdownFence

from termchat.engine.stats import ReplyStats, Step
from termchat.coding.reply_code import CodeBlock, code_blocks
from termchat.sanitize import Sanitizer, inert


class ThemedFence(MarkdownFence):
    """A code fence highlighted with the current theme's pygments style.

    The style is process-wide (`ThemedFence.code_theme`, set by the app when
    the theme changes): highlighting runs once per fence update, in the
    classmethod MarkdownFence already calls, so streaming pays for it once."""

    code_theme: type[HighlightTheme] = HighlightTheme

    @classmethod
    def highlight(cls, code: str, language: str, ansi: bool = False, dark: bool = False) -> Content:
        return highlight(code, language=language or None, theme=cls.code_theme)


class ChatMarkdown(Markdown):
    BLOCKS = {**Markdown.BLOCKS, "fence": ThemedFence, "code_block": ThemedFence}


VIEW_SHARE = 0.15  # of one core, for the streamed reply's parsing, highlighting and drawing
UPDATE_EVERY_S = (0.05, 1.0)  # at most 20 updates a second, at least one


class Pacer:
    """A reply's text, shown at a pace the CPU allows.

    `write` holds fragments back and starts a run (through `start`, the
    view's worker) when none is going. A run shows what has gathered, waits
    until the screen has drawn it, then waits until that update's cost on
    the event loop's thread (`time.thread_time`) is at most VIEW_SHARE of the
    time since it began; it ends when nothing more came meanwhile, so an idle
    reply has nothing running. `close` waits for a run that has begun to end,
    then shows what is left itself. Nothing is shown after close; fragments
    keep their order."""

    def __init__(self, show: Callable[[str], Awaitable[None]], drawn: Callable[[], Awaitable[None]], start: Callable[[Coroutine], object]):
        self._show, self._drawn, self._start = show, drawn, start
        self._pending: list[str] = []
        self._closing = False
        self._wake = asyncio.Event()  # set by close: a run's pause ends at once
        self._run_done: asyncio.Event | None = None  # the run going, if any
        self._run_began = False
        self.updates = 0

    def write(self, fragment: str) -> None:
        if not fragment or self._closing:
            return
        self._pending.append(fragment)
        if self._run_done is None:
            self._run_done, self._run_began = asyncio.Event(), False
            self._start(self._run(self._run_done))

    async def _flush(self) -> None:
        text = "".join(self._pending)
        self._pending.clear()
        if text:
            self.updates += 1
            await self._show(text)

    async def _run(self, done: asyncio.Event) -> None:
        self._run_began = True
        try:
            while self._pending and not self._closing:
                began, cpu = time.monotonic(), time.thread_time()
                await self._flush()
                await self._drawn()
                low, high = UPDATE_EVERY_S
                pause = min(high, max(low, (time.thread_time() - cpu) / VIEW_SHARE)) - (time.monotonic() - began)
                if pause > 0 and not self._closing:
                    try:
                        await asyncio.wait_for(self._wake.wait(), pause)
                    except asyncio.TimeoutError:
                        pass
        finally:  # also when cancelled (the view removed mid-reply)
            if self._run_done is done:
                self._run_done = None
            done.set()

    async def close(self) -> None:
        self._closing = True
        self._wake.set()
        done = self._run_done
        if done is not None and self._run_began:  # a run that never began never will show anything
            await done.wait()
        await self._flush()


PROMPT_SHOWN = 16_000  # characters of a sent prompt shown on screen


def shown_prompt(text: str) -> str:
    """A sent prompt as shown: whole, or its start and end with what lies between counted."""
    if len(text) <= PROMPT_SHOWN:
        return text
    head, tail = text[: PROMPT_SHOWN * 3 // 4], text[-PROMPT_SHOWN // 4 :]
    return f"{head}\n\n[... {len(text) - len(head) - len(tail):,} more characters, sent and stored whole ...]\n\n{tail}"


class MessageView(Vertical):
    """A user prompt or an assistant reply, with what produced it."""

    def __init__(self, role: str, header: str, text: str = "", **kwargs):
        super().__init__(classes=role, **kwargs)
        self.role = role
        self.text = text
        self.steps: list[Step] = []
        self.stats: ReplyStats | None = None
        self.cut = False
        self.message_id: int | None = None  # the stored message, when there is one
        self.prompt_view: MessageView | None = None  # a reply's prompt, on screen above it
        self._header = header
        self._pacer: Pacer | None = None
        self._clean = Sanitizer()  # one per reply: live view == replay, whatever the chunks

    def compose(self):
        yield Static(inert(self._header), classes="header", markup=False)
        if self.role == "user":
            # what the user typed, line breaks and all (pasted code has no fences); a paste of
            # megabytes is shown in part (laying out 5 MB took seconds), and sent and stored whole
            yield Static(inert(shown_prompt(self.text)), classes="user-text", markup=False)
            return
        yield ChatMarkdown(inert(self.text))
        yield Static("", classes="tint")
        yield Static("", classes="footer", markup=False)

    @property
    def body(self) -> ChatMarkdown:
        return self.query_one(ChatMarkdown)

    async def append(self, step: Step) -> None:
        """Add one engine step to the reply (shown at the Pacer's pace)."""
        self.steps.append(step)
        self.text += step.text
        if not self.is_attached:
            return
        if self._pacer is None:
            # its runs are the view's workers: Textual cancels them if the view is removed mid-reply
            self._pacer = Pacer(self._show, self._drawn, lambda run: self.run_worker(run, name="reply view", group="view"))
        self._pacer.write(self._clean.feed(step.text))

    async def _show(self, text: str) -> None:
        if not self.is_attached:  # removed meanwhile: nothing to show it on
            return
        try:
            body = self.body
        except NoMatches:
            return
        await body.append(text)

    async def _drawn(self) -> None:
        drawn = asyncio.Event()
        if self.is_attached and self.call_after_refresh(drawn.set):
            try:
                await asyncio.wait_for(drawn.wait(), UPDATE_EVERY_S[1])
            except asyncio.TimeoutError:
                pass

    async def finish(self, stats: ReplyStats | None, note: str = "", note_class: str = "") -> None:
        """Show the rest of the reply and its statistics (or why it ended early)."""
        self.stats = stats
        pacer, self._pacer = self._pacer, None
        if pacer is not None:
            await pacer.close()
        if not self.is_attached:  # removed from the screen: nothing to show
            return
        footer = self.query_one(".footer", Static)
        parts = [inert(note)] if note else []
        if stats is not None:
            parts.append(stats.short())
        footer.update(" · ".join(parts))
        footer.display = bool(parts)
        if note_class:
            footer.add_class(note_class)

    def code_blocks(self) -> list[CodeBlock]:
        """Every code block of this reply, from its raw text (reply_code.py):
        the fences on screen hold the inert copy, with marks in place of
        invisible characters."""
        if self.role != "assistant":
            return []
        return code_blocks(self.text)

    def show_tint(self, on: bool, last_token_text) -> None:  # assistant messages only
        """Tint the text that came from accepted drafts.

        A step of n tokens accepted n - 1 drafts; its last token is the
        target's own. `last_token_text(step)` gives that token's text."""
        if not on or self.role != "assistant":
            self.remove_class("tinted")
            return
        content, clean = Content(""), Sanitizer()
        for step in self.steps:
            text = clean.feed(step.text)
            if len(step.token_ids) > 1:
                own = inert(last_token_text(step))
                drafted = text[: len(text) - len(own)] if own and text.endswith(own) else text
                content += Content.styled(drafted, "$text-success on $success-muted") + Content(text[len(drafted):])
            else:
                content += Content(text)
        self.query_one(".tint", Static).update(content)
        self.add_class("tinted")
