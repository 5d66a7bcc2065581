"""Where termchat keeps things: the XDG folders via platformdirs.

TERMCHAT_HOME overrides all of them (one folder with config/, cache/, data/,
state/ inside), which tests use to stay out of the user's real folders.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "termchat"


def _home() -> Path | None:
    value = os.environ.get("TERMCHAT_HOME")
    return Path(value) if value else None


def config_dir() -> Path:
    home = _home()
    return home / "config" if home else Path(platformdirs.user_config_dir(APP))


def data_dir() -> Path:
    home = _home()
    return home / "data" if home else Path(platformdirs.user_data_dir(APP))


def state_dir() -> Path:
    home = _home()
    return home / "state" if home else Path(platformdirs.user_state_dir(APP))


def cache_dir() -> Path:
    home = _home()
    return home / "cache" if home else Path(platformdirs.user_cache_dir(APP))


def models_dir() -> Path:
    """Converted models. TERMCHAT_MODELS overrides this folder alone, so a
    throw-away TERMCHAT_HOME (tests) can share the already-converted model."""
    models = os.environ.get("TERMCHAT_MODELS")
    return Path(models) if models else cache_dir() / "models"


def logs_dir() -> Path:
    return state_dir() / "logs"
