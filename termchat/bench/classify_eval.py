"""How well the code detector generalizes: `python -m termchat.bench.classify_eval`.

Scores `classify()` on a labelled JSONL set (prompt, kind, lang, split) and
prints the accuracy per split and language. Only the misses of the splits
that tune the rules are listed: a `held-out...` part stays unseen while the
rules are tuned, so its score says how the detector does on prompts it has
never met. Two sets: tests/data/classify_eval.jsonl (the first) and
tests/data/classify_unseen.jsonl (written by kind of prompt, not from the
rules; its held-out-1 part was scored once and then tuned on, held-out-2
was scored once after that). Both sets also fit the topic probe
(classify_train.py). tests/data/classify_sessions.jsonl (held-out-3, written
as what kinds of user type) was scored once after that, and fits nothing.
`--parts` scores the rules alone and the probe alone beside the detector.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from termchat.detect import topic_probe
from termchat.detect.classify import classify, rules_only

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


def parts(rows: list[dict]) -> None:
    """Per split: the rules alone, the topic probe alone, and both (the detector)."""
    by_split: dict[str, list[tuple[bool, bool, bool, bool]]] = defaultdict(list)
    for row in rows:
        topic = topic_probe.probability(row["prompt"])
        by_split[row["split"]].append((row["kind"] == "code", rules_only(row["prompt"]).is_code, topic is not None and topic >= 0.5, classify(row["prompt"]).is_code))
    for split, results in sorted(by_split.items()):
        figures = [f"{name} {sum(r[0] == r[i] for r in results) / len(results):.3f}" for i, name in ((1, "rules"), (2, "probe"), (3, "both"))]
        print(f"{split:<14} " + ", ".join(figures))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", nargs="?", default=str(DEFAULT_SET))
    parser.add_argument("--show-held-out", action="store_true", help="also list the held-out misses (after tuning is done)")
    parser.add_argument("--parts", action="store_true", help="also score the rules alone and the topic probe alone")
    args = parser.parse_args(argv)
    rows = [json.loads(line) for line in Path(args.file).read_text(encoding="utf-8").splitlines() if line.strip()]
    if args.parts:
        parts(rows)
    for key, (right, total) in sorted(score(rows).items()):
        print(f"{key:<14} {right:>4}/{total:<4} {right / total:.3f}")
    for row in rows:
        if (not row["split"].startswith("held-out") or args.show_held_out) and classify(row["prompt"]).kind != row["kind"]:
            print(f"miss [{row['split']}] {row['kind']:>4}: {row['prompt']}  ({classify(row['prompt']).reason})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
