"""Where a cold start's seconds go, and what two processes instead of three save.

    python -m termchat.bench.cold_start [--runs 2] [--profile local]

Starts the profile's engine as termchat does (ManagedEngine), watching its log
as it grows: the time each stage's first line appears, from the launch. Then
one reply's first token, and stop. Two variants, alternated in one run so a
drifting machine weighs on both alike:

- three processes (vLLM's default on the CPU: the API server, the engine
  core, a worker, each importing vLLM and torch);
- two processes (`distributed_executor_backend = "uni"`: the worker in the
  engine core's process). The engine core stays a process of its own:
  vLLM's API server always runs it apart (`VLLM_ENABLE_V1_MULTIPROCESSING=0`
  changes nothing there but a warning that it fixes the global seed).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from termchat.engine.client import Sampling, complete_sync
from termchat.engine.process import ManagedEngine
from termchat.profiles import builtin_profiles

# (stage, the first log line that shows it reached), in order
STAGES = [
    ("server up (imports)", "non-default args:"),
    ("engine core started", "Initializing a V1 LLM engine"),
    ("model loaded", "Loading weights took"),
    ("KV cache and warm-up", "init engine (profile, create kv cache, warmup model)"),
    ("serving", "Application startup complete"),
]


def without_worker_process(profile):
    """The profile with vLLM's worker in the engine core's process."""
    return replace(profile, engine_args={**profile.engine_args, "distributed_executor_backend": "uni"})


def one_start(profile) -> dict[str, float]:
    """Seconds from launch to each stage, to ready (/health) and to a first token."""
    started = time.monotonic()
    engine = ManagedEngine.launch(profile)
    seen: dict[str, float] = {}
    try:
        while not engine.run(lambda: engine.health(timeout=0.5)):
            if not engine.alive():
                raise SystemExit(engine.describe_failure())
            text = engine.log_path.read_text(errors="replace")
            for stage, marker in STAGES:
                if stage not in seen and marker in text:
                    seen[stage] = time.monotonic() - started
            time.sleep(0.05)
        seen["ready (/health)"] = time.monotonic() - started
        text = engine.log_path.read_text(errors="replace")
        for stage, marker in STAGES:
            seen.setdefault(stage, seen["ready (/health)"] if marker in text else float("nan"))
        stream = complete_sync(engine, [{"role": "user", "content": "Say hi."}], Sampling(temperature=0.0, max_tokens=4))
        seen["first token"] = seen["ready (/health)"] + (stream.stats.ttft_s or 0.0)
        seen["processes"] = len(engine_processes(engine.pid))
    finally:
        engine.stop()
    return seen


def engine_processes(pgid: int) -> list[int]:
    from termchat.engine.process import group_members

    return group_members(pgid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m termchat.bench.cold_start", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--profile", default="local", choices=list(builtin_profiles()), help="a built-in profile (default local)")
    args = parser.parse_args(argv)
    base = builtin_profiles()[args.profile]
    variants = {"three processes": base, "two processes": without_worker_process(base)}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for run in range(args.runs):
        for name, profile in variants.items():
            results[name].append(one_start(profile))
            print(f"run {run + 1} {name}: ready in {results[name][-1]['ready (/health)']:.1f} s", flush=True)
    stages = [stage for stage, _ in STAGES] + ["ready (/health)", "first token", "processes"]
    print(f"\nprofile {args.profile}, {args.runs} alternated runs each, seconds from launch (median)\n")
    print("| stage | " + " | ".join(variants) + " | ratio |")
    print("|---|" + "---|" * (len(variants) + 1))
    for stage in stages:
        values = [statistics.median(r[stage] for r in results[name]) for name in variants]
        ratio = f"{values[1] / values[0]:.2f}" if stage != "processes" and values[0] else ""
        cells = " | ".join(f"{v:.0f}" if stage == "processes" else f"{v:.1f}" for v in values)
        print(f"| {stage} | {cells} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
