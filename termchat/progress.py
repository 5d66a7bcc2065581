"""One progress line on stderr, for every command that waits (engine start-up,
the bench, verify): on a terminal it updates in place; in a log (CI, a pipe)
it prints a line every `every` seconds, so the log neither floods nor stays
silent."""

from __future__ import annotations

import sys
import time


class ProgressLine:
    def __init__(self, every: float = 10.0, width: int = 150):
        self.tty = sys.stderr.isatty()
        self.every, self.width = every, width
        self.last = 0.0

    def show(self, line: str, final: bool = False) -> None:
        """The current state; replaces the previous one on a terminal."""
        if self.tty:
            sys.stderr.write("\r\x1b[K" + line[: self.width])
            sys.stderr.flush()
        elif final or time.monotonic() - self.last > self.every:
            self.last = time.monotonic()
            print(line, file=sys.stderr, flush=True)

    def say(self, text: str) -> None:
        """A line that stays."""
        self.done()
        print(text, file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.tty:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def engine_start_line(every: float = 15.0):
    """The progress callback the benches give open_engine: one line that
    redraws on a terminal, one every `every` seconds in a log (not two a
    second, as a print per call gave)."""
    return ProgressLine(every=every).show
