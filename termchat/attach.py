"""`/file PATH`: a text file as a fenced block with its language.

Binary files and files over MAX_BYTES are refused with a message that says
why and what to do; the prompt being written is kept by the callers.
"""

from __future__ import annotations

from pathlib import Path

from pygments.lexers import get_lexer_for_filename
from pygments.util import ClassNotFound

from termchat.errors import UserError

MAX_BYTES = 256 * 1024


def fenced_file(path_text: str, max_bytes: int = MAX_BYTES) -> str:
    path = Path(path_text).expanduser()
    if not path.exists():
        raise UserError(f"/file: {path} does not exist")
    if path.is_dir():
        raise UserError(f"/file: {path} is a folder; give a file")
    size = path.stat().st_size
    if size > max_bytes:
        raise UserError(f"/file: {path} is {size / 1024:.0f} KiB, over the {max_bytes // 1024} KiB limit; attach a smaller file or the part you need")
    data = path.read_bytes()
    if b"\x00" in data:
        raise UserError(f"/file: {path} is a binary file; only text files can be attached")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"/file: {path} is not UTF-8 text; convert it (iconv) or attach another file") from None
    try:
        language = get_lexer_for_filename(path.name, text).aliases[0]
    except (ClassNotFound, IndexError):
        language = ""
    fence = "````" if "```" in text else "```"
    return f"{path.name}:\n{fence}{language}\n{text.rstrip()}\n{fence}\n"
