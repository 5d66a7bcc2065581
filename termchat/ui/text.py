"""Untrusted text for Textual widgets: never markup, never an escape sequence.

Titles, profile names, file names and server errors are shown through
`plain()`: a `Content` built from the sanitized string (a plain `str` given
to an OptionList or a Label is parsed as markup, and `[/]` in a title used to
crash the history screen)."""

from __future__ import annotations

from textual.content import Content

from termchat.sanitize import inert


def plain(text: str) -> Content:
    return Content(inert(text))
