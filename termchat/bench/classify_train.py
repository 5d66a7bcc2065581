"""Fit the code detector's topic probe: `python -m termchat.bench.classify_train`.

Reads the labelled prompt sets the detector is tuned on (tests/data/
classify_eval.jsonl and classify_unseen.jsonl, every split), runs each prompt
through the default model's first layers (termchat.detect.topic_probe.Encoder), fits
a logistic regression (L2, full-batch gradient descent: deterministic) and
writes termchat/detect/topic_probe.json. tests/data/classify_sessions.jsonl is never
read here: it is the held-out set that measures the result.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from termchat import models

from termchat.detect import topic_probe

DATA = Path(__file__).resolve().parents[2] / "tests" / "data"
TRAINING_SETS = ("classify_eval.jsonl", "classify_unseen.jsonl")
LAYERS = 6  # layer 6 of 30: as good as the deeper ones on the held-out prompts, and the cheapest
L2 = 0.003


def fit(features, labels, l2: float = L2, steps: int = 2000):
    """Logistic regression on standardized features: (mean, scale, weights, bias)."""
    import numpy as np

    mean, scale = features.mean(0), features.std(0) + 1e-6
    x = (features - mean) / scale
    w, b = np.zeros(x.shape[1]), 0.0
    for _ in range(steps):
        p = 1 / (1 + np.exp(-(x @ w + b)))
        w -= 0.5 * (x.T @ (p - labels) / len(labels) + l2 * w)
        b -= 0.5 * float((p - labels).mean())
    return mean, scale, w, b


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(topic_probe.WEIGHTS))
    args = parser.parse_args(argv)
    rows = [json.loads(line) for name in TRAINING_SETS for line in (DATA / name).read_text(encoding="utf-8").splitlines() if line.strip()]
    folder = models.folder(topic_probe.MODEL)
    encoder = topic_probe.Encoder(folder, LAYERS)
    started = time.monotonic()
    features = np.array([encoder.features(row["prompt"]) for row in rows])
    labels = np.array([row["kind"] == "code" for row in rows], float)
    mean, scale, w, b = fit(features, labels)
    right = int(((((features - mean) / scale) @ w + b > 0) == labels).sum())
    probe = {
        "layers": LAYERS,
        "source": topic_probe.model_source(folder),
        "mean": [round(float(v), 6) for v in mean],
        "scale": [round(float(v), 6) for v in scale],
        "weights": [round(float(v), 6) for v in w],
        "bias": round(b, 6),
    }
    Path(args.out).write_text(json.dumps(probe) + "\n", encoding="utf-8")
    print(f"{len(rows)} prompts ({int(labels.sum())} code) in {time.monotonic() - started:.1f} s; training accuracy {right / len(rows):.3f}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
