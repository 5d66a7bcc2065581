"""Applying code to files: diffs, patches that fit or are refused, atomic writes, undo across restarts."""

from __future__ import annotations

import os

import pytest

from termchat.coding import apply
from termchat.errors import UserError

OLD = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
PATCH = """--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""


@pytest.fixture
def project(tmp_path):
    (tmp_path / "calc.py").write_text(OLD)
    os.chmod(tmp_path / "calc.py", 0o640)
    return tmp_path


def test_a_block_replaces_a_file_after_a_diff_and_keeps_its_mode(project):
    undo = apply.UndoStack(project / "undo")
    [change] = apply.plan("def add(a, b):\n    return a + b\n", "python", "calc.py", project)
    assert "-    return a - b" in change.diff(project) and "+    return a + b" in change.diff(project)
    assert (project / "calc.py").read_text() == OLD  # planning writes nothing
    assert "calc.py (changed)" in apply.write([change], undo)
    assert (project / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    assert (project / "calc.py").stat().st_mode & 0o777 == 0o640
    assert not [p for p in project.iterdir() if p.name.startswith(".calc.py")]  # no temporary left


def test_a_patch_applies_and_undo_survives_a_restart(project):
    apply.write(apply.plan(PATCH, "diff", None, project), apply.UndoStack(project / "undo"))
    assert (project / "calc.py").read_text() == OLD.replace("return a - b", "return a + b", 1)
    message = apply.UndoStack(project / "undo").undo()  # a new stack: as after a restart
    assert "calc.py restored" in message
    assert (project / "calc.py").read_text() == OLD
    with pytest.raises(UserError, match="nothing to undo"):
        apply.UndoStack(project / "undo").undo()


def test_a_patch_that_does_not_fit_is_refused_and_nothing_is_written(project):
    stale = PATCH.replace("-    return a - b", "-    return a * b")
    with pytest.raises(apply.PatchError, match="hunk 1 .* does not match"):
        apply.plan(stale, "diff", None, project)
    assert (project / "calc.py").read_text() == OLD


def test_a_patch_a_few_lines_off_still_applies(project):
    (project / "calc.py").write_text("# header\n# more\n" + OLD)
    [change] = apply.plan(PATCH, "", None, project)  # recognised as a patch by its shape
    assert change.new == "# header\n# more\n" + OLD.replace("return a - b", "return a + b", 1)


def test_a_new_file_is_created_and_undo_removes_it(project):
    undo = apply.UndoStack(project / "undo")
    apply.write(apply.plan("def test_add():\n    pass\n", "python", "test_calc.py", project), undo)
    assert (project / "test_calc.py").exists()
    undo.undo()
    assert not (project / "test_calc.py").exists()


def test_undo_refuses_when_the_file_changed_after_apply(project):
    undo = apply.UndoStack(project / "undo")
    apply.write(apply.plan("x = 1\n", "python", "calc.py", project), undo)
    (project / "calc.py").write_text("x = 2  # edited by hand\n")
    with pytest.raises(UserError, match="changed after /apply"):
        undo.undo()
    assert (project / "calc.py").read_text() == "x = 2  # edited by hand\n"


def test_bad_targets_get_one_clear_message(project):
    with pytest.raises(UserError, match="give the file to write"):
        apply.plan("x = 1\n", "python", None, project)
    with pytest.raises(UserError, match="does not exist"):
        apply.plan("x = 1\n", "python", "nowhere/x.py", project)
    (project / "blob.bin").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UserError, match="not UTF-8"):
        apply.plan("x\n", "", "blob.bin", project)


def test_the_undo_stack_is_private(project):
    undo = apply.UndoStack(project / "undo")
    apply.write(apply.plan("x = 1\n", "python", "calc.py", project), undo)
    assert (project / "undo").stat().st_mode & 0o777 == 0o700
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in (project / "undo").iterdir())


def test_a_tampered_undo_record_never_restores_setuid_setgid_or_sticky_bits(project):
    import json

    undo = apply.UndoStack(project / "undo")
    apply.write(apply.plan("print('hi')\n", "python", "tool.py", project), undo)
    (project / "tool.py").unlink()  # gone; the record would recreate it
    [entry] = undo._entries()
    record = json.loads(entry.read_text())
    record[0]["old"], record[0]["mode"] = "#!/bin/sh\necho pwned\n", 0o4777
    entry.write_text(json.dumps(record))
    (project / "tool.py").write_text("print('hi')\n")  # as /apply left it, so the undo applies
    undo.undo()
    mode = (project / "tool.py").stat().st_mode
    assert mode & 0o7000 == 0, oct(mode)
