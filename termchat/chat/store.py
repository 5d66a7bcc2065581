"""Conversations in one SQLite database (WAL mode) in the user's data folder.

A user message is written before it is sent; a reply is written as it
streams, at least once a second and at the end (`chat/reply.ReplyWriter`), so a crash or
`kill -9` loses at most the last second of a reply and never a finished
message. Schema changes are numbered migrations (PRAGMA user_version).
Nothing here ever sees an API key.
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from termchat import limits, numbers, paths
from termchat.engine.stats import ReplyStats
from termchat.errors import UserError
from termchat.sanitize import one_line

MIGRATIONS = [
    # 1: conversations and messages
    """
    CREATE TABLE conversations (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        profile TEXT NOT NULL,
        created REAL NOT NULL,
        updated REAL NOT NULL
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'complete',
        profile TEXT,
        model TEXT,
        draft TEXT,
        method TEXT,
        temperature REAL,
        lowered INTEGER,
        stats TEXT,
        created REAL NOT NULL,
        updated REAL NOT NULL
    );
    CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
    """,
    # 2: the system prompt a conversation was held with
    """
    ALTER TABLE conversations ADD COLUMN system_prompt TEXT NOT NULL DEFAULT '';
    """,
    # 3: branches: a conversation forked from another where a message was edited
    """
    ALTER TABLE conversations ADD COLUMN parent_id INTEGER REFERENCES conversations(id) ON DELETE SET NULL;
    """,
]

# statuses of an assistant message
COMPLETE, STREAMING, CUT, INTERRUPTED = "complete", "streaming", "cut", "interrupted"


class StoreError(UserError):
    """The database cannot be written (locked, read-only, disk full...)."""


def _explain(exc: sqlite3.Error, path: Path) -> StoreError:
    text = str(exc).lower()
    if "locked" in text or "busy" in text:
        why = "is locked by another termchat (or another program); close it or wait, then try again"
    elif "readonly" in text or "read-only" in text:
        why = "is read-only; check the file's permissions"
    elif "full" in text:
        why = "cannot grow: the disk is full; free some space"
    elif "not a database" in text or "malformed" in text:
        why = "is not a termchat database or is damaged; move it away to start a new one"
    else:
        why = f"failed: {exc}"
    return StoreError(f"the history database {path} {why}. The reply on screen is not affected.")



def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


@dataclass
class ConversationRecord:
    id: int
    title: str
    profile: str
    created: float | None  # None: a stored time that is not one (shown as unknown)
    updated: float | None
    system_prompt: str = ""
    parent_id: int | None = None  # the conversation this one branched from


@dataclass
class Message:
    id: int
    conversation_id: int
    role: str
    content: str
    status: str
    profile: str | None
    model: str | None
    draft: str | None
    method: str | None
    temperature: float | None
    lowered: bool | None
    stats: ReplyStats | None
    created: float | None
    updated: float | None

    @property
    def flagged(self) -> str:
        """'' for a finished message; otherwise how it ended."""
        return "" if self.status == COMPLETE else INTERRUPTED if self.status == STREAMING else self.status

    def summary(self) -> str:
        """What produced a reply and its figures, in one line (history, export)."""
        parts = [p for p in (self.model and self.model.removeprefix("termchat:"), self.method) if p]
        if self.temperature is not None:
            parts.append(f"T={self.temperature:g}" + (" (lowered for code)" if self.lowered else ""))
        if self.stats is not None:
            parts.append(self.stats.short())
        if self.flagged:
            parts.append(self.flagged)
        return " · ".join(parts)


def default_path() -> Path:
    return paths.data_dir() / "termchat.db"


class Store:
    def __init__(self, path: Path | None = None, timeout: float = 2.0):
        self.timeout = timeout
        self.path = Path(path) if path else default_path()
        try:
            # 0600 before SQLite opens it: its -wal and -shm files take the database's mode
            paths.private_file(self.path)
            for extra in ("-wal", "-shm"):
                paths.tighten(Path(f"{self.path}{extra}"))
            self.db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None, check_same_thread=False)
            self.db.text_factory = _text  # a damaged or foreign row reads with U+FFFD, never an exception
            self.db.row_factory = sqlite3.Row
            self.db.execute("PRAGMA foreign_keys = ON")
            self._patiently(self._wal)
            self._patiently(self._migrate)
        except sqlite3.Error as exc:
            raise _explain(exc, self.path) from None
        except OSError as exc:
            raise StoreError(f"cannot open the history database {self.path}: {exc.strerror}") from None

    def _patiently(self, step) -> None:
        """Retry `step` while another process holds the lock, up to `timeout`:
        switching to WAL and some lock upgrades answer "locked" at once,
        without waiting (two termchats opening a fresh database together)."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return step()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc).lower() or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _wal(self) -> None:
        try:
            self.db.execute("PRAGMA journal_mode = WAL")
        except sqlite3.OperationalError as exc:
            if "readonly" not in str(exc).lower():
                raise

    def _migrate(self) -> None:
        """Numbered migrations, all in one write transaction. Two termchats opening
        a fresh database at once: the second waits for the lock, then re-reads
        the version inside its transaction and finds nothing left to do."""
        if self.db.execute("PRAGMA user_version").fetchone()[0] >= len(MIGRATIONS):
            return
        self.db.execute("BEGIN IMMEDIATE")
        try:
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
                for statement in script.split(";"):
                    if statement.strip():
                        self.db.execute(statement)
                self.db.execute(f"PRAGMA user_version = {number}")
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    @contextmanager
    def waiting_at_most(self, seconds: float):
        """Writes inside wait at most `seconds` for another writer's lock (a
        streaming reply must not freeze the screen while someone holds it)."""
        self.db.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")
        try:
            yield
        finally:
            self.db.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")

    def close(self) -> None:
        self.db.close()

    def _write(self, sql: str, params: tuple = ()) -> sqlite3.Cursor:
        try:
            return self.db.execute(sql, params)
        except sqlite3.Error as exc:
            raise _explain(exc, self.path) from None

    @contextmanager
    def _transaction(self):
        """Several writes, all or none: a StoreError (another process held the
        lock too long) leaves the database as it was."""
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise _explain(exc, self.path) from None
        try:
            yield
            self._write("COMMIT")
        except BaseException:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise

    # ---- conversations ------------------------------------------------------------

    def new_conversation(self, profile: str, title: str = "", system_prompt: str = "") -> int:
        now = time.time()
        cur = self._write("INSERT INTO conversations (title, profile, created, updated, system_prompt) VALUES (?, ?, ?, ?, ?)", (title or "new conversation", profile, now, now, system_prompt))
        return cur.lastrowid

    def conversation(self, conversation_id: int) -> ConversationRecord:
        row = self.db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        if row is None:
            raise UserError(f"no conversation {conversation_id}; `termchat history list` shows them")
        return _conversation(dict(row))

    def conversations(self, search: str = "", limit: int = 200) -> list[ConversationRecord]:
        """Newest first; `search` matches titles and message text."""
        if search:
            # the user's text literally: % and _ are not wildcards
            like = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            rows = self.db.execute(
                "SELECT DISTINCT c.* FROM conversations c LEFT JOIN messages m ON m.conversation_id = c.id "
                "WHERE c.title LIKE ? ESCAPE '\\' OR m.content LIKE ? ESCAPE '\\' ORDER BY c.updated DESC LIMIT ?",
                (like, like, limit),
            ).fetchall()
        else:
            rows = self.db.execute("SELECT * FROM conversations ORDER BY updated DESC LIMIT ?", (limit,)).fetchall()
        return [_conversation(dict(r)) for r in rows]

    def fork(self, conversation_id: int, before_message_id: int) -> int:
        """A branch: a new conversation holding this one's messages before
        `before_message_id` (the message being edited). The original is kept."""
        conv = self.conversation(conversation_id)
        now = time.time()
        with self._transaction():
            cur = self._write(
                "INSERT INTO conversations (title, profile, created, updated, system_prompt, parent_id) VALUES (?, ?, ?, ?, ?, ?)",
                (one_line(f"{conv.title} (branch)", 200), conv.profile, now, now, conv.system_prompt, conversation_id),
            )
            columns = "role, content, status, profile, model, draft, method, temperature, lowered, stats, created, updated"
            self._write(f"INSERT INTO messages (conversation_id, {columns}) SELECT ?, {columns} FROM messages WHERE conversation_id = ? AND id < ? ORDER BY id", (cur.lastrowid, conversation_id, before_message_id))
        return cur.lastrowid

    def latest(self) -> ConversationRecord | None:
        found = self.conversations(limit=1)
        return found[0] if found else None

    def rename(self, conversation_id: int, title: str) -> None:
        self.conversation(conversation_id)
        self._write("UPDATE conversations SET title = ? WHERE id = ?", (one_line(title, 200), conversation_id))

    def delete(self, conversation_id: int) -> None:
        self.conversation(conversation_id)
        self._write("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    def set_system_prompt(self, conversation_id: int, text: str) -> None:
        self._write("UPDATE conversations SET system_prompt = ? WHERE id = ?", (text, conversation_id))

    # ---- messages -----------------------------------------------------------------

    def add_message(self, conversation_id: int, role: str, content: str, status: str = COMPLETE, **meta) -> int:
        now = time.time()
        stats = meta.pop("stats", None)
        cur = self._write(
            "INSERT INTO messages (conversation_id, role, content, status, profile, model, draft, method, temperature, lowered, stats, created, updated) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (conversation_id, role, content, status, meta.get("profile"), meta.get("model"), meta.get("draft"), meta.get("method"), meta.get("temperature"), meta.get("lowered"), json.dumps(stats.to_dict()) if stats else None, now, now),
        )
        if role == "user":
            title = self.conversation(conversation_id).title
            if title == "new conversation":
                self._write("UPDATE conversations SET title = ? WHERE id = ?", (_title(content), conversation_id))
        self._write("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
        return cur.lastrowid

    def update_message(self, message_id: int, content: str, status: str | None = None, stats: ReplyStats | None = None) -> None:
        sets, params = ["content = ?", "updated = ?"], [content, time.time()]
        if status is not None:
            sets.append("status = ?")
            params.append(status)
        if stats is not None:
            sets.append("stats = ?")
            params.append(json.dumps(stats.to_dict()))
        self._write(f"UPDATE messages SET {', '.join(sets)} WHERE id = ?", (*params, message_id))

    def delete_message(self, message_id: int) -> None:
        self.delete_messages([message_id])

    def delete_messages(self, message_ids: list[int]) -> None:
        """All of them or, on a StoreError, none (one statement)."""
        self._write(f"DELETE FROM messages WHERE id IN ({','.join('?' * len(message_ids))})", tuple(message_ids))

    def messages(self, conversation_id: int) -> list[Message]:
        rows = self.db.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)).fetchall()
        return [_message(dict(row)) for row in rows]

    # ---- export -------------------------------------------------------------------

    def export_json(self, conversation_id: int) -> str:
        conv = self.conversation(conversation_id)
        return json.dumps({"conversation": conv.__dict__, "messages": [asdict(m) for m in self.messages(conversation_id)]}, indent=2, ensure_ascii=False)

    def export_markdown(self, conversation_id: int) -> str:
        conv = self.conversation(conversation_id)
        lines = [f"# {conv.title}", "", f"Profile `{conv.profile}`, started {day(conv.created)}.", ""]
        for m in self.messages(conversation_id):
            if m.role == "user":
                lines += ["## You", "", m.content.rstrip(), ""]
            else:
                lines += [f"## {m.profile or 'assistant'}", "", m.content.rstrip(), ""]
                lines.append("*" + m.summary() + "*")
                lines.append("")
        return "\n".join(lines)


# ---- rows as another version or a hand edit may have left them: each column checked once ----

TIME = (0.0, 1e11)  # seconds since 1970: up to the year 5138


def _text(value, default: str = "") -> str:
    """A column that holds text: a BLOB read as UTF-8 (U+FFFD where it is not), a number as its digits."""
    if value is None:
        return default
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else str(value)


def _when(value) -> float | None:
    """A timestamp, or None (shown as an unknown date): text or 1e300 is not a time."""
    return numbers.real(value, *TIME)


def _stats(value) -> ReplyStats | None:
    """A reply's stored figures; None (shown as unknown) for anything that is not a JSON object of them."""
    if not isinstance(value, (str, bytes)) or not value:
        return None
    try:
        data = limits.json_loads(value, "a reply's stored figures")
    except ValueError:
        return None
    return ReplyStats.from_dict(data) if isinstance(data, dict) else None


def _conversation(row: dict) -> ConversationRecord:
    parent = row.get("parent_id")
    return ConversationRecord(
        id=int(row["id"]), title=_text(row.get("title"), "untitled"), profile=_text(row.get("profile"), "?"),
        created=_when(row.get("created")), updated=_when(row.get("updated")), system_prompt=_text(row.get("system_prompt")),
        parent_id=parent if isinstance(parent, int) and not isinstance(parent, bool) else None,
    )


def _message(row: dict) -> Message:
    lowered = row.get("lowered")
    optional = {k: (_text(row.get(k)) if row.get(k) is not None else None) for k in ("profile", "model", "draft", "method")}
    return Message(
        id=int(row["id"]), conversation_id=int(row["conversation_id"]), role=_text(row.get("role"), "assistant"),
        content=_text(row.get("content")), status=_text(row.get("status"), COMPLETE), **optional,
        temperature=numbers.real(row.get("temperature"), 0.0, 2.0), lowered=bool(lowered) if isinstance(lowered, int) else None,
        stats=_stats(row.get("stats")), created=_when(row.get("created")), updated=_when(row.get("updated")),
    )


def day(when: float | None) -> str:
    """A stored time as 'YYYY-MM-DD HH:MM', or 'unknown date'."""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(when)) if when is not None else "unknown date"


def _title(text: str) -> str:
    """The first words of a prompt, without controls or escape sequences
    (a prompt can hold an attached file's colour codes)."""
    return one_line(text, 61)


def transient(exc: StoreError) -> bool:
    """A lock held by another writer passes; a full disk or a read-only file does not."""
    return "locked" in str(exc)
