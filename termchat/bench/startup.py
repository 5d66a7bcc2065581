"""Eager against compiled (torch.compile) engines: start-up time and decode speed.

    python -m termchat.bench.startup [--profile local]

Starts the profile's engine four times, one after the other: eager, compiled
(first start: vLLM's compile cache in ~/.cache/vllm may be empty), compiled
again (cache warm), eager again; after two warm-up requests each answers the
same 9 prompts at T=0. Prints seconds to ready and the median decode tok/s.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from termchat.bench.prompts import builtin
from termchat.engine.connect import open_engine
from termchat.engine.client import Sampling, complete_sync
from termchat.profiles import load_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="local")
    parser.add_argument("--config")
    args = parser.parse_args()
    eager = load_config(args.config).get(args.profile)
    compiled = replace(eager, engine_args={k: v for k, v in eager.engine_args.items() if k != "enforce_eager"})
    prompts = [p.text for p in builtin(["code"])][:6] + [p.text for p in builtin(["chat"])][:3]
    for label, profile in (("eager", eager), ("compiled, first start", compiled), ("compiled, second start", compiled), ("eager again", eager)):
        started = time.monotonic()
        engine = open_engine(profile, attach=False, timeout=900)
        ready = time.monotonic() - started
        try:
            for _ in range(2):
                complete_sync(engine, [{"role": "user", "content": "Write one sentence about the sea."}], Sampling(temperature=0.0, max_tokens=32))
            speeds = [s.stats.decode_tokens_per_s for s in (complete_sync(engine, [{"role": "user", "content": p}], Sampling(temperature=0.0, max_tokens=96)) for p in prompts) if s.stats.decode_tokens_per_s]
        finally:
            engine.stop()
        print(f"{label}: ready in {ready:.0f} s, decode median {statistics.median(speeds):.1f} tok/s over {len(speeds)} replies", flush=True)


if __name__ == "__main__":
    main()
