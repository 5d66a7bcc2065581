"""`/test`: which command runs the project's tests, and what of a failure to send back.

The command comes from, in order: `/test COMMAND`; the profile's
`test_command`; `test_command` in a `.termchat.toml` in this folder or a
parent (up to the git root); else pytest, when there is a `tests/` folder or
pytest configuration. The summary sent to the model names the failing tests
and their assertion messages (pytest's `E` lines), not the whole log.
"""

from __future__ import annotations

import re
import shutil
import sys
import tomllib
from pathlib import Path

from termchat import apply
from termchat.errors import UserError

PROJECT_FILE = ".termchat.toml"
PYTEST_ARGS = "-q -rfE --color=no"
SUMMARY_LINES = 60
MAX_FIX_ROUNDS = 5


def _project_root(cwd: Path) -> list[Path]:
    """cwd and its parents up to (and with) the git work tree's root."""
    folders = []
    for folder in (cwd, *cwd.parents):
        folders.append(folder)
        if (folder / ".git").exists():
            break
    return folders


def project_command(cwd: Path) -> str | None:
    for folder in _project_root(cwd):
        file = folder / PROJECT_FILE
        if file.is_file():
            try:
                value = tomllib.loads(file.read_text(encoding="utf-8")).get("test_command")
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
                raise UserError(f"{file}: {exc}; fix the file (test_command = \"...\")") from None
            if value is not None and not isinstance(value, str):
                raise UserError(f"{file}: test_command must be a string")
            return value
    return None


def uses_pytest(cwd: Path) -> bool:
    for folder in _project_root(cwd):
        if (folder / "tests").is_dir() or (folder / "pytest.ini").is_file() or (folder / "conftest.py").is_file():
            return True
        for name, marker in (("pyproject.toml", "[tool.pytest"), ("setup.cfg", "[tool:pytest]"), ("tox.ini", "[pytest]")):
            file = folder / name
            if file.is_file() and marker in file.read_text(encoding="utf-8", errors="replace"):
                return True
    return False


def resolve_test_command(given: str, profile_command: str | None, cwd: Path) -> str:
    """The command /test runs, or a UserError saying how to give one."""
    command = given or profile_command or project_command(cwd)
    if command:
        return command
    if uses_pytest(cwd):
        return f"pytest {PYTEST_ARGS}" if shutil.which("pytest") else f"{sys.executable} -m pytest {PYTEST_ARGS}"
    raise UserError(f"no test command found here ({cwd}): give one (/test make check), or set test_command in the profile or in {PROJECT_FILE}")


SUMMARY = re.compile(r"^(FAILED|ERROR) (\S+)(?: - (.*))?$")
SECTION = re.compile(r"^_{3,} (.+?) _{3,}$")


def failure_summary(output: str) -> str:
    """The failing tests and why, from pytest's output; else the end of the output."""
    lines = output.splitlines()
    failing = [m for m in (SUMMARY.match(line) for line in lines) if m]
    if not failing:
        return "\n".join(lines[-SUMMARY_LINES:])
    reasons: dict[str, list[str]] = {}
    current = None
    for line in lines:
        section = SECTION.match(line)
        if section:
            current = section.group(1).strip()
            reasons.setdefault(current, [])
        elif current and line.startswith("E "):
            if len(reasons[current]) < 8:
                reasons[current].append(line[1:].strip())
        elif current and re.match(r"^\S+\.py:\d+: ", line) and len(reasons[current]) < 9:
            reasons[current].append(f"at {line.split(': ')[0]}")
    out = []
    for match in failing:
        kind, test, message = match.groups()
        name = test.split("::")[-1]
        details = next((d for key, d in reasons.items() if key.endswith(name)), [])
        # pytest cuts the short summary's message to the terminal's width; the E lines hold it whole
        out.append(f"- {kind} {test}" + (f": {message}" if message and not details else ""))
        out += [f"    {d}" for d in details]
    counts = next((line.strip() for line in reversed(lines) if re.search(r"\d+ (failed|passed|error)", line)), "")
    return "\n".join(out[:SUMMARY_LINES]) + (f"\n{counts}" if counts else "")


def fix_request(command: str, summary: str) -> str:
    return f"The tests fail (`{command}`):\n\n```\n{summary}\n```\n\nFix the code so that they pass. Reply with each corrected file whole, in a fenced block whose first line is a comment naming the file (for example `# calc.py`)."


def fix_rounds(arg: str) -> int:
    """/fix's argument: 0 to send one request and stop, else the rounds of fix, apply, test asked for."""
    if not arg:
        return 0
    rounds = int(arg) if arg.isdigit() else 0
    if not 1 <= rounds <= MAX_FIX_ROUNDS:
        raise UserError(f"/fix takes a number of rounds from 1 to {MAX_FIX_ROUNDS}")
    return rounds


# the first line of a block, naming its file: "# calc.py", "// src/app.ts", "-- schema.sql", "<!-- index.html -->"
FILE_COMMENT = re.compile(r"^\s*(?:#|//|--|;|/\*|<!--)\s*(?:file(?:name)?:\s*)?((?:~/|/)?[\w.-]+(?:/[\w.-]+)*\.[A-Za-z]\w*)\s*(?:\*/|-->)?\s*$", re.I)


def named_file(code: str) -> str | None:
    """The file a block names on its first line (as fix_request asks), if any."""
    first = code.split("\n", 1)[0]
    match = FILE_COMMENT.match(first)
    return match.group(1) if match else None


def fix_targets(blocks: list[tuple[str, str]], applied: list[Path]) -> list[tuple[int, str | None]]:
    """Which of a reply's (language, code) blocks the fix loop applies, and
    where: patches name their files (None); blocks whose first line names a
    file go there; a single block without a name goes where the last /apply
    wrote its single file. Anything else would be a guess. The paths come
    from the model: the caller plans them with apply.plan(confined=True)."""
    patches = [(i, None) for i, (language, code) in enumerate(blocks) if apply.is_patch(code, language)]
    if patches:
        return patches
    named = [(i, name) for i, (_, code) in enumerate(blocks) if (name := named_file(code))]
    if named:
        return named
    if len(blocks) == 1 and len(applied) == 1:
        return [(0, str(applied[0]))]
    raise UserError("the fix loop stopped: the reply's code does not say which file it is for; /apply it, then /test")


def plan_fix(blocks: list[tuple[str, str]], applied: list[Path], cwd: Path) -> list[apply.Change]:
    """The changes one round of the fix loop makes: every target planned
    before anything is written, each kept inside `cwd`."""
    return [change for i, path in fix_targets(blocks, applied) for change in apply.plan(blocks[i][1], blocks[i][0], path, cwd, confined=True)]
