"""A config file as text: reading it safely, and naming the line of a key.

tomllib gives no positions for values, so every message about a key finds
its line here; `Problem` is one such message, `ConfigError` all of a file's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from termchat import limits
from termchat.errors import UserError


@dataclass(frozen=True)
class Problem:
    file: str
    line: int | None
    key: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


class ConfigError(UserError):
    """A config file with problems; str() lists every one, one per line."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems) + "\nFix the file, then run `termchat profiles check` to confirm.")


class LineIndex:
    """Finds the line of `[table]` headers and `key =` lines in a TOML text.

    tomllib gives no positions for values, so messages about a key use this.
    Dotted keys and inline tables fall back to the table's header line.
    """

    HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
    KEY = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_\-.]+)\s*=""")

    def __init__(self, text: str):
        self.tables: dict[str, int] = {}
        self.keys: dict[tuple[str, str], int] = {}
        table = ""
        for number, line in enumerate(text.splitlines(), start=1):
            header = self.HEADER.match(line)
            if header:
                table = self._norm(header.group(1))
                self.tables.setdefault(table, number)
                continue
            key = self.KEY.match(line)
            if key:
                parts = [p.strip().strip("\"'") for p in key.group(1).split(".")]
                full = ".".join(filter(None, [table, *parts[:-1]]))
                self.keys.setdefault((full, parts[-1]), number)

    @staticmethod
    def _norm(name: str) -> str:
        return ".".join(p.strip().strip("\"'") for p in name.split("."))

    def line(self, table: str, key: str | None = None) -> int | None:
        if key is not None and (table, key) in self.keys:
            return self.keys[(table, key)]
        if key is not None and table and f"{table}.{key}" in self.tables:
            return self.tables[f"{table}.{key}"]
        if table in self.tables:
            return self.tables[table]
        parent = table.rsplit(".", 1)[0] if "." in table else ""
        if parent and parent != table:
            return self.line(parent, table.rsplit(".", 1)[1])
        return None


def read_config_text(path: Path) -> str:
    """The file's text, or a ConfigError saying why it cannot be read as TOML text."""
    try:
        data = limits.read_file(path, limits.CONFIG_FILE, str(path))
    except limits.Refused as exc:
        raise ConfigError([Problem(str(path), None, "", str(exc).removeprefix(f"{path} ") + "; point --config at a TOML file")]) from None
    except FileNotFoundError:
        raise ConfigError([Problem(str(path), None, "", "file not found; check the path (or unset TERMCHAT_CONFIG)")]) from None
    except IsADirectoryError:
        raise ConfigError([Problem(str(path), None, "", "is a folder, not a TOML file")]) from None
    except OSError as exc:
        raise ConfigError([Problem(str(path), None, "", f"cannot be read: {exc.strerror}")]) from None
    data = data.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark, as some editors write
    if b"\x00" in data:
        raise ConfigError([Problem(str(path), 1, "", "not a text file (it contains NUL bytes); point --config at a TOML file")])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError([Problem(str(path), line, "", "not UTF-8 text; save the file as UTF-8 TOML")]) from None
