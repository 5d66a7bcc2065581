"""`/test`: which command runs the project's tests, and what of a failure to send back.

The command comes from, in order: `/test COMMAND`; the profile's
`test_command`; `test_command` in the project root's `.termchat.toml` (run
only once the user approved it: project.py); else pytest under the project's
own interpreter (approved first when it is the project's `.venv`), when the
root has a `tests/` folder or pytest configuration.
The summary sent to the model names the failing tests and their assertion
messages (pytest's `E` lines), not the whole log.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from termchat.coding import apply, project
from termchat.errors import UserError

PYTEST_ARGS = "-q -rfE --color=no"
SUMMARY_LINES = 60
MAX_FIX_ROUNDS = 5


def uses_pytest(folder: Path) -> bool:
    if (folder / "tests").is_dir() or (folder / "pytest.ini").is_file() or (folder / "conftest.py").is_file():
        return True
    for name, marker in (("pyproject.toml", "[tool.pytest"), ("setup.cfg", "[tool:pytest]"), ("tox.ini", "[pytest]")):
        file = folder / name
        if file.is_file() and marker in file.read_text(encoding="utf-8", errors="replace"):
            return True
    return False


def resolve_test_command(given: str, profile_command: str | None, cwd: Path) -> tuple[str, Path | None]:
    """The command /test runs and, when it came from the project's
    `.termchat.toml`, that file (the caller asks the user's approval first);
    or a UserError saying how to give one."""
    if given or profile_command:
        return given or profile_command, None
    found = project.test_command(cwd)
    if found:
        return found
    top = project.owned_root(cwd)
    if uses_pytest(top):
        python, source = project.interpreter(top)  # a project's own .venv is approved first, like its test_command
        return f"{shlex.quote(python)} -m pytest {PYTEST_ARGS}", source
    raise UserError(f"no test command found here ({cwd}): give one (/test make check), or set test_command in the profile or in {top / project.PROJECT_FILE}")


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


def fix_request(command: str, summary: str, files: list[str]) -> str:
    """The message /fix sends. It asks for whole files, each block opening with
    a comment naming its file, and gives the real names as the example: the
    default model copies the example it is given."""
    if files:
        named = ", ".join(f"`{comment(name)}`" for name in files)
        how = f"whose first line is a comment naming the file: {named}"
    else:
        how = "whose first line is a comment naming the file (its path from the project folder)"
    return f"The tests fail (`{command}`):\n\n```\n{summary}\n```\n\nFix the code so that they pass. Reply with each corrected file whole, in a fenced block {how}."


COMMENT_STYLES = {"#": ".py .sh .rb .toml .yaml .yml .r .pl .cfg .ini .txt", "//": ".js .ts .tsx .jsx .c .h .cc .cpp .hpp .java .go .rs .kt .swift .cs .scala .dart", "--": ".sql .lua .hs"}


def comment(name: str) -> str:
    """The first line naming a file, in its language's comment style (as named_file reads it)."""
    suffix = Path(name).suffix.lower()
    if suffix in (".html", ".xml", ".md", ".vue"):
        return f"<!-- {name} -->"
    marker = next((mark for mark, suffixes in COMMENT_STYLES.items() if suffix in suffixes.split()), "#")
    return f"{marker} {name}"


def fix_files(applied: list[Path], summary: str, cwd: Path) -> list[str]:
    """The files a fix is about: those the last /apply wrote, else the source
    (not test) files the failure summary points at; as paths from `cwd`."""
    if applied:
        return [os.path.relpath(path, cwd) for path in applied]
    found = dict.fromkeys(m.group(1) for m in re.finditer(r"(?:^|\s)([\w./-]+\.py):\d+", summary))
    tests = [name for name in found if Path(name).name.startswith("test_") or "tests" in Path(name).parts]
    files = [name for name in found if name not in tests]
    for name in tests:  # the project's modules the failing tests import (`from prime import is_prime`)
        try:
            text = (cwd / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for module in re.findall(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))", text, re.M):
            candidate = (module[0] or module[1]).replace(".", "/") + ".py"
            if (cwd / candidate).is_file() and candidate not in files:
                files.append(candidate)
    return files


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
