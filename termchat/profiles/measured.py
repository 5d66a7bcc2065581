"""The last measured speed-ups of each profile, kept so that choosing a profile is informed.

`termchat bench` (built-in prompts, automatic temperature) writes one small
file per profile in the state folder; the profile picker reads them.
"""

from __future__ import annotations

import json
import time

from termchat import numbers, paths


def _file(profile_name: str):
    return paths.state_dir() / "bench" / f"{profile_name}.json"


def remember(profile_name: str, categories: list[dict], runs: int, max_tokens: int) -> None:
    """Keep the speed-ups (and the measured step cost) of a bench of this profile."""
    # a category where speculation changed the sampling has no speed-up to remember
    speedups = {c["category"]: round(c["speedup"], 2) for c in categories if c.get("lossless", True)}
    try:
        costs = sorted(c["step_cost"] for c in categories if c.get("step_cost"))
        step = costs[len(costs) // 2] if costs else None
        paths.write_private(_file(profile_name), json.dumps({"when": time.time(), "runs": runs, "max_tokens": max_tokens, "speedups": speedups, "step_cost": step}).encode())
    except OSError:
        pass  # a convenience for the picker, never a failure of the bench


SPEEDUP = (0.01, 100.0)  # a speed-up outside this is not a measurement of ours


def remembered(profile_name: str) -> dict[str, float]:
    """category -> speed-up from the last bench of this profile ({} if none);
    a figure that is not a finite number in SPEEDUP (NaN, 1e308, -3, true) is left out."""
    data = paths.read_json(_file(profile_name))
    speedups = data.get("speedups") if isinstance(data, dict) else None
    if not isinstance(speedups, dict):
        return {}
    found = {k: numbers.real(v, *SPEEDUP) for k, v in list(speedups.items())[:16] if isinstance(k, str) and len(k) <= 32}
    return {k: v for k, v in found.items() if v is not None}


def summary(profile_name: str) -> str:
    """'code 1.34x · chat 0.92x ...' or '' (for the picker)."""
    found = remembered(profile_name)
    return " ".join(f"{category} {value:.2f}x" for category, value in found.items())


def step_cost(profile_name: str) -> float | None:
    """A speculative step's time over a plain step's, as the last bench measured it."""
    data = paths.read_json(_file(profile_name))
    return numbers.real(data.get("step_cost"), 0.01, 100.0) if isinstance(data, dict) else None
