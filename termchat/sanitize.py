"""Untrusted text made inert and visible for a terminal: one path for all of it.

Model output, server errors, file contents, stored titles: printed raw, an
escape sequence would act (colours, cursor moves, an OSC 52 clipboard write),
and bidi overrides or zero-width characters would hide what code does. Every
display path goes through `Sanitizer` (streamed) or `inert()` (whole text):

- escape sequences (CSI, OSC, DCS/SOS/PM/APC strings, two-byte ESC x) and
  every C0/C1 control except newline and tab are removed;
- every character Unicode calls default-ignorable (Default_Ignorable_Code_Point:
  zero-width characters, invisible operators, tag characters, variation
  selectors, Hangul fillers, soft hyphens...), the bidi controls, the
  interlinear annotations (U+FFF9-FFFB) and the Unicode line and paragraph
  separators (U+2028, U+2029) are shown as visible marks such as <U+202E>.
  The table is Unicode's own, through the `regex` package's properties
  (the standard library's unicodedata does not expose them), never a list
  picked by hand.

It is one state machine fed character by character, so a reply sanitized in
chunks as it streams equals the same text sanitized whole on replay, whatever
the chunk boundaries. A string sequence (OSC...) that is never terminated
ends at the next newline: it can hide the rest of its line, never the rest of
a message. Text going into a pipe is left unchanged by the callers.
"""

from __future__ import annotations

import shlex

import regex

BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")
ZERO_WIDTH = frozenset("\u200b\u200c\u200d\u2060\ufeff\u180e")
# invisible operators (function application, invisible times...), deprecated
# format controls, interlinear annotations, and the tag characters (U+E0000-E007F:
# ASCII that no terminal shows, the carrier of "ASCII smuggling")
INVISIBLE = frozenset(map(chr, [*range(0x2061, 0x2065), *range(0x206A, 0x2070), *range(0xFFF9, 0xFFFC), *range(0xE0000, 0xE0080)]))
# U+2028/U+2029: a terminal shows no line break, but JavaScript ends a line
# (and a // comment) there, and Python's str.splitlines splits there
LINE_SEPARATORS = frozenset("\u2028\u2029")
# everything a terminal does not show as such, from Unicode's properties
_HIDDEN = regex.compile(r"[\p{Default_Ignorable_Code_Point}\p{Bidi_Control}\p{Variation_Selector}\u2028\u2029\ufff9-\ufffb]")
_FIRST_HIDDEN = 0xAD  # U+00AD SOFT HYPHEN: nothing below it is hidden


def is_hidden(ch: str) -> bool:
    return ord(ch) >= _FIRST_HIDDEN and _HIDDEN.match(ch) is not None

_GROUND, _ESC, _ESC_INTER, _CSI, _STRING, _STRING_ESC = range(6)
_STRING_INTRODUCERS = "]PX^_"  # OSC, DCS, SOS, PM, APC
_C1_STRINGS = "\x90\x98\x9d\x9e\x9f"


def mark(ch: str) -> str:
    return f"<U+{ord(ch):04X}>"


class Sanitizer:
    """Feed text in any chunks; what comes out is safe to show on a terminal."""

    def __init__(self, show_hidden: bool = True) -> None:
        self.state = _GROUND
        # False (code for a file): keep invisible characters as they are, and
        # carriage returns (line endings), naming them in a warning instead
        self.show_hidden = show_hidden

    def feed(self, text: str) -> str:
        out: list[str] = []
        for ch in text:
            self._char(ch, out)
        return "".join(out)

    def _char(self, ch: str, out: list[str]) -> None:
        state, code = self.state, ord(ch)
        if state == _ESC:
            if ch == "[":
                self.state = _CSI
            elif ch in _STRING_INTRODUCERS:
                self.state = _STRING
            elif 0x20 <= code <= 0x2F:
                self.state = _ESC_INTER
            elif 0x30 <= code <= 0x7E:
                self.state = _GROUND  # a two-byte sequence, dropped
            else:
                self.state = _GROUND
                self._char(ch, out)
            return
        if state == _ESC_INTER:
            if 0x20 <= code <= 0x2F:
                return
            self.state = _GROUND
            if not 0x30 <= code <= 0x7E:
                self._char(ch, out)
            return
        if state == _CSI:
            if 0x20 <= code <= 0x3F:
                return  # parameters and intermediates
            self.state = _GROUND
            if not 0x40 <= code <= 0x7E:  # not a final byte: the sequence was broken off
                self._char(ch, out)
            return
        if state in (_STRING, _STRING_ESC):
            if ch == "\n":  # unterminated: the sequence ends with its line
                self.state = _GROUND
                out.append(ch)
            elif ch in "\x07\x9c" or (state == _STRING_ESC and ch == "\\"):
                self.state = _GROUND
            else:
                self.state = _STRING_ESC if ch == "\x1b" else _STRING
            return
        # ground
        if ch == "\x1b":
            self.state = _ESC
        elif ch == "\x9b":
            self.state = _CSI
        elif ch in _C1_STRINGS:
            self.state = _STRING
        elif ch in "\n\t" or (ch == "\r" and not self.show_hidden):
            out.append(ch)
        elif code < 0x20 or 0x7F <= code <= 0x9F:
            pass  # other C0 and C1 controls, DEL
        elif self.show_hidden and is_hidden(ch):
            out.append(mark(ch))
        else:
            out.append(ch)


def inert(text: str) -> str:
    """The whole text sanitized (what a streamed Sanitizer gives, in one go)."""
    return Sanitizer().feed(text)


def one_line(text: str, limit: int = 400) -> str:
    """Untrusted text for a one-line message (server errors, titles): inert,
    newlines folded, cut at `limit` characters."""
    flat = " ".join(inert(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def hidden_characters(text: str) -> list[str]:
    """Escape sequences, controls and invisible characters in `text` that a
    terminal would not show as such (for warnings on copied or saved code)."""
    found = []
    if "\x1b" in text or any(0x80 <= ord(c) <= 0x9F for c in text):
        found.append("escape sequences")
    if any((ord(c) < 0x20 and c not in "\n\t\r\x1b") or ord(c) == 0x7F for c in text):
        found.append("control characters")
    if any(c in BIDI for c in text):
        found.append("bidi controls")
    if any(c in ZERO_WIDTH for c in text):
        found.append("zero-width characters")
    if any(c in INVISIBLE for c in text):
        found.append("invisible operators or tag characters")
    if any(c in LINE_SEPARATORS for c in text):
        found.append("Unicode line separators")
    named = BIDI | ZERO_WIDTH | INVISIBLE | LINE_SEPARATORS
    if any(c not in named and is_hidden(c) for c in text):
        found.append("other invisible characters (fillers, variation selectors, soft hyphens)")
    return found


def clean_code(code: str) -> tuple[str, str]:
    """A code block for the clipboard or a file: escape sequences and controls
    removed (the screen never showed them), plus a warning naming what was
    hidden in it ("" when nothing). Bidi and zero-width characters are kept
    (they may be meant) but named, since they can hide what the code does."""
    found = hidden_characters(code)
    cleaned = Sanitizer(show_hidden=False).feed(code)
    if not found:
        return cleaned, ""
    removed = [f for f in found if f in ("escape sequences", "control characters")]
    kept = [f for f in found if f not in removed]
    parts = []
    if removed:
        parts.append(f"{' and '.join(removed)} removed")
    if kept:
        named = ", ".join(dict.fromkeys(mark(c) for c in code if is_hidden(c)))
        parts.append(f"it contains {' and '.join(kept)} ({named[:200]}), kept as they are, which can hide what the code does: read it before running it")
    return cleaned, "this code block had hidden content: " + "; ".join(parts)


# ---- bytes in -----------------------------------------------------------------------------

NOT_UTF8 = "was not valid UTF-8; the bytes that were not are shown as U+FFFD (�)"


def decoded(data: bytes) -> tuple[str, bool]:
    """Bytes from outside (stdin, a file) as text, the one way everywhere:
    UTF-8, undecodable bytes replaced with U+FFFD; and whether any were."""
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return data.decode("utf-8", "replace"), True


def valid(text: str) -> tuple[str, bool]:
    """A str from the system (arguments, the environment, a terminal) made
    valid text: Python keeps bytes that are not UTF-8 as lone surrogates
    (surrogateescape), which SQLite, httpx and the tokenizer refuse. They
    become U+FFFD, as in `decoded`; and whether there were any."""
    try:
        text.encode("utf-8")
        return text, False
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape" if _escaped_only(text) else "replace").decode("utf-8", "replace"), True


def _escaped_only(text: str) -> bool:
    """Are all surrogates in `text` surrogateescape's (U+DC80-U+DCFF, one raw byte each)?"""
    return all(0xDC80 <= ord(c) <= 0xDCFF for c in text if 0xD800 <= ord(c) <= 0xDFFF)


def shell_word(text: str) -> str:
    """`text` as one shell word that means exactly `text` and shows nothing
    hidden: shlex.quote where every character is printable, else bash's
    $'...' with escape sequences, controls and invisible characters spelled
    out (a printed command is the one that runs, and safe on a terminal)."""
    if text.isprintable() and not any(is_hidden(c) for c in text):
        return shlex.quote(text)
    out = []
    for ch in text:
        if ch in "\\'":
            out.append("\\" + ch)
        elif ch.isprintable() and not is_hidden(ch):
            out.append(ch)
        elif ord(ch) < 0x100:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return "$'" + "".join(out) + "'"


def shell_line(words: list[str]) -> str:
    return " ".join(shell_word(str(w)) for w in words)
