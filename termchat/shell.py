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

from termchat.errors import UserError
from termchat.sanitize import Sanitizer

TIME_LIMIT_S = 600.0
KEEP_CHARS = 200_000  # of output, for the screen and the summary
FOR_MODEL_CHARS = 6_000  # what goes to the model: the end of the output, where errors are


def change_folder(arg: str) -> str:
    """`/cd [DIR]`: the folder /run, /test, /apply and /file work in (the process's own)."""
    if arg:
        folder = (Path.cwd() / arg).expanduser().resolve()
        if not folder.is_dir():
            raise UserError(f"no folder {folder}; /cd takes an existing folder")
        try:
            os.chdir(folder)
        except OSError as exc:
            raise UserError(f"cannot work in {folder}: {exc.strerror or exc}") from None
    return f"working in {Path.cwd()} (/run, /test, /apply and /file start here)"


class CommandRun:
    def __init__(self, command: str, cwd: Path | None = None, time_limit: float = TIME_LIMIT_S):
        self.command = command
        self.cwd = cwd or Path.cwd()
        self.time_limit = time_limit
        self.output = ""
        self.exit_code: int | None = None
        self.ended_by = ""  # "" | "stopped" | "time limit"
        self._process: asyncio.subprocess.Process | None = None

    async def chunks(self) -> AsyncIterator[str]:
        """The output as it comes (stdout and stderr together, inert), until the command ends."""
        clean = Sanitizer()
        self._process = await asyncio.create_subprocess_shell(
            self.command,
            cwd=self.cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = asyncio.get_running_loop().time() + self.time_limit
        try:
            while True:
                left = deadline - asyncio.get_running_loop().time()
                try:
                    async with asyncio.timeout(max(left, 0.01)):  # not wait_for: it can swallow a cancel (3.11)
                        data = await self._process.stdout.read(4096)
                except TimeoutError:
                    self.stop("time limit")
                    break
                if not data:
                    break
                text = clean.feed(data.decode("utf-8", "replace"))
                self.output = (self.output + text)[-KEEP_CHARS:]
                yield text
        except BaseException:  # the reader was cancelled: the command goes too
            self.stop()
            raise
        finally:
            self.exit_code = await self._process.wait()

    def stop(self, why: str = "stopped") -> None:
        """End the command and everything it started."""
        self.ended_by = self.ended_by or why
        if self._process is not None and self._process.returncode is None:
            try:
                os.killpg(self._process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def outcome(self) -> str:
        if self.ended_by == "time limit":
            return f"stopped at the time limit ({self.time_limit:.0f} s)"
        if self.ended_by:
            return "stopped"
        return f"exit {self.exit_code}"

    def for_model(self, limit: int = FOR_MODEL_CHARS) -> str:
        """The command, the end of its output and how it ended, for the next message."""
        tail = self.output if len(self.output) <= limit else "[…]\n" + self.output[-limit:]
        return f"Output of `{self.command}` ({self.outcome()}):\n\n```\n{tail.rstrip()}\n```"
