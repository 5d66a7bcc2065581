"""One reader for numbers that come from outside: a server's JSON and
Prometheus text, environment variables, state files.

Each is checked once, where it enters, and becomes either a number that can
be shown as exact or None ("unknown"). Nothing here raises on bad input: NaN,
infinities, booleans, strings where numbers belong, negative counts and
absurdly large values all read as None. The standard library only (the
engine process reads its keep-alive through it).
"""

from __future__ import annotations

import math

# counts larger than this are not counts any server of ours sends
MAX_COUNT = 2**53


def real(value: object, low: float | None = None, high: float | None = None) -> float | None:
    """A finite JSON number (never a bool, never a string) within [low, high], else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        return None
    if not math.isfinite(number) or (low is not None and number < low) or (high is not None and number > high):
        return None
    return number


def count(value: object, high: int = MAX_COUNT) -> int | None:
    """A non-negative whole number (2.0 counts as 2; 2.5, -1, NaN and True do not)."""
    number = real(value, 0, high)
    if number is None or number != int(number):
        return None
    return int(number)


def fraction(value: object) -> float | None:
    """A rate between 0 and 1."""
    return real(value, 0.0, 1.0)


def parse_real(text: str, low: float | None = None, high: float | None = None) -> float | None:
    """A number written as text (an environment variable, a Prometheus sample):
    'inf', 'NaN', '1e999' and anything out of [low, high] are None."""
    try:
        number = float(text.strip())
    except (ValueError, AttributeError):
        return None
    return real(number, low, high)


MAX_TOKEN_ID = 1 << 24  # vocabularies are under 300,000 tokens


def token_ids(value: object, limit: int = 4096) -> tuple[int, ...] | None:
    """A step's token ids: a JSON list of at most `limit` whole numbers in a
    vocabulary's range, else None (a string's letters are not token ids)."""
    if not isinstance(value, list) or len(value) > limit:
        return None
    ids = tuple(count(v, MAX_TOKEN_ID) for v in value)
    return None if any(i is None for i in ids) else ids
