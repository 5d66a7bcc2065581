"""The line-mode REPL, driven through prompt-toolkit's pipe input, on the real engine."""

from __future__ import annotations

import asyncio

import pytest
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from termchat.profiles import load_config
from termchat.repl import Repl
from termchat.store import Store

pytestmark = pytest.mark.engine


async def run_repl(keys: str, history, **kwargs) -> tuple[str, Repl]:
    out: list[str] = []
    with create_pipe_input() as pipe:
        repl = Repl(load_config(None), "local", input=pipe, output=DummyOutput(), write=out.append, history_file=history, color=False, **kwargs)
        pipe.send_text(keys)
        await asyncio.wait_for(repl.run(), timeout=300)
    return "".join(out), repl


async def test_repl_answers_a_prompt_and_keeps_history_between_runs(shared_engine, tmp_path):
    history = tmp_path / "history"
    text, repl = await run_repl("Name three colours.\r/temp 0\rWrite a Python function add.\r\x04", history)
    assert "ready" in text
    assert "[T=0.7 (text prompt)]" in text and "[T=0 (set with /temp)]" in text
    assert text.count("tok/s") == 2 and "acceptance" in text
    stored = Store().messages(repl.recorder.conversation_id)
    assert [m.role for m in stored] == ["user", "assistant", "user", "assistant"]
    assert stored[1].content.strip() and stored[1].content.strip()[:20] in text
    # a second run finds the first run's prompts in its history
    text, repl = await run_repl("\x04", history)
    assert "Name three colours." in list(repl.session.history.load_history_strings())
