"""Where a cold start's seconds go, and what termchat's start-up settings save.

    python -m termchat.bench.cold_start [--runs 2] [--profile local]

Starts the profile's engine as termchat does (ManagedEngine), watching its log
as it grows: the time each stage's first line appears, from the launch. Then
one reply's first token, and stop. Three variants, alternated in one run so a
drifting machine weighs on all alike:

- vLLM's default on the CPU: three processes (the API server, the engine
  core, a worker), each spawned and importing vLLM and torch;
- two processes (`distributed_executor_backend = "uni"` with
  `VLLM_ENABLE_V1_MULTIPROCESSING=0`: the model runs in the engine core's
  process; vLLM's API server still runs the engine core apart);
- two processes, forked: the engine core forked from the API server instead
  of spawned (`TERMCHAT_FORK_ENGINE_CORE=1`, guarded_server.fork_engine_core):
  it inherits vLLM and torch instead of importing them again; here without
  the cuts below (1 GiB of KV cache, vLLM's warm-up, torch's probes);
- the built-in profiles' settings: forked, 512 MiB of KV cache
  (profiles.KV_CACHE_BYTES), a compiled model warmed up on 16 tokens instead
  of vLLM's 2048-token profile run (vllm_plugin.short_compiled_warm_up), and
  its cached kernels loaded without torch's g++ probes
  (vllm_plugin.quick_compiled_load).

The built-in profiles are compiled, so each variant first starts once
uncounted: a variant whose settings change vLLM's compile-cache key compiles
there, and every counted start loads the cache.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from termchat.engine.client import Sampling, complete_sync
from termchat.engine.process import ENGINE_INITIALIZED, ManagedEngine
from termchat.profiles import builtin_profiles

# (stage, the first log line that shows it reached), in order
STAGES = [
    ("server up (imports)", "non-default args:"),
    ("engine core started", "Initializing a V1 LLM engine"),
    ("model loaded", "Loading weights took"),
    ("compiled graph loaded", "Directly load AOT compilation"),
    ("KV cache and warm-up", ENGINE_INITIALIZED),
    ("serving", "Application startup complete"),
]


FORK = "TERMCHAT_FORK_ENGINE_CORE"


def variants(profile) -> dict:
    """vLLM's default, two processes, and the built-in settings (two processes, forked)."""
    args = {k: v for k, v in profile.engine_args.items() if k != "distributed_executor_backend"}
    env = {k: v for k, v in profile.env.items() if k not in (FORK, "VLLM_ENABLE_V1_MULTIPROCESSING")}
    default = replace(profile, engine_args=args, env=env)
    two = replace(profile, engine_args={**args, "distributed_executor_backend": "uni"}, env={**env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    built_in = replace(two, env={**two.env, FORK: "1"})
    uncut_args = {k: v for k, v in built_in.engine_args.items() if k != "kv_cache_memory_bytes"}
    uncut = replace(built_in, engine_args=uncut_args, env={**built_in.env, "VLLM_CPU_KVCACHE_SPACE": "1", "TERMCHAT_SHORT_WARM_UP": "0", "TERMCHAT_QUICK_LOAD": "0"})
    return {"vLLM's default (3 processes)": default, "2 processes, spawned": two, "2 processes, forked, 1 GiB KV, vLLM's warm-up": uncut, "built in": built_in}


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
    from termchat.engine.proc import group_members

    return group_members(pgid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m termchat.bench.cold_start", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--profile", default="local", choices=list(builtin_profiles()), help="a built-in profile (default local)")
    args = parser.parse_args(argv)
    base = builtin_profiles()[args.profile]
    tried = variants(base)
    from termchat.bench.command import machine_line

    print(machine_line(), flush=True)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in tried}
    for name, profile in tried.items():  # uncounted: fills vLLM's compile cache where a variant's key is new
        print(f"first start (not counted) {name}: ready in {one_start(profile)['ready (/health)']:.1f} s", flush=True)
    for run in range(args.runs):
        for name, profile in tried.items():
            results[name].append(one_start(profile))
            print(f"run {run + 1} {name}: ready in {results[name][-1]['ready (/health)']:.1f} s", flush=True)
    stages = [stage for stage, _ in STAGES] + ["ready (/health)", "first token", "processes"]
    print(f"\nprofile {args.profile}, {args.runs} alternated runs each, seconds from launch (median)\n")
    print("| stage | " + " | ".join(tried) + " | ratio, built in / default |")
    print("|---|" + "---|" * (len(tried) + 1))
    for stage in stages:
        values = [statistics.median(r[stage] for r in results[name]) for name in tried]
        ratio = f"{values[-1] / values[0]:.2f}" if stage != "processes" and values[0] else ""
        cells = " | ".join(f"{v:.0f}" if stage == "processes" else f"{v:.1f}" for v in values)
        print(f"| {stage} | {cells} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
