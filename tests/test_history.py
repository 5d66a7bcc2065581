"""Conversations survive: `ask` records, and kill -9 mid-reply loses at most a second."""

from __future__ import annotations

import json
import os
import select
import signal
import sqlite3
import subprocess
import time

import pytest

from termchat import cli
from termchat.chat.store import Store

from .conftest import ROOT, TERMCHAT

pytestmark = pytest.mark.engine

# greedy and long: the 135M model counts on for hundreds of tokens, so the kill
# always lands mid-reply (a story at T=0.8 sometimes ended before it). Its count
# degenerates into "1234567890..." that suffix decoding drafts at ~315 tok/s, so
# 3,000 tokens (~10 s) leave the kill, ~2 s in, a wide margin (1,000 left ~1 s)
STORY = "Count from 1 to 400, separated by commas."


def read_for(proc, seconds: float) -> bytes:
    """What the process printed during `seconds`."""
    got = b""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ready, _, _ = select.select([proc.stdout], [], [], 0.05)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            got += chunk
    return got


def test_kill_9_of_ask_mid_reply_keeps_the_prompt_and_the_partial_reply(shared_engine, capsys):
    before = {c.id for c in Store().conversations()}
    proc = subprocess.Popen([*TERMCHAT, "ask", "--temperature", "0", "--max-tokens", "3000", STORY], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT)
    screen = b""
    deadline = time.monotonic() + 120
    while len(screen) < 200 and time.monotonic() < deadline:  # the reply is under way
        screen += read_for(proc, 0.2)
    screen += read_for(proc, 1.5)
    os.kill(proc.pid, signal.SIGKILL)
    screen += proc.stdout.read()  # what was already in the pipe reached the screen too
    proc.wait()
    shown = screen.decode("utf-8", "replace")
    assert len(shown) >= 200

    store = Store()
    new = [c for c in store.conversations() if c.id not in before]
    assert len(new) == 1
    messages = store.messages(new[0].id)
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[0].content == STORY
    reply = messages[1]
    assert reply.flagged == "interrupted"
    assert shown.startswith(reply.content)  # what was saved is what was shown...
    lost = len(shown) - len(reply.content)
    per_second = len(shown) / 1.7  # ...less at most about a second of it
    assert lost <= per_second * 1.2, (lost, per_second)

    assert cli.main(["history", "show", str(new[0].id)]) == 0
    out = capsys.readouterr().out
    assert STORY in out and "[interrupted]" in out and reply.content[:50] in out


def test_ask_with_a_locked_database_still_answers_and_says_so(shared_engine):
    path = Store().path
    before = [c.id for c in Store().conversations()]
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another program holds the database
    try:
        result = subprocess.run([*TERMCHAT, "ask", "--temperature", "0", "--max-tokens", "8", "Name a colour."], capture_output=True, text=True, cwd=ROOT, timeout=300)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()  # the reply was shown
    assert "locked by another termchat" in result.stderr and "Traceback" not in result.stderr
    assert [c.id for c in Store().conversations()] == before  # nothing half-written


def test_ask_records_its_exchange_unless_no_save(shared_engine):
    before = len(Store().conversations())
    result = subprocess.run([*TERMCHAT, "ask", "--json", "--max-tokens", "16", "Name a colour."], capture_output=True, text=True, cwd=ROOT, timeout=300)
    data = json.loads(result.stdout)
    store = Store()
    messages = store.messages(data["conversation_id"])
    assert [(m.role, m.content) for m in messages] == [("user", "Name a colour."), ("assistant", data["text"])]
    assert messages[1].flagged == "" and messages[1].stats.output_tokens == data["output_tokens"]
    assert messages[1].profile == "local" and messages[1].method == "suffix" and messages[1].temperature == 0.7
    subprocess.run([*TERMCHAT, "ask", "--no-save", "--max-tokens", "8", "Name a fruit."], capture_output=True, text=True, cwd=ROOT, timeout=300, check=True)
    assert len(Store().conversations()) == before + 1


def test_history_commands_list_export_delete(shared_engine, tmp_path, capsys):
    store = Store()
    conv = store.new_conversation("local")
    store.add_message(conv, "user", "export me")
    store.add_message(conv, "assistant", "```python\nprint('hi')\n```\n", profile="local")
    assert cli.main(["history", "list", "--search", "export me"]) == 0
    assert "export me" in capsys.readouterr().out
    target = tmp_path / "c.md"
    assert cli.main(["history", "export", str(conv), "--format", "md", "-o", str(target)]) == 0
    assert "```python\nprint('hi')\n```" in target.read_text()
    assert cli.main(["history", "delete", str(conv)]) == 0
    assert cli.main(["history", "show", str(conv)]) == 2
    assert "no conversation" in capsys.readouterr().err
