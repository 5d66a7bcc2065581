"""Shell commands the user typed (`/run`, `/test`): streamed, stoppable, time-limited.

A command runs in its own process group in the current folder, so Escape (or
the time limit) ends it with everything it started. Its output is kept (the
tail, up to KEEP_CHARS) to be shown and, only when the user asks, added to
the next message.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

from termchat.engine import proc
from termchat.errors import UserError
from termchat.sanitize import Sanitizer, inert

TIME_LIMIT_S = 600.0
EXIT_GRACE_S = 0.5  # after the command exits, how long its output may still take to close
LINE_CHARS = 1_000  # a longer line is folded: one line without newlines must not grow without bound
KEEP_CHARS = 200_000  # of output, for the screen and the summary
FOR_MODEL_CHARS = 6_000  # what goes to the model: the end of the output, where errors are


def change_folder(arg: str) -> str:
    """`/cd [DIR]`: the folder /run, /test, /apply and /file work in (the process's own)."""
    if arg:
        folder = (Path.cwd() / Path(arg).expanduser()).resolve()  # ~ first: cwd / "~/x" is not under home
        if not folder.is_dir():
            raise UserError(f"no folder {folder}; /cd takes an existing folder")
        try:
            os.chdir(folder)
        except OSError as exc:
            raise UserError(f"cannot work in {folder}: {exc.strerror or exc}") from None
    return f"working in {Path.cwd()} (/run, /test, /apply and /file start here)"


def fold(text: str, column: int) -> tuple[str, int]:
    """`text` with a newline after every LINE_CHARS characters without one;
    `column` is where the previous chunk left off. The new column too."""
    parts = text.split("\n")
    if column + len(parts[0]) <= LINE_CHARS and all(len(part) <= LINE_CHARS for part in parts[1:]):
        return text, column + len(text) if len(parts) == 1 else len(parts[-1])
    out = []
    for ch in text:
        if ch == "\n":
            column = 0
        elif column == LINE_CHARS:
            out.append("\n")
            column = 1
        else:
            column += 1
        out.append(ch)
    return "".join(out), column


def holders(process: asyncio.subprocess.Process) -> list[int]:
    """Other processes holding the command's output pipe, from /proc on Linux
    ([] elsewhere): what `setsid cmd &` leaves behind."""
    try:
        pipe = process.stdout._transport.get_extra_info("pipe")  # our read end
        inode = os.fstat(pipe.fileno()).st_ino
    except (AttributeError, OSError, ValueError):
        return []
    return proc.pipe_holders(inode, skip_pgid=process.pid)


class CommandRun:
    def __init__(self, command: str, cwd: Path | None = None, time_limit: float = TIME_LIMIT_S):
        self.command = command
        self.cwd = cwd or Path.cwd()
        self.time_limit = time_limit
        self.output = ""
        self.exit_code: int | None = None
        self.ended_by = ""  # "" | "stopped" | "time limit"
        self._process: asyncio.subprocess.Process | None = None
        self._stopped: asyncio.Event | None = None
        self.left_running: list[str] = []  # "pid N (name)" of processes that left its group holding the output
        self.escaped: list[tuple[int, str | None]] = []  # those processes: pid and start time (a recycled pid is not theirs)

    async def chunks(self) -> AsyncIterator[str]:
        """The output as it comes (stdout and stderr together, inert, lines
        folded at LINE_CHARS), until the command ends, is stopped, or has
        exited while something it started outside its process group
        (`setsid cmd &`) still holds the output: that is reported
        (`left_running`), not waited for."""
        clean = Sanitizer()
        self._stopped = asyncio.Event()
        self._process = await asyncio.create_subprocess_shell(
            self.command,
            cwd=self.cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.time_limit
        exited = asyncio.ensure_future(self._exited())
        stopped = asyncio.ensure_future(self._stopped.wait())
        read = None
        eof = False  # the output closed: nobody holds it, nothing to look for in /proc
        column = 0  # characters since the last newline
        try:
            while True:
                read = read or asyncio.ensure_future(self._process.stdout.read(4096))
                # once the command has exited, what is left in the pipe comes at once
                had_exited = exited.done()
                limit = min(EXIT_GRACE_S, deadline - loop.time()) if had_exited else deadline - loop.time()
                await asyncio.wait({read, stopped} | (set() if had_exited else {exited}), timeout=max(limit, 0.01), return_when=asyncio.FIRST_COMPLETED)
                if read.done():
                    data, read = read.result(), None
                    if not data:
                        eof = True
                        break
                    text, column = fold(clean.feed(data.decode("utf-8", "replace")), column)
                    self.output = (self.output + text)[-KEEP_CHARS:]
                    yield text
                elif stopped.done():
                    break
                elif loop.time() >= deadline:
                    self.stop("time limit")
                    break
                elif had_exited and not proc.group_alive(self._process.pid):
                    break  # exited, yet the pipe stays open: held by what left its group (reported)
        except BaseException:  # the reader was cancelled: the command goes too
            self.stop()
            raise
        finally:
            for task in (read, stopped):
                if task is not None:
                    task.cancel()
            try:
                async with asyncio.timeout(5):
                    self.exit_code = await exited
            except TimeoutError:  # killed, yet not reaped: say so rather than wait
                exited.cancel()
                self.exit_code = self._process.returncode
            self.escaped = [] if eof else [(pid, proc.started_at(pid)) for pid in holders(self._process)]
            self.left_running = [f"pid {pid} ({inert(proc.command_name(pid))})" for pid, _ in self.escaped]
            transport = getattr(self._process, "_transport", None)
            if transport is not None:
                transport.close()  # our end of the pipe: a process left holding it gets EPIPE

    async def _exited(self) -> int:
        """The shell's exit code, as soon as it exits (Process.wait() also
        waits for the output pipe to close, which a process left running holds)."""
        while self._process.returncode is None:
            await asyncio.sleep(0.05)
        return self._process.returncode

    def stop(self, why: str = "stopped") -> None:
        """End the command and everything it started in its process group;
        the reader returns at once, even if a process that left the group
        still holds the output."""
        self.ended_by = self.ended_by or why
        if self._process is not None:
            try:
                os.killpg(self._process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self._stopped is not None:
            self._stopped.set()

    def outcome(self) -> str:
        if self.ended_by == "time limit":
            said = f"stopped at the time limit ({self.time_limit:.0f} s)"
        elif self.ended_by:
            said = "stopped"
        else:
            said = f"exit {self.exit_code}"
        if self.left_running:
            said += f"; it left running, outside its process group, holding its output: {', '.join(self.left_running)} (not waited for)"
        return said

    def stop_question(self) -> str:
        return f"`{inert(self.command)}` left {len(self.escaped)} process(es) running outside its process group: {', '.join(self.left_running)}. Stop them?"

    def stop_escaped(self) -> str:
        """End the processes that left the command's group, on the user's word:
        each by its pid while it is still the process that was found (same start
        time), SIGTERM and then, after a second, SIGKILL. What was done, in words."""
        import time

        alive = [(pid, start) for pid, start in self.escaped if proc.is_running(pid, start)]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid, start in alive:
                if proc.is_running(pid, start):
                    try:
                        os.kill(pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
            deadline = time.monotonic() + 1.0
            while any(proc.is_running(pid, start) for pid, start in alive) and time.monotonic() < deadline:
                time.sleep(0.05)
        left = [pid for pid, start in alive if proc.is_running(pid, start)]
        self.escaped = []
        if left:
            return f"could not stop pid {', '.join(map(str, left))}"
        return f"stopped {len(alive)} process(es)" if alive else "they had already ended"

    def for_model(self, limit: int = FOR_MODEL_CHARS) -> str:
        """The command, the end of its output and how it ended, for the next message."""
        tail = self.output if len(self.output) <= limit else "[…]\n" + self.output[-limit:]
        return f"Output of `{self.command}` ({self.outcome()}):\n\n```\n{tail.rstrip()}\n```"
