"""The SQLite store: migrations, streaming writes, export, a locked database."""

from __future__ import annotations

import json
import sqlite3
import time

import pytest

from termchat.engine.stats import ReplyStats
from termchat.chat.reply import ReplyWriter
from termchat.chat.store import COMPLETE, CUT, MIGRATIONS, STREAMING, Store, StoreError

REPLY = """Here you go:

```python
def add(a, b):
    return a + b
```

and in JavaScript:

```js
const add = (a, b) => a + b;
```
"""


def test_fresh_database_is_at_the_latest_version_in_wal_mode(tmp_path):
    store = Store(tmp_path / "t.db")
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_an_older_database_is_migrated_and_keeps_its_data(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(MIGRATIONS[0] + "; PRAGMA user_version = 1;")
    db.execute("INSERT INTO conversations (title, profile, created, updated) VALUES ('old', 'local', 1, 1)")
    db.commit()
    db.close()
    store = Store(path)
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    conv = store.conversations()[0]
    assert conv.title == "old" and conv.system_prompt == ""


def test_reply_writer_flushes_while_streaming_and_flags_the_end(tmp_path):
    store = Store(tmp_path / "t.db")
    conv = store.new_conversation("local")
    store.add_message(conv, "user", "hello")
    writer = ReplyWriter(store, conv, interval=0.2, profile="local", temperature=0.7)
    assert store.messages(conv)[-1].status == STREAMING  # the reply row exists before any text
    writer.append("first part ")
    time.sleep(0.25)
    writer.append("second part ")  # more than `interval` since the last write: flushed now
    assert store.messages(conv)[-1].content == "first part second part "
    writer.append("unflushed")
    assert store.messages(conv)[-1].content == "first part second part "
    writer.finish(CUT)
    last = store.messages(conv)[-1]
    assert last.content == "first part second part unflushed" and last.flagged == CUT
    assert store.conversations()[0].title == "hello"


def test_export_round_trip_keeps_every_message_and_code_block(tmp_path):
    store = Store(tmp_path / "t.db")
    conv = store.new_conversation("local")
    store.add_message(conv, "user", "Write add in two languages.")
    store.add_message(conv, "assistant", REPLY, profile="local", model="termchat:smollm2-135m-instruct", method="ngram", temperature=0.0, lowered=True,
                      stats=ReplyStats(output_tokens=40, decode_tokens_per_s=31.5, ttft_s=0.2, acceptance_rate=0.61, mean_acceptance_length=3.2))
    store.add_message(conv, "user", "Thanks!")
    store.add_message(conv, "assistant", "You're welcome.", status=CUT, profile="local")
    md = store.export_markdown(conv)
    for block in ("```python\ndef add(a, b):\n    return a + b\n```", "```js\nconst add = (a, b) => a + b;\n```"):
        assert block in md
    for text in ("Write add in two languages.", "Thanks!", "You're welcome."):
        assert text in md
    assert "31.5 tok/s" in md and "acceptance 61%" in md and "T=0 (lowered for code)" in md and "cut" in md
    data = json.loads(store.export_json(conv))
    assert [m["content"] for m in data["messages"]] == [m.content for m in store.messages(conv)]
    assert data["messages"][1]["stats"]["acceptance_rate"] == 0.61


def test_a_locked_database_gives_a_clear_message_and_damages_nothing(tmp_path):
    path = tmp_path / "t.db"
    store = Store(path, timeout=0.1)
    conv = store.new_conversation("local")
    store.add_message(conv, "user", "kept")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    with pytest.raises(StoreError, match="locked by another termchat"):
        store.add_message(conv, "user", "lost?")
    writer = ReplyWriter(store, conv)
    assert writer.error is not None and "locked" in str(writer.error)
    writer.append("still streaming")  # no exception: the reply goes on
    other.execute("ROLLBACK")
    other.close()
    assert [m.content for m in store.messages(conv)] == ["kept"]
    assert store.messages(conv)[0].status == COMPLETE
