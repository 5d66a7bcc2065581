"""One message in the conversation: header, streamed Markdown body, footer.

Replies are appended through Textual's MarkdownStream (`Markdown.get_stream`),
which parses only the tail of the document: the cost per step stays flat as
the reply grows, where re-rendering the whole message per token grows with
it (measured: ~2,100 vs ~5 chunks/s, NOTES-vllm-cpu.md).
"""

from __future__ import annotations

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
        self._stream = None
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
        """Add one engine step to the reply (through the Markdown stream)."""
        self.steps.append(step)
        self.text += step.text
        if not self.is_attached:
            return
        if self._stream is None:
            self._stream = Markdown.get_stream(self.body)
        await self._stream.write(self._clean.feed(step.text))

    async def finish(self, stats: ReplyStats | None, note: str = "", note_class: str = "") -> None:
        """Close the stream and show the statistics (or why the reply ended early)."""
        self.stats = stats
        if not self.is_attached:  # removed from the screen: nothing to show
            self._stream = None
            return
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
            # stop() can return while a shielded append is still mounting
            # blocks; the widget's lock is released when the last one is done
            async with self.body.lock:
                pass
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
