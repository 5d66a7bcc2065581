"""/test: which command, and the failure summary from a real pytest run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from termchat.coding import project_tests
from termchat.errors import UserError

FAILING = '''
def add(a, b):
    return a - b


def test_add():
    assert add(2, 3) == 5, "two and three make five"


def test_other():
    assert True
'''


def test_the_summary_names_the_failing_test_and_its_assertion(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_calc.py").write_text(FAILING)
    command, source = project_tests.resolve_test_command("", None, tmp_path)
    assert "-m pytest" in command and "-rfE" in command and source is None
    done = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True)
    summary = project_tests.failure_summary(done.stdout + done.stderr)
    assert "tests/test_calc.py::test_add" in summary
    assert "two and three make five" in summary and "assert -1 == 5" in summary
    assert "test_other" not in summary.split("\n")[0] and "1 failed, 1 passed" in summary


def test_the_command_comes_from_the_argument_then_the_profile_then_the_project_file(tmp_path):
    (tmp_path / ".termchat.toml").write_text('test_command = "make check"\n')
    assert project_tests.resolve_test_command("tox -q", "nox", tmp_path) == ("tox -q", None)
    assert project_tests.resolve_test_command("", "nox", tmp_path) == ("nox", None)
    # from the project file: the file comes along, for the approval
    assert project_tests.resolve_test_command("", None, tmp_path) == ("make check", tmp_path.resolve() / ".termchat.toml")


def test_no_tests_here_says_how_to_give_a_command(tmp_path):
    (tmp_path / ".git").mkdir()  # the search stops at the work tree's root
    try:
        project_tests.resolve_test_command("", None, tmp_path)
    except Exception as exc:
        assert "no test command found here" in str(exc) and ".termchat.toml" in str(exc)
    else:
        raise AssertionError("expected a UserError")


def test_output_that_is_not_pytest_is_summarised_by_its_end():
    output = "\n".join(f"line {i}" for i in range(200))
    summary = project_tests.failure_summary(output)
    assert summary.startswith("line 140") and summary.endswith("line 199")


assert sys.executable  # the detected command may be `python -m pytest` with this interpreter


def test_fix_rounds_are_bounded():
    assert project_tests.fix_rounds("") == 0 and project_tests.fix_rounds("3") == 3
    for bad in ("0", "6", "two"):
        with pytest.raises(UserError, match="from 1 to 5"):
            project_tests.fix_rounds(bad)


def test_the_fix_goes_where_the_patch_the_block_or_the_last_apply_says_and_nowhere_else(tmp_path):
    patch = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"
    applied = [tmp_path / "calc.py"]
    assert project_tests.fix_targets([("text", "prose"), ("diff", patch)], applied) == [(1, None)]  # a patch names its file
    assert project_tests.fix_targets([("python", "def add(): ...\n")], applied) == [(0, str(applied[0]))]
    # blocks that name their file on the first line, as the request asks: several files at once
    named = [("python", "# calc.py\ndef add(): ...\n"), ("javascript", "// src/app.js\nlet x = 1;\n"), ("text", "no name\n")]
    assert project_tests.fix_targets(named, applied) == [(0, "calc.py"), (1, "src/app.js")]
    assert "first line is a comment naming the file" in project_tests.fix_request("pytest", "- FAILED t", [])
    with pytest.raises(UserError, match="does not say which file"):
        project_tests.fix_targets([("python", "a = 1\n"), ("python", "b = 2\n")], applied)  # two blocks, one file: a guess
    with pytest.raises(UserError, match="does not say which file"):
        project_tests.fix_targets([("python", "a = 1\n")], [])  # nothing applied yet


def test_the_fix_loop_writes_nothing_outside_the_project(tmp_path):
    """Its paths come from the model and no diff is shown: a block or a patch
    that names a file outside the folder (or in .git) stops the round before any write."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (tmp_path / "secret").write_text("keep\n")
    escape = "--- a/../secret\n+++ b/../secret\n@@ -1 +1 @@\n-keep\n+owned\n"
    for blocks in ([("diff", escape)], [("python", "# calc.py\nok = 1\n"), ("sh", f"# {tmp_path}/secret.sh\necho\n")], [("ini", "# .git/config.ini\n[x]\n")]):
        with pytest.raises(UserError, match="outside|nothing written"):
            project_tests.plan_fix(blocks, [], project)
    assert (tmp_path / "secret").read_text() == "keep\n"
    changes = project_tests.plan_fix([("python", "# calc.py\ndef add(a, b):\n    return a + b\n")], [], project)
    assert [c.path for c in changes] == [(project / "calc.py").resolve()]
