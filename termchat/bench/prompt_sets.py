"""Prompt sets: the built-in categories, or a Spec-Bench JSONL file.

The five of Spec-Bench's kinds are the default; `edit` (pasted code of 30-40
lines with a small change asked for and the whole code back: the reply
mostly copies the prompt) is asked for by name.

Spec-Bench format: one JSON object per line with `question_id`, `category`
and `turns` (a list whose first item is the prompt).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from termchat.errors import UserError

CATEGORIES = ("code", "summarization", "extraction", "chat", "creative")
OPT_IN = ("edit",)  # built in, run only when named


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    category: str
    text: str


def parse_jsonl(text: str, source: str) -> list[BenchPrompt]:
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            turns = item["turns"]
            prompt = turns[0] if isinstance(turns, list) else None
            if not isinstance(prompt, str) or not prompt.strip():
                raise ValueError("`turns` must be a list whose first item is the prompt")
            prompts.append(BenchPrompt(str(item.get("question_id", number)), str(item["category"]), prompt))
        except (ValueError, KeyError, TypeError) as exc:
            detail = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
            raise UserError(f"{source}:{number}: not a Spec-Bench line ({detail}); expected {{\"question_id\", \"category\", \"turns\": [prompt]}}") from None
    if not prompts:
        raise UserError(f"{source}: no prompts in the file")
    return prompts


def named(text: str | None) -> list[str] | None:
    """A `--categories` value (comma-separated) as a list; None for every default one."""
    return [c.strip() for c in text.split(",")] if text else None


def builtin(categories: list[str] | None = None) -> list[BenchPrompt]:
    wanted = categories or list(CATEGORIES)
    unknown = [c for c in wanted if c not in CATEGORIES + OPT_IN]
    if unknown:
        raise UserError(f"unknown categories {', '.join(unknown)}; built-in: {', '.join(CATEGORIES + OPT_IN)}")
    folder = resources.files("termchat.bench") / "prompts"
    prompts = []
    for category in wanted:
        prompts += parse_jsonl((folder / f"{category}.jsonl").read_text(encoding="utf-8"), f"{category}.jsonl")
    return prompts


def from_file(path: str, categories: list[str] | None = None) -> list[BenchPrompt]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    prompts = parse_jsonl(text, path)
    if categories:
        prompts = [p for p in prompts if p.category in categories]
        if not prompts:
            raise UserError(f"{path}: no prompts in categories {', '.join(categories)}")
    return prompts
