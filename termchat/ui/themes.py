"""Themes: one TOML file each, holding Textual's colours and a pygments style.

Built-in themes ship in the wheel as `termchat/themes/` (the top-level
`themes/` folder, force-included by the build); in a checkout they are read
from `themes/` directly. Users add their own in `<config folder>/themes/`;
a user theme with a built-in's name replaces it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from pygments.styles import get_style_by_name
from pygments.util import ClassNotFound
from textual.highlight import HighlightTheme
from textual.theme import Theme

from termchat import limits, paths

COLOR_KEYS = ("primary", "secondary", "accent", "warning", "error", "success", "foreground", "background", "surface", "panel", "boost")


@dataclass(frozen=True)
class TermchatTheme:
    theme: Theme
    code_style: str
    source: str

    @property
    def name(self) -> str:
        return self.theme.name


def builtin_dirs() -> list[Path]:
    """The installed package's themes, then the checkout's top-level folder."""
    found = []
    packaged = resources.files("termchat") / "themes"
    if packaged.is_dir():
        found.append(Path(str(packaged)))
    checkout = Path(__file__).resolve().parents[2] / "themes"
    if checkout.is_dir() and checkout not in found:
        found.append(checkout)
    return found


def load_file(path: Path) -> TermchatTheme:
    raw = limits.read_file(path, 64 << 10, str(path)) if isinstance(path, Path) else path.read_bytes()  # a packaged resource may not be a file
    data = limits.toml_loads(raw.decode("utf-8"), str(path), 64 << 10)
    colors = data.get("colors", {})
    unknown = set(colors) - set(COLOR_KEYS)
    if unknown:
        raise ValueError(f"{path}: unknown colour keys {sorted(unknown)}; known: {', '.join(COLOR_KEYS)}")
    if "primary" not in colors:
        raise ValueError(f"{path}: [colors] needs at least `primary`")
    code_style = data.get("code_style", "monokai" if data.get("dark", True) else "friendly")
    try:
        get_style_by_name(code_style)
    except ClassNotFound:
        raise ValueError(f"{path}: unknown pygments style '{code_style}'") from None
    background = get_style_by_name(code_style).background_color or colors.get("surface") or colors.get("background") or "#000000"
    theme = Theme(name=data.get("name", path.stem), dark=bool(data.get("dark", True)), variables={"code-background": background}, **colors)
    return TermchatTheme(theme, code_style, str(path))


def load_all() -> tuple[dict[str, TermchatTheme], list[str]]:
    """Every theme by name, and one message per user theme file that is broken."""
    themes: dict[str, TermchatTheme] = {}
    problems: list[str] = []
    for folder in builtin_dirs():
        for path in sorted(folder.glob("*.toml")):
            theme = load_file(path)
            themes.setdefault(theme.name, theme)
    user = paths.config_dir() / "themes"
    for path in sorted(user.glob("*.toml")) if user.is_dir() else []:
        try:
            theme = load_file(path)
        except (ValueError, OSError, tomllib.TOMLDecodeError) as exc:
            problems.append(f"theme {path} skipped: {exc}")
            continue
        themes[theme.name] = theme
    return themes, problems


def highlight_theme(style_name: str) -> type[HighlightTheme]:
    """A Textual HighlightTheme whose token styles come from a pygments style."""
    style = get_style_by_name(style_name)
    styles = {}
    for token, spec in style:
        parts = []
        if spec.get("color"):
            parts.append("#" + spec["color"])
        for flag in ("bold", "italic", "underline"):
            if spec.get(flag):
                parts.append(flag)
        if parts:
            styles[token] = " ".join(parts)
    return type(f"Pygments_{style_name.replace('-', '_')}", (HighlightTheme,), {"STYLES": styles})
