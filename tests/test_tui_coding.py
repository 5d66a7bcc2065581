"""Writing code from the TUI: /apply with a diff and /undo, /run, /test, /fix, and branches.

Applying, running and branching do not need the engine (a reply is put on
screen as it would have streamed); sending a failure back to the model does,
and runs on the session's real engine.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from termchat.chat.store import Store
from termchat.ui.app import TermchatApp
from termchat.ui.screens.apply_diff import ApplyDiff
from termchat.ui.screens.history import HistoryScreen
from termchat.ui.widgets.command_output import CommandOutput
from termchat.ui.widgets.message import MessageView
from termchat.ui.widgets.prompt import PromptArea

from .conftest import wait_for

OLD = "def add(a, b):\n    return a - b\n"
FAILING_TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5, 'two and three make five'\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "calc.py").write_text(OLD)
    monkeypatch.chdir(tmp_path)
    return tmp_path


async def command(pilot, text: str) -> None:
    area = pilot.app.query_one(PromptArea)
    area.text = text
    area.focus()
    await pilot.press("enter")
    await pilot.pause(0.2)


async def reply_on_screen(app, text: str) -> None:
    view = MessageView("assistant", "stand-in reply", text)
    await app.query_one("#chat").mount(view)
    await view.finish(None)


def script_the_model(app, reply: str) -> list[str]:
    """The fix loop's replies, scripted (a stand-in for the model: the default 135M
    one cannot write these fixes): each request is kept, and `reply` put on screen."""
    asked: list[str] = []

    async def scripted(prompt: str) -> bool:
        asked.append(prompt)
        await reply_on_screen(app, reply)
        return True

    app.chat_screen.ask_reply = scripted
    return asked


def notes(app) -> str:
    return "\n".join(n.message for n in app._notifications)


async def test_apply_shows_a_diff_writes_only_on_yes_and_undo_restores(project):
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await reply_on_screen(app, "Fixed:\n\n```python\ndef add(a, b):\n    return a + b\n```\n")
        await command(pilot, "/apply calc.py")
        await wait_for(pilot, lambda: isinstance(app.screen, ApplyDiff), what="diff screen")
        shown = "\n".join(str(s.content) for s in app.screen.query(".diff"))
        assert "-    return a - b" in shown and "+    return a + b" in shown
        assert (project / "calc.py").read_text() == OLD  # nothing written before the answer
        await pilot.press("n")
        await wait_for(pilot, lambda: "nothing written" in notes(app), timeout=10, what="the refusal")
        assert (project / "calc.py").read_text() == OLD
        await command(pilot, "/apply 1 calc.py")
        await wait_for(pilot, lambda: isinstance(app.screen, ApplyDiff), what="diff screen")
        await pilot.press("y")
        await wait_for(pilot, lambda: "return a + b" in (project / "calc.py").read_text(), what="written")
        await command(pilot, "/undo")
        assert (project / "calc.py").read_text() == OLD and "calc.py restored" in notes(app)


async def test_a_patch_that_does_not_apply_is_refused_with_a_message(project):
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await reply_on_screen(app, "```diff\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a * b\n+    return a + b\n```\n")
        await command(pilot, "/apply")
        await wait_for(pilot, lambda: "hunk 1 of the patch (at line 1 of calc.py) does not match the file" in notes(app), timeout=10, what="the refusal")
        assert not isinstance(app.screen, ApplyDiff)
        assert (project / "calc.py").read_text() == OLD


async def test_run_shows_output_only_in_its_block_and_escape_stops_a_long_command(project):
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await command(pilot, "/run echo hello-from-run; exit 3")
        await wait_for(pilot, lambda: app.chat_screen.last_run is not None, what="the command")
        block = app.query(CommandOutput).last()
        assert "hello-from-run" in block.text and "exit 3" in str(block.title)
        # nothing went to the model, nor waits to go
        assert app.session.conversation.messages == [] and app.session.conversation.attachments == []
        await command(pilot, "/run sleep 60")
        await wait_for(pilot, lambda: app.chat_screen.running is not None, what="sleep started")
        started = time.monotonic()
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.chat_screen.running is None, timeout=10, what="sleep stopped")
        assert time.monotonic() - started < 10 and "stopped" in str(app.query(CommandOutput).last().title)
        await command(pilot, "/run echo kept-for-the-model")
        await wait_for(pilot, lambda: "kept" in app.chat_screen.last_run.output, what="echo")
        await pilot.press("ctrl+o")
        [attached] = app.session.conversation.attachments
        assert "kept-for-the-model" in attached and "exit 0" in attached and "echo kept-for-the-model" in attached


async def test_cd_moves_where_commands_run_and_a_missing_folder_is_one_message(project):
    (project / "sub").mkdir()
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await command(pilot, "/cd sub")
        await command(pilot, "/run pwd")
        await wait_for(pilot, lambda: app.chat_screen.last_run is not None and app.chat_screen.last_run.exit_code is not None, what="pwd")
        assert app.chat_screen.last_run.output.strip() == str((project / "sub").resolve())
        await command(pilot, "/cd nowhere")
        await wait_for(pilot, lambda: "no folder" in notes(app), timeout=10, what="the refusal")
        assert Path.cwd() == (project / "sub").resolve()  # unchanged by the refusal


async def test_test_runs_pytest_and_its_failure_summary_names_the_failing_test(project):
    (project / "tests").mkdir()
    (project / "tests" / "test_calc.py").write_text(FAILING_TEST)
    (project / "tests" / "conftest.py").write_text(f"import sys\nsys.path.insert(0, {str(project)!r})\n")
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await command(pilot, "/test")
        # the run is recorded by its worker before /test reads it: wait for the verdict itself
        await wait_for(pilot, lambda: app.chat_screen.last_failure is not None, timeout=60, what="pytest's failure summary")
        command_run, summary = app.chat_screen.last_failure
        assert "pytest" in command_run
        assert "tests/test_calc.py::test_add" in summary and "two and three make five" in summary
        assert "tests fail: /fix sends the failure summary" in notes(app)


def stored_conversation() -> int:
    store = Store()
    conv = store.new_conversation("local", title="branching")
    for role, text in (("user", "first question"), ("assistant", "first answer"), ("user", "second question"), ("assistant", "second answer")):
        store.add_message(conv, role, text, profile="local")
    return conv


async def test_editing_an_earlier_message_branches_and_the_old_branch_can_be_opened(project):
    conv = stored_conversation()
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.chat_screen.open_conversation(conv)
        await command(pilot, "/edit 2")
        await wait_for(pilot, lambda: app.session.conversation_id != conv, timeout=10, what="the branch")
        branch = app.session.conversation_id
        assert app.query_one(PromptArea).text == "second question"
        assert [v.text for v in app.query(MessageView)] == ["first question", "first answer"]
        store = Store()
        assert store.conversation(branch).parent_id == conv
        assert [m.content for m in store.messages(conv)] == ["first question", "first answer", "second question", "second answer"]
        await pilot.press("f3")
        await wait_for(pilot, lambda: isinstance(app.screen, HistoryScreen), timeout=10, what="history")
        rows = [str(app.screen.query_one("OptionList").get_option_at_index(i).prompt) for i in range(app.screen.query_one("OptionList").option_count)]
        parent_row = next(i for i, r in enumerate(rows) if r.endswith(" branching"))
        assert "↳ ● branching (branch)" in rows[parent_row + 1]  # the branch, under its parent, marked as on screen
        app.screen.query_one("OptionList").highlighted = parent_row
        await pilot.press("enter")
        await wait_for(pilot, lambda: [v.text for v in app.query(MessageView)] == ["first question", "first answer", "second question", "second answer"], timeout=10, what="old branch on screen")
        assert app.session.conversation_id == conv


@pytest.mark.engine
async def test_fix_sends_the_failure_summary_to_the_model(project, shared_engine):
    (project / "tests").mkdir()
    (project / "tests" / "test_calc.py").write_text(FAILING_TEST)
    (project / "tests" / "conftest.py").write_text(f"import sys\nsys.path.insert(0, {str(project)!r})\n")
    app = TermchatApp(resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.engines.ready, timeout=180, what="engine")
        await command(pilot, "/test")
        await wait_for(pilot, lambda: app.chat_screen.last_failure is not None, timeout=60, what="pytest")
        await command(pilot, "/fix")
        replies = lambda: [v for v in app.query(MessageView) if v.role == "assistant"]  # noqa: E731
        await wait_for(pilot, lambda: replies() and replies()[-1].stats is not None, timeout=120, what="reply")
        sent = app.session.conversation.prompts()[-1]["content"]
        assert "tests/test_calc.py::test_add" in sent and "two and three make five" in sent and "Fix the code" in sent
        assert replies()[-1].text.strip()


async def test_the_fix_loop_applies_the_reply_where_the_last_apply_wrote_and_tests_again(project):
    """The loop after /fix ROUNDS. The reply is put on screen by the test: the
    default 135M model cannot write this fix (seen in tmux), so a scripted
    reply stands in for it; the apply and the test run are real."""
    (project / "tests").mkdir()
    (project / "tests" / "test_calc.py").write_text(FAILING_TEST)
    (project / "tests" / "conftest.py").write_text(f"import sys\nsys.path.insert(0, {str(project)!r})\n")
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.chat_screen
        await reply_on_screen(app, f"```python\n{OLD}```\n")
        await command(pilot, "/apply calc.py")
        await wait_for(pilot, lambda: isinstance(app.screen, ApplyDiff), what="diff")
        await pilot.press("y")
        await command(pilot, "/test")
        await wait_for(pilot, lambda: screen.last_failure is not None, timeout=60, what="failing tests")
        asked = script_the_model(app, "The sign was wrong:\n\n```python\ndef add(a, b):\n    return a + b\n```\n")
        await command(pilot, "/fix 2")
        await wait_for(pilot, lambda: screen.last_failure is None and not screen.fixing, timeout=60, what="tests pass")
        assert len(asked) == 1 and "tests/test_calc.py::test_add" in asked[0]  # green after one round: no second request
        assert (project / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
        assert "tests pass after the fix" in notes(app) and not screen.fixing
        await command(pilot, "/undo")
        assert (project / "calc.py").read_text() == OLD  # the loop's apply is undoable like any other


async def test_escape_during_the_loops_test_run_ends_the_loop(project):
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.chat_screen
        screen.last_failure = ("sleep 30", "- FAILED tests/test_calc.py::test_add")
        asked = script_the_model(app, "```python\n# calc.py\ndef add(a, b):\n    return a + b\n```\n")
        await command(pilot, "/fix 3")  # its first fix applied, then the test run
        await wait_for(pilot, lambda: screen.running is not None and screen.running.command == "sleep 30", what="the loop's test run")
        await pilot.press("escape")
        await wait_for(pilot, lambda: not screen.fixing, timeout=10, what="the loop to end")
        assert "the fix loop stopped with the tests" in notes(app)
        assert len(asked) == 1  # no second fix request went out


async def test_the_palette_offers_each_code_block_and_shows_its_code_as_plain_text(project):
    from textual.command import CommandPalette
    from textual.widgets import OptionList

    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await reply_on_screen(app, "```python\nprint('[bold red]x[/]')\n```\n")
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), what="palette")
        await pilot.press(*"apply code")
        options = app.screen.query_one(OptionList)

        def shown() -> list[str]:
            return [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]

        await wait_for(pilot, lambda: any("Apply code block 1 to a file" in line for line in shown()), timeout=10, what="the palette's hits")
        shown = shown()
        assert any("Apply code block 1 to a file" in line for line in shown), shown
        assert any("print('[bold red]x[/]')" in line for line in shown), shown  # markup stays text


async def test_a_second_run_stops_the_first_and_escape_still_reaches_the_second(project):
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.chat_screen
        await command(pilot, "/run sleep 60")
        await wait_for(pilot, lambda: screen.running is not None, what="first command")
        await command(pilot, "/run sleep 61")
        await wait_for(pilot, lambda: screen.running is not None and screen.running.command == "sleep 61", what="second command")
        first, second = list(app.query(CommandOutput))
        await wait_for(pilot, lambda: "stopped" in str(first.title), timeout=10, what="first stopped")
        await pilot.pause(0.5)
        assert screen.running is not None and screen.running.command == "sleep 61"  # the first's end did not forget the second
        await pilot.press("escape")
        await wait_for(pilot, lambda: screen.running is None, timeout=10, what="second stopped")
        assert "stopped" in str(second.title)
