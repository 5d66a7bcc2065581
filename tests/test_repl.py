"""The line-mode REPL, driven through prompt-toolkit's pipe input, on the real engine."""

from __future__ import annotations

import asyncio
import json

import pytest
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from termchat.slash import dispatch
from termchat.profiles import load_config
from termchat.repl import Repl
from termchat.chat.store import Store

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
    assert "[T=0.7, freq 0.5 (text prompt)]" in text and "[T=0 (set with /temp)]" in text  # the text guard is shown
    assert text.count("tok/s") == 2 and "acceptance" in text
    stored = Store().messages(repl.session.conversation_id)
    assert [m.role for m in stored] == ["user", "assistant", "user", "assistant"]
    assert stored[1].content.strip() and stored[1].content.strip()[:20] in text
    # a second run finds the first run's prompts in its history
    text, repl = await run_repl("\x04", history)
    assert "Name three colours." in list(repl.prompt.history.load_history_strings())


async def test_file_goes_with_the_next_message_only_as_a_fenced_block(shared_engine, tmp_path):
    source = tmp_path / "adder.py"
    source.write_text("def add(a, b):\n    return a + b\n")
    keys = f"/file {source}\rName the function in one word.\rSay yes.\r\x04"
    text, repl = await run_repl(keys, tmp_path / "history")
    assert f"attached {source}" in text
    stored = [m for m in Store().messages(repl.session.conversation_id) if m.role == "user"]
    assert stored[0].content.startswith("Name the function in one word.\n\n")
    assert "```python" in stored[0].content and "def add(a, b):\n    return a + b" in stored[0].content
    assert stored[1].content == "Say yes."  # the attachment was used once


async def test_the_repl_has_the_coding_commands_of_the_table(shared_engine, tmp_path, monkeypatch):
    """/run, /add, /apply (diff, then y), /undo and /edit, from the one command table."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    keys = "\r".join([
        "/run echo out-of-run",
        "/add",
        "Reply with exactly this block and nothing else:\n```python\ndef add(a, b):\n    return a + b\n```",
        "/apply 1 calc.py", "n",
        "/undo",
        "/edit 1",
        "",  # Enter sends the edited message (put back in the prompt) on the new branch
    ]) + "\r\x04"
    text, repl = await run_repl(keys, tmp_path / "history")
    assert "out-of-run" in text and "exit 0" in text
    store = Store()
    branch = repl.session.conversation_id
    original = store.conversation(branch).parent_id  # /edit 1 forked it
    assert original is not None and "editing on a new branch" in text
    sent = [m for m in store.messages(original) if m.role == "user"]
    assert "Output of `echo out-of-run` (exit 0)" in sent[0].content  # /add sent it with the next message
    assert "--- a/calc.py" in text and "+++ b/calc.py" in text  # the diff came before the question
    assert "nothing written" in text and (tmp_path / "calc.py").read_text() == "def add(a, b):\n    return a - b\n"
    assert "nothing to undo" in text
    replayed = store.messages(branch)
    assert [m.role for m in replayed] == ["user", "assistant"] and replayed[0].content == sent[0].content
    assert len(store.messages(original)) == 2  # the old branch is kept as it was


FAILING_TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5, 'two and three make five'\n"


@pytest.mark.parametrize("fixed", [True, False])
async def test_the_repl_fix_loop_applies_tests_and_stops_when_green_or_out_of_rounds(tmp_path, monkeypatch, fixed):
    """/fix 3 in the REPL. The model's replies are scripted (a stand-in for
    the model: the default 135M one cannot write this fix); the writes and the
    pytest runs are real. The good fix names its file on its first line; the
    bad one names none and goes where the last /apply wrote."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_calc.py").write_text(FAILING_TEST)
    (tmp_path / "tests" / "conftest.py").write_text(f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n")
    fix = "# calc.py\ndef add(a, b):\n    return a + b\n" if fixed else "def add(a, b):\n    return a * b\n"
    out: list[str] = []
    with create_pipe_input() as pipe:
        repl = Repl(load_config(None), "local", input=pipe, output=DummyOutput(), write=out.append, history_file=tmp_path / "history", color=False)
        sent: list[str] = []

        async def scripted_send(text: str) -> bool:  # the model's turn, scripted
            sent.append(text)
            repl.session.conversation.add("user", text)
            repl.session.conversation.add("assistant", f"Here:\n\n```python\n{fix}```\n")
            return True

        repl.send = scripted_send
        repl.applied = [] if fixed else [tmp_path / "calc.py"]  # as a first /apply calc.py leaves it
        await repl.do_test("")
        assert repl.last_failure is not None
        await repl.do_fix("3")
    text = "".join(out)
    assert "tests/test_calc.py::test_add" in sent[0] and "two and three make five" in sent[0]
    assert "+    return a " in text  # each round's diff is shown, though not asked for
    if fixed:
        assert len(sent) == 1 and "tests pass after the fix" in text and repl.last_failure is None
        assert (tmp_path / "calc.py").read_text() == fix
        repl.undo.undo()
        assert (tmp_path / "calc.py").read_text() == "def add(a, b):\n    return a - b\n"  # the loop's write is undoable
    else:
        assert len(sent) == 3 and "still fail after the rounds asked for" in text and repl.last_failure is not None
        assert (tmp_path / "calc.py").read_text() == fix


async def test_cd_in_the_repl_moves_where_run_and_test_start(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    out: list[str] = []
    with create_pipe_input() as pipe:
        repl = Repl(load_config(None), "local", input=pipe, output=DummyOutput(), write=out.append, history_file=tmp_path / "history", color=False)
        await dispatch(repl, "/cd sub")
        await dispatch(repl, "/run pwd")
        await dispatch(repl, "/cd ../missing")
    text = "".join(out)
    assert f"working in {(tmp_path / 'sub').resolve()}" in text and repl.last_run.output.strip() == str((tmp_path / "sub").resolve())
    assert "no folder" in text


async def test_set_changes_sampling_for_the_session_and_off_goes_back(shared_engine, tmp_path):
    """`/set stop WORD` ends the reply before WORD (the engine applies it); `/set stop off` goes back."""
    ask = "/temp 0\rName three animals and say one thing about each.\r"
    text, repl = await run_repl(ask + "\x04", tmp_path / "history")
    (full,) = [m.content for m in Store().messages(repl.session.conversation_id) if m.role == "assistant"]
    words = full.split()
    word = words[len(words) // 2]  # a word from the middle of the greedy reply
    keys = f"/set stop {json.dumps(word)}\r" + ask + "/clear\r/set stop off\r" + ask + "/set\r/set top_k 0\r\x04"
    text, repl = await run_repl(keys, tmp_path / "history")
    conversations = Store().conversations(limit=2)  # /clear started a second one
    replies = [m.content for c in reversed(conversations) for m in Store().messages(c.id) if m.role == "assistant"]
    assert replies == [full[: full.index(word)], full], (word, replies)
    assert f"stop = ({word!r},) for the rest of this session" in text and "stop is back to the profile's" in text
    assert "sampling: top_p 0.95, max_tokens 512, top_k server default" in text
    assert "/set top_k: 0 is out of range [1, 1048576]" in text and repl.session.knobs == {}
