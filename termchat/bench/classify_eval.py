"""How well the code detector generalizes: `python -m termchat.bench.classify_eval`.

Scores `classify()` on a labelled JSONL set (prompt, kind, lang, split) and
prints the accuracy per split and language. Only the misses of the splits
that tune the rules are listed: a `held-out...` part stays unseen while the
rules are tuned, so its score says how the detector does on prompts it has
never met. Two sets: tests/data/classify_eval.jsonl (the first) and
tests/data/classify_unseen.jsonl (written by kind of prompt, not from the
rules; its held-out-1 part was scored once and then tuned on, held-out-2
was scored once after that).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from termchat.classify import classify

DEFAULT_SET = Path(__file__).resolve().parents[2] / "tests" / "data" / "classify_eval.jsonl"


def score(rows: list[dict]) -> dict[str, tuple[int, int]]:
    """(right, total) per split, per split and language, and overall."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in rows:
        right = classify(row["prompt"]).kind == row["kind"]
        for key in ("all", row["split"], f"{row['split']} {row['lang']}"):
            counts[key][0] += right
            counts[key][1] += 1
    return {key: (a, b) for key, (a, b) in counts.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", nargs="?", default=str(DEFAULT_SET))
    parser.add_argument("--show-held-out", action="store_true", help="also list the held-out misses (after tuning is done)")
    args = parser.parse_args(argv)
    rows = [json.loads(line) for line in Path(args.file).read_text(encoding="utf-8").splitlines() if line.strip()]
    for key, (right, total) in sorted(score(rows).items()):
        print(f"{key:<14} {right:>4}/{total:<4} {right / total:.3f}")
    for row in rows:
        if (not row["split"].startswith("held-out") or args.show_held_out) and classify(row["prompt"]).kind != row["kind"]:
            print(f"miss [{row['split']}] {row['kind']:>4}: {row['prompt']}  ({classify(row['prompt']).reason})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
