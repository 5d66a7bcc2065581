"""Bounded and honest: every input from outside has a size, a depth and a type
limit where it enters (termchat/limits.py), state files are read and written
through the private reader and writer only, and a figure that cannot be
trusted shows as unknown. Each class of issue 39 has tests here that failed
on the code before it (GGUF headers and `models add`: test_models_add.py).

The hostile servers are scripted stand-ins (tests/standin.py: Hostile), not
vLLM: the real engine cannot be made to send these. No engine is needed.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from termchat import cli, paths
from termchat.chat.store import Store

from .standin import Hostile


def config_for(tmp_path, url: str, extra: str = "") -> str:
    path = tmp_path / "hostile.toml"
    path.write_text(f'[profiles.standin]\nendpoint = "{url}"\nfirst_token_timeout = 5\n{extra}')
    return str(path)


def within(seconds: float, call):
    """call() in a thread; its result, or a failure if it has not returned in `seconds` (a FIFO would block for ever)."""
    box = {}

    def run():
        try:
            box["value"] = call()
        except BaseException as exc:  # raised again below, in the test's thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def one_line_error(err: str) -> bool:
    return err.count("\n") == 1 and "Traceback" not in err and err.startswith("termchat: ")


# ---- 1. unbounded input -------------------------------------------------------------------


@pytest.mark.parametrize("kind, message", [
    ("deep-line", "nests deeper than 64 levels, termchat's limit; the partial reply is kept"),
    ("deep-error", "the engine answered 500: [[[["),
    ("endless-error", "the engine answered 500: its error message is over 64 KiB, termchat's limit"),
    ("endless-models", "could not ask"),
])
def test_a_server_reply_nested_deep_or_without_end_ends_in_one_line(kind, message, tmp_path, capsys):
    extra = 'model = "m"\n' if kind != "endless-models" else ""
    with Hostile(kind) as server:
        started = time.monotonic()
        code = cli.main(["ask", "--config", config_for(tmp_path, server.url, extra), "--profile", "standin", "hi"])
        took = time.monotonic() - started
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err and "RecursionError" not in err, err[-600:]
    assert len(err) < 2000 and took < 10 and server.sent < 64 << 20  # read to its limit, not to the end of memory


def test_an_endless_metrics_page_leaves_the_figures_unknown_and_the_reply_whole(tmp_path, capsys):
    """A remote vLLM's /metrics are read around each reply; one without end is no figure."""
    spec = '[profiles.standin.speculative]\nmethod = "ngram"\nnum_speculative_tokens = 5\n'
    with Hostile("endless-metrics") as server:
        code = cli.main(["ask", "--json", "--config", config_for(tmp_path, server.url, 'model = "m"\n' + spec), "--profile", "standin", "hi"])
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out)["text"] == "Hello.", err
    assert json.loads(out)["acceptance_source"] != "server total" and server.sent < 64 << 20


async def test_the_tui_keeps_running_when_a_reply_line_nests_100000_deep(tmp_path):
    from termchat.profiles import parse_config
    from termchat.ui.app import TermchatApp
    from termchat.ui.widgets.message import MessageView

    from .conftest import wait_for
    from .test_tui import type_and_send

    with Hostile("deep-line") as server:
        config, _ = parse_config(f'[profiles.standin]\nendpoint = "{server.url}"\nmodel = "m"\n', "t.toml")
        app = TermchatApp(config=config, profile="standin", resume=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await type_and_send(pilot, "hi")
            await wait_for(pilot, lambda: [v for v in app.query(MessageView) if v.role == "assistant" and v.cut], timeout=30, what="the cut reply")
            reply = [v for v in app.query(MessageView) if v.role == "assistant"][-1]
            assert reply.text == "Hel" and app.is_running


def test_a_project_file_nested_deep_is_refused_in_one_line(tmp_path):
    from termchat.coding import project
    from termchat.errors import UserError

    (tmp_path / ".termchat.toml").write_text("test_command = " + "[" * 20_000 + "]" * 20_000 + "\n")  # under the file's size limit
    with pytest.raises(UserError, match="nests tables or arrays deeper than 32 levels, termchat's limit") as raised:
        project.test_command(tmp_path)
    assert "\n" not in str(raised.value)
    (tmp_path / ".termchat.toml").write_text("a" + ".a" * 20_000 + ' = "pytest"\n')  # 50,000 parts took 46 s in tomllib
    with pytest.raises(UserError, match="more than 32 parts"):
        within(5, lambda: project.test_command(tmp_path))


def test_an_undo_record_nested_deep_is_dropped_with_one_line(tmp_path):
    from termchat.coding.apply import UndoStack
    from termchat.errors import UserError

    stack = UndoStack(tmp_path / "undo")
    paths.private_dir(stack.folder)
    paths.write_private(stack.folder / "1.json", ("[" * 100_000 + "]" * 100_000).encode())
    with pytest.raises(UserError, match="could not be read") as raised:
        stack.undo()
    assert "\n" not in str(raised.value) and not (stack.folder / "1.json").exists()


def test_classify_refuses_a_line_nested_deep_in_one_line():
    deep = '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}\n"
    done = subprocess.run([sys.executable, "-m", "termchat.cli", "classify"], input=deep, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and one_line_error(done.stderr) and "nests deeper than 64 levels" in done.stderr, done.stderr[-500:]


# ---- 4. state files: never through a link, never blocking ---------------------------------


def _plant_link(path: Path, tmp_path) -> Path:
    target = tmp_path / f"victim-{path.name}"
    target.write_text("the user's own file\n")
    target.chmod(0o644)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.symlink_to(target)
    return target


def test_state_files_are_replaced_not_written_through_a_link(tmp_path):
    from termchat.profiles import measured
    from termchat.ui import app

    for path, write in ((paths.state_dir() / "bench" / "lnk.json", lambda: measured.remember("lnk", [{"category": "code", "speedup": 1.5}], 1, 128)),
                        (paths.state_dir() / app.UI_STATE, lambda: app._write_ui_state(theme="termchat-light"))):
        target = _plant_link(path, tmp_path)
        write()
        assert target.read_text() == "the user's own file\n" and target.stat().st_mode & 0o777 == 0o644, path
        assert not path.is_symlink() and path.stat().st_mode & 0o777 == 0o600, path
    assert measured.summary("lnk") == "code 1.50x" and app._read_ui_state()["theme"] == "termchat-light"


def test_the_repl_history_is_not_kept_through_a_link(tmp_path):
    from termchat.profiles import Config, builtin_profiles
    from termchat.repl import Repl

    link = tmp_path / "data" / "repl-history"
    target = _plant_link(link, tmp_path)
    lines: list[str] = []
    repl = Repl(Config(builtin_profiles()), write=lines.append, history_file=link, color=False)
    repl.prompt.history.append_string("a prompt")
    assert target.read_text() == "the user's own file\n" and target.stat().st_mode & 0o777 == 0o644
    assert "the prompts of this session are not kept" in "".join(lines)


def test_a_fifo_where_a_state_file_belongs_never_blocks(tmp_path):
    from termchat.coding import project
    from termchat.coding.apply import UndoStack
    from termchat.errors import UserError
    from termchat.profiles import measured
    from termchat.ui import app

    for path in (paths.state_dir() / "bench" / "fifo.json", paths.state_dir() / app.UI_STATE, project._approvals_file()):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        os.mkfifo(path)
    assert within(5, lambda: measured.remembered("fifo")) == {}
    assert within(5, app._read_ui_state) == {}
    assert within(5, project._approvals) == set()
    stack = UndoStack(tmp_path / "undo")
    paths.private_dir(stack.folder)
    os.mkfifo(stack.folder / "2.json")
    with pytest.raises(UserError, match="could not be read"):
        within(5, stack.undo)
    for path in (paths.state_dir() / app.UI_STATE, project._approvals_file()):
        path.unlink()


def test_a_ui_state_that_is_a_list_starts_nothing_wrong():
    from termchat.ui import app

    paths.write_private(paths.state_dir() / app.UI_STATE, b'["termchat-light"]')
    assert app._read_ui_state() == {}
    paths.write_private(paths.state_dir() / app.UI_STATE, b'{"theme": ["x"]}')
    assert app._read_ui_state() == {}
    (paths.state_dir() / app.UI_STATE).unlink()


@pytest.mark.parametrize("where", ["fifo", "/dev/zero"])
def test_a_config_that_is_a_fifo_or_a_device_is_one_line(where, tmp_path, capsys):
    path = tmp_path / "config.toml"
    if where == "fifo":
        os.mkfifo(path)
    else:
        path = Path(where)
    code = within(10, lambda: cli.main(["profiles", "check", "--config", str(path)]))
    err = capsys.readouterr().err
    assert code == 2 and "not a regular file (a FIFO, a device or a socket)" in err and "Traceback" not in err, err


# ---- 5. figures shown as measured only when they are ----------------------------------------


def test_token_ids_sent_as_a_string_are_not_counted_as_tokens(tmp_path, capsys):
    with Hostile("string-ids") as server:
        code = cli.main(["ask", "--json", "--config", config_for(tmp_path, server.url, 'model = "m"\n'), "--profile", "standin", "hi"])
    out, err = capsys.readouterr()
    stats = json.loads(out)
    assert code == 0 and stats["text"] == "Hello", err
    assert stats["output_tokens"] < 10 and stats["tokens_estimated"] is True  # not "1001 tokens"


def test_bench_records_that_are_not_figures_are_left_out():
    from termchat.profiles import measured

    path = paths.state_dir() / "bench" / "odd.json"
    for bad in ("NaN", "Infinity", "1e308", "-3", "true", '"fast"', "{}"):
        paths.write_private(path, f'{{"speedups": {{"code": {bad}, "chat": 1.25}}, "step_cost": {bad}}}'.encode())
        assert measured.summary("odd") == "chat 1.25x", bad
        assert measured.step_cost("odd") is None, bad


# ---- 6. history rows another version or a hand edit could leave -----------------------------


def _spoil(store: Store, conversation: int, sql: str, value) -> None:
    db = sqlite3.connect(store.path)
    db.execute(sql, (value, conversation))
    db.commit()
    db.close()


@pytest.fixture()
def spoiled(tmp_path, monkeypatch):
    """A conversation whose stored rows hold what no version of termchat writes."""
    monkeypatch.setenv("TERMCHAT_HOME", str(tmp_path / "home"))
    store = Store()
    conversation = store.new_conversation("local")
    store.add_message(conversation, "user", "hello")
    store.add_message(conversation, "assistant", "hi there")
    for sql, value in (("UPDATE messages SET stats = ? WHERE conversation_id = ? AND role = 'assistant'", "not json"),
                       ("UPDATE messages SET temperature = ? WHERE conversation_id = ?", "warm"),
                       ("UPDATE messages SET created = ? WHERE conversation_id = ?", 1e300),
                       ("UPDATE conversations SET updated = ? WHERE id = ?", "yesterday"),
                       ("UPDATE messages SET content = ? WHERE conversation_id = ? AND role = 'user'", b"\xff\xfe\xfd\xfc hello")):
        _spoil(store, conversation, sql, value)
    return store, conversation


def test_history_rows_that_do_not_parse_read_as_unknown(spoiled, capsys):
    store, conversation = spoiled
    messages = Store().messages(conversation)
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[0].content == "\ufffd\ufffd\ufffd\ufffd hello" and messages[1].stats is None and messages[1].temperature is None and messages[0].created is None
    for stats in ('[1, 2]', '{"decode_tokens_per_s": "fast", "output_tokens": true}', '{"decode_tokens_per_s": 1e300}'):
        _spoil(store, conversation, "UPDATE messages SET stats = ? WHERE conversation_id = ? AND role = 'assistant'", stats)
        reply = Store().messages(conversation)[1]
        assert reply.stats is None or (reply.stats.decode_tokens_per_s is None and reply.stats.output_tokens == 0), stats
        reply.summary()
    for argv in (["history", "list"], ["history", "show", str(conversation)], ["history", "export", str(conversation), "--format", "json"], ["history", "export", str(conversation), "--format", "md"]):
        assert cli.main(argv) == 0, argv
        err = capsys.readouterr().err
        assert "Traceback" not in err, (argv, err)


async def test_the_tui_starts_and_resumes_a_conversation_whose_rows_do_not_parse(spoiled):
    from termchat.profiles import Config, builtin_profiles
    from termchat.ui.app import TermchatApp
    from termchat.ui.widgets.message import MessageView

    app = TermchatApp(config=Config(builtin_profiles()), profile="local", resume=True, start_engine=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.5)
        texts = [v.text for v in app.query(MessageView)]
        assert app.is_running and texts == ["\ufffd\ufffd\ufffd\ufffd hello", "hi there"]


# ---- 7. the smaller ones -------------------------------------------------------------------


@pytest.mark.parametrize("key, says", [("cl\u00e9", "a non-ASCII character"), ("abc\ndef", "a line break")])
def test_an_api_key_an_http_header_cannot_carry_is_one_line(key, says, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOSTILE_KEY", key)
    with Hostile("ok") as server:
        code = cli.main(["ask", "--config", config_for(tmp_path, server.url, 'model = "m"\napi_key_env = "HOSTILE_KEY"\n'), "--profile", "standin", "hi"])
    err = capsys.readouterr().err
    assert code == 2 and one_line_error(err) and says in err and "UnicodeEncodeError" not in err and "mid-reply" not in err, err


def test_serve_dry_run_prints_the_command_that_runs_escape_characters_and_all(tmp_path, capsys):
    from termchat.engine.command import server_command
    from termchat.profiles import load_config

    path = tmp_path / "c.toml"
    path.write_text('[profiles.odd]\nmodel = "org/na\\u001b[31mme\\u202e"\nenv = { X = "a\\u0007b" }\n')
    assert cli.main(["serve", "--profile", "odd", "--config", str(path), "--dry-run"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert "\x1b" not in "".join(printed) and "\u202e" not in "".join(printed) and "\x07" not in "".join(printed)
    words = subprocess.run(["bash", "-c", "printf '%s\\0' " + printed[0]], capture_output=True).stdout.decode().split("\0")[:-1]
    assert words == server_command(load_config(path).get("odd"), "PORT", resolve_model=False)  # exactly what runs


def test_a_sent_prompt_of_megabytes_is_shown_in_part_and_stored_whole():
    from termchat.ui.widgets.message import PROMPT_SHOWN, shown_prompt

    text = "line of a pasted log\n" * 250_000  # 5 MB
    shown = shown_prompt(text)
    assert len(shown) < PROMPT_SHOWN + 200 and shown.startswith(text[:1000]) and shown.endswith(text[-1000:])
    assert f"[... {len(text) - PROMPT_SHOWN:,} more characters, sent and stored whole ...]" in shown
    assert shown_prompt("short") == "short"


def test_a_project_file_past_its_size_is_refused_in_one_line(tmp_path):
    from termchat.coding import project
    from termchat.errors import UserError

    (tmp_path / ".termchat.toml").write_text('test_command = "pytest"\n' + "# padding\n" * 20_000)
    with pytest.raises(UserError, match="over termchat's limit of 64 KiB"):
        project.test_command(tmp_path)


def test_a_paste_the_terminal_did_not_mark_reaches_the_repl_as_one_paste():
    """prompt_toolkit looks up key bindings for each key it is given (50,000
    characters typed took 11.7 s): a run of printable characters that arrives
    in one read becomes one paste; Enter and other control keys stay keys."""
    from prompt_toolkit.key_binding.key_processor import KeyPress
    from prompt_toolkit.keys import Keys

    from termchat.repl import PasteInput

    class Typed:
        def __init__(self, keys):
            self.keys = keys

        def read_keys(self):
            return self.keys

    keys = [KeyPress(c, c) for c in "x" * 50_000] + [KeyPress(Keys.ControlM, "\r")] + [KeyPress(c, c) for c in "hi"]
    got = PasteInput(Typed(keys)).read_keys()
    assert [k.key for k in got] == [Keys.BracketedPaste, Keys.ControlM, "h", "i"] and got[0].data == "x" * 50_000
    typing = [KeyPress(c, c) for c in "/help"]
    assert PasteInput(Typed(typing)).read_keys() == typing  # a few keys: typing, as before
