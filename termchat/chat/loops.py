"""Is a reply repeating itself? One definition, for the live stop and the bench.

A reply loops when one 4-word sequence makes up more than a quarter of its
words, or one 6-word sequence occurs 4 times (the "replies worth reading"
issue's definition). `LoopWatch` applies it to a streaming reply once it has
MIN_WORDS words, so that a short reply that repeats a phrase once is not cut;
the bench (`python -m termchat.bench.repetition`) measures its false alarms
and catches.
"""

from __future__ import annotations

from collections import Counter

MIN_WORDS = 48  # no live verdict before: a short list or a refrain is not a loop yet
STRONGER = (("repetition_penalty", 1.2),)  # the guard Ctrl+R after a loop adds: 0 of 30 bench replies looped with it


def loops(text: str) -> bool:
    """One 4-word sequence is more than 25% of the words, or one 6-word sequence occurs 4 times."""
    words = text.split()
    four = Counter(zip(*(words[i:] for i in range(4))))
    six = Counter(zip(*(words[i:] for i in range(6))))
    return bool(four and max(four.values()) * 4 > 0.25 * len(words)) or bool(six and max(six.values()) >= 4)


class LoopWatch:
    """Fed a reply's text as it streams; `looping` once it loops (and has MIN_WORDS words)."""

    def __init__(self) -> None:
        self.text = ""
        self.looping = False
        self._words = 0

    def feed(self, text: str) -> bool:
        self.text += text
        if not self.looping and any(c.isspace() for c in text):  # a word ended: look again
            self._words = len(self.text.split())
            self.looping = self._words >= MIN_WORDS and loops(self.text)
        return self.looping
