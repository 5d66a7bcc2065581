"""Make model output inert on a terminal.

A model can emit ANSI escapes, OSC 52 clipboard writes, cursor movement or
bells. Printed raw to a terminal they would act; this removes every escape
sequence and control character except newline and tab. Text going into a
pipe is left unchanged by the callers.
"""

from __future__ import annotations

import re

# CSI ... final, OSC ... (BEL | ST), DCS/SOS/PM/APC ... ST, two-byte ESC x, C1 controls
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[@-Z\\-_]?"
    r"|\x9b[0-?]*[ -/]*[@-~]"
    r"|\x9d[^\x07\x9c]*(?:\x07|\x9c)?"
)
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def inert(text: str) -> str:
    """text without escape sequences or control characters (keeps \\n and \\t)."""
    return _CONTROLS.sub("", _ESCAPES.sub("", text.replace("\r\n", "\n")))
