"""A reply's code blocks, taken from its raw text, for copy, save, /apply and the fix loop.

Never from the screen: the screen shows text made inert (invisible
characters as marks such as <U+200D>), and a mark written into a file
changes it. Blocks are found by the parser Textual's Markdown widget uses
(markdown-it, "gfm-like"), so block N here is block N on screen. Escape
sequences and controls are removed (the screen never showed them);
invisible characters are kept, and named in the block's warning.
"""

from __future__ import annotations

from dataclasses import dataclass

from markdown_it import MarkdownIt
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

from termchat.sanitize import clean_code

_PARSER = MarkdownIt("gfm-like")


@dataclass(frozen=True)
class CodeBlock:
    language: str
    code: str
    warning: str  # "" or what was hidden in it (escape sequences, bidi, zero-width...)

    @property
    def extension(self) -> str:
        """The file extension pygments knows for the language ("txt" if none)."""
        try:
            patterns = get_lexer_by_name(self.language).filenames if self.language else []
        except ClassNotFound:
            patterns = []
        return next((p[2:] for p in patterns if p.startswith("*.") and "*" not in p[2:]), "txt")

    def first_line(self, width: int = 40) -> str:
        return self.code.strip().splitlines()[0][:width] if self.code.strip() else ""


def code_blocks(text: str) -> list[CodeBlock]:
    """The fenced (and indented) code blocks of a reply's raw text, in order."""
    blocks = []
    for token in _PARSER.parse(text):
        if token.type in ("fence", "code_block"):
            code, warning = clean_code(token.content if token.content.endswith("\n") else token.content + "\n")
            language = token.info.split()[0] if token.info.strip() else ""
            blocks.append(CodeBlock(language, code, warning))
    return blocks
