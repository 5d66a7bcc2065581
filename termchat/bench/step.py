"""Where a plain decode step goes, component by component.

    python -m termchat.bench.step [--profile local-plain | --file 1.7b] [--seconds 12] [--rate 200] [--max-tokens 256]
    python -m termchat.bench.step --profile local --speculative --category edit
    python -m termchat.bench.step --profile local --speculative --category chat --temperature 0.7
    python -m termchat.bench.step --op-kinds    # the forward by op kind (inductor's Python wrapper)
    python -m termchat.bench.step --native      # then the native view: how long the OpenMP worker waits for the step thread

Starts the profile's engine (plain: the profile's speculation is left out,
unless --speculative keeps it, to see what a verification step adds),
measures its greedy decode unprofiled (the engine's own clock, three replies),
then samples the engine core with py-spy (`--nonblocking`, so the engine is
not paused; the optional extra `bench`) while it decodes the same kind of
replies, and sorts every sample of the thread that runs the step into a
budget: the forward pass (by op kind with --op-kinds: inside the compiled
graph, by the op the generated Python line calls: ggml's matmuls, attention,
the KV-cache update, norms, inductor's fused kernels; the built-ins compile
with inductor's C++ wrapper, one native call py-spy cannot split), the output layer, input preparation, the
scheduler, the sampler, output processing, and the rest. Shares are of the
step thread's busy samples; "ms a step" is the share times the unprofiled
step. The API server's and the engine core's CPU time over the window come
from /proc. Every later cut to the step shows as a line of this table.

With --native, Linux perf then samples the engine core's native stacks as
long: the step thread's and the OpenMP worker's time by kind (ggml, the
attention kernel, Python, torch's dispatch, waiting in OpenMP, off a core).
The worker's wait is the step's serial part: while one thread runs Python
and dispatch, the other has nothing to do.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import ClassVar

from termchat.bench.peers import profile_specs, termchat_profile
from termchat.engine import proc
from termchat.errors import UserError
from termchat.progress import engine_start_line

PROMPTS = [
    "Write a Python function that merges two sorted lists, with a docstring and three pytest tests.",
    "Explain how a hash map works and when to use one, in four paragraphs.",
    "Write a shell script that backs up a folder to a dated tar.gz file and keeps the last seven.",
]

# (component, what in a sample's stack says so), first match wins, checked on the function names
# of the stack (and, inside the compiled graph, on the op the generated line calls)
GRAPH_OPS = [
    ("forward: matmuls (ggml)", ("termchat_ggml", "int4mm", "mkldnn", "addmm", "linear")),
    ("forward: attention", ("unified_attention", "termchat_attn")),  # termchat_attn also writes the KV cache
    ("forward: KV-cache update", ("kv_cache_update",)),
    ("forward: norms", ("rms_norm",)),
    ("forward: inductor's fused kernels", ("cpp_fused", "kernel_cpp")),
]
STAGES = [
    ("drafter (proposing)", ("propose_draft_token_ids",)),  # called inside sample_tokens: before the sampler
    ("output layer (compute_logits)", ("compute_logits",)),
    ("sampler", ("sample_tokens", "_sample", "sampler")),
    ("input preparation", ("_prepare_inputs", "_prepare_input", "_update_states", "_prepare")),
    ("scheduler", ("schedule", "update_from_output")),
    ("output processing", ("process_outputs", "_process_engine_step", "put_nowait", "send", "serialize", "encode")),
]
NATIVE_HZ = 499
CPP_GRAPH = "forward: the compiled graph (C++ wrapper; --op-kinds splits it)"
IDLE = ("_process_input_queue", "get", "wait", "poll", "select", "recv", "sleep")

# --native: what a perf sample of the engine core's threads was running, by its frames (innermost
# first, "symbol (library)"); first match wins
NATIVE = [
    ("waiting in OpenMP (barrier or dock)", lambda frames: "libgomp" in frames[0]),
    ("matmuls and output layer (ggml)", lambda frames: any("termchat_ggml" in f and ("few_rows" in f or "quantize_row" in f or "ggml_" in f) for f in frames)),
    ("attention (termchat's kernel)", lambda frames: any("termchat_ggml" in f and ("own::" in f or f.startswith("attend ")) for f in frames)),
    ("norms", lambda frames: any("rms_norm" in f for f in frames)),
    ("inductor's fused kernels", lambda frames: any("cpp_fused" in f or "kernel_cpp" in f for f in frames)),
    ("Python", lambda frames: "libpython" in frames[0]),
    ("torch, libc (dispatch, allocation)", lambda frames: any(lib in frames[0] for lib in ("libtorch", "libc10", "libc.so", "libstdc++", "libm.so", "libtbbmalloc"))),
    ("the kernel (system calls, faults, switches)", lambda frames: "[kernel" in frames[0]),
]


def native_samples(text: str) -> dict[str, Counter]:
    """`perf script -F tid,ip,sym,dso` of a call-graph recording: per thread
    id, the samples by NATIVE kind ("other" when none matches)."""
    by_thread: dict[str, Counter] = {}
    for block in text.split("\n\n"):
        lines = [line.strip() for line in block.strip().splitlines() if line.strip()]
        if len(lines) < 2 or not lines[0].isdigit():
            continue
        frames = [line.split(None, 1)[1] if " " in line else line for line in lines[1:]]  # drop the address
        kind = next((k for k, test in NATIVE if test(frames)), "other")
        by_thread.setdefault(lines[0], Counter())[kind] += 1
    return by_thread


def native_table(by_thread: dict[str, Counter], step_tid: str, hz: int, seconds: float, step_ms: float) -> list[str]:
    """The step thread and the OpenMP worker (the busiest other thread), each
    kind as ms of a step; what neither ran (off a core) is the rest."""
    others = sorted((t for t in by_thread if t != step_tid), key=lambda t: -sum(by_thread[t].values()))
    shown = [("step thread", step_tid)] + ([("OpenMP worker", others[0])] if others else [])
    possible = hz * seconds
    out = ["| kind | " + " | ".join(f"{name}: ms of a step" for name, _ in shown) + " |", "|---|" + "---|" * len(shown)]
    kinds = [k for k, _ in NATIVE] + ["other"]
    for kind in kinds:
        out.append(f"| {kind} | " + " | ".join(f"{by_thread.get(t, Counter())[kind] / possible * step_ms:.2f}" for _, t in shown) + " |")
    out.append("| off a core (not sampled) | " + " | ".join(f"{max(0.0, 1 - sum(by_thread.get(t, Counter()).values()) / possible) * step_ms:.2f}" for _, t in shown) + " |")
    return out


def _stack(line: str) -> tuple[list[tuple[str, str, int]], int]:
    """py-spy's raw line: frames outermost first, as (function, file, line), and its count."""
    stack, _, count = line.rstrip("\n").rpartition(" ")
    frames = []
    for frame in stack.split(";"):
        name, _, where = frame.partition(" (")
        file, _, number = where.rstrip(")").rpartition(":")
        frames.append((name, file, int(number) if number.isdigit() else 0))
    return frames, int(count) if count.isdigit() else 0


class Lines:
    """Source lines of the files the samples name (inductor's generated modules)."""

    def __init__(self):
        self.cache: dict[str, list[str]] = {}
        self.unsorted: Counter = Counter()  # graph lines no GRAPH_OPS entry matched

    ROOTS: ClassVar[list[Path]] = [Path.home() / ".cache" / "vllm", Path(tempfile.gettempdir())]

    def get(self, file: str, number: int) -> str:
        if file not in self.cache:
            path = Path(file)
            if not path.is_absolute():  # py-spy names a generated module by its file name: inductor keeps it under <cache>/XX/
                path = next((p for root in self.ROOTS for p in root.glob(f"**/{file[1:3]}/{file}")), path)
            try:
                self.cache[file] = path.read_text(errors="replace").splitlines() if path.is_absolute() and path.is_file() else []
            except OSError:
                self.cache[file] = []
        lines = self.cache[file]
        return lines[number - 1] if 0 < number <= len(lines) else ""


def classify(frames: list[tuple[str, str, int]], lines: Lines) -> str:
    names = [f[0] for f in frames]
    joined = " ".join(names)
    if "execute_model" in joined or "_model_forward" in joined or "compute_logits" in joined or "sample_tokens" in joined:
        for component, marks in STAGES[:4]:
            if any(m in n for n in names for m in marks):
                return component
        if any(m in n for n in names for m in ("kv_cache_update", "reshape_and_cache")):
            return "forward: KV-cache update"
        if any(m in n for n in names for m in ("unified_attention", "cpu_attention", "AttentionBackendImpl.forward")):
            return "forward: attention"
        if any(f[0].startswith("_wrap_func.") for f in frames):  # inductor's C++ wrapper: the graph is one call
            return CPP_GRAPH
        graph = [f for f in frames if f[0] == "Runner.call" or "torch_compile_cache" in f[1]]  # inductor's generated module
        if graph:
            called = lines.get(graph[-1][1], graph[-1][2])
            for component, marks in GRAPH_OPS:
                if any(m in called for m in marks):
                    return component
            lines.unsorted[called.strip()[:120] or f"{graph[-1][0]} ({graph[-1][1]}:{graph[-1][2]})"] += 1
            return "forward: other graph ops"
        if "forward" in joined:
            return "forward: outside the graph"
        return "model runner: other"
    for component, marks in STAGES[4:]:
        if any(m in n for n in names for m in marks):
            return component
    if frames and any(frames[-1][0].endswith(i) or frames[-1][0] == i for i in IDLE):
        return "idle"
    return "engine core: other"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m termchat.bench.step", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="local-plain", help="a built-in profile, NAME or NAME:FORMAT (run plain)")
    parser.add_argument("--seconds", type=float, default=12.0, help="how long py-spy samples")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples a second")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--raw", type=Path, help="also keep py-spy's samples in this file")
    parser.add_argument("--speculative", action="store_true", help="keep the profile's speculation: the budget of its steps, drafts or not")
    parser.add_argument("--op-kinds", action="store_true",
                        help="split the forward by op kind: the engine runs inductor's Python wrapper, whose lines py-spy reads "
                             "(the built-ins' C++ wrapper is one native call; its steps are shorter)")
    parser.add_argument("--category", help="a built-in prompt category's prompts (bench/prompt_sets.py) instead of the three below")
    parser.add_argument("--temperature", type=float, default=0.0, help="sample at this temperature (top_p --top-p, no seed, as the TUI asks) instead of greedily")
    parser.add_argument("--top-p", type=float, default=0.95, help="with --temperature above 0")
    parser.add_argument("--file", help="a user-size file instead (1.7b or 7b, bench/user_files.py), added and served from a one-line profile")
    parser.add_argument("--native", action="store_true",
                        help="then sample the engine core's native stacks with Linux perf (Debian: apt install linux-perf) as long: "
                             "the step thread's and the OpenMP worker's time by kind, waits included")
    args = parser.parse_args(argv)
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        print("py-spy is not installed here: pip install 'termchat[bench]'", file=sys.stderr)
        return 2
    from termchat.bench import user_files
    from termchat.bench.command import machine_line
    from termchat.bench.peers import added_profile
    from termchat.engine.client import Sampling, complete_sync
    from termchat.engine.connect import open_engine

    perf = shutil.which("perf")
    if args.native and perf is None:
        print("perf is not installed here (Debian: apt install linux-perf)", file=sys.stderr)
        return 2
    if args.file and args.file not in user_files.SHAPES:
        parser.error(f"--file takes {', '.join(user_files.SHAPES)}")
    base = added_profile(args.file)[0] if args.file else termchat_profile(profile_specs(parser, args.profile)[0])
    label = f"{args.file}.gguf (one-line profile)" if args.file else args.profile
    profile = base if args.speculative else dataclasses.replace(base, speculative=None)
    if args.op_kinds:
        compilation = dict(profile.engine_args.get("compilation_config") or {})
        compilation["inductor_compile_config"] = {**compilation.get("inductor_compile_config", {}), "cpp_wrapper": False}
        profile = dataclasses.replace(profile, engine_args={**profile.engine_args, "compilation_config": compilation})
    mode = ("speculative" if profile.speculative else "plain") + (", Python wrapper" if args.op_kinds else "")
    prompts = PROMPTS
    if args.category:
        from termchat.bench.prompt_sets import builtin, named

        try:
            prompts = [p.text for p in builtin(named(args.category))]
        except UserError as exc:
            parser.error(str(exc))
    engine = open_engine(profile, progress=engine_start_line(), attach=False)
    try:
        sampling = Sampling(temperature=args.temperature, max_tokens=args.max_tokens)
        if args.temperature > 0:
            sampling = dataclasses.replace(sampling, top_p=args.top_p)
        complete_sync(engine, [{"role": "user", "content": "Say hi."}], Sampling(temperature=0.0, max_tokens=8))
        replies = [complete_sync(engine, [{"role": "user", "content": p}], sampling).stats for p in prompts[:4]]
        quiet = [s.decode_tokens_per_s or 0.0 for s in replies]
        # a step is one forward pass: tokens a step differ with drafts, so time the steps themselves
        step_ms = 1000 * statistics.median(s.decode_s / (s.steps - 1) for s in replies if s.decode_s and s.steps and s.steps > 1)
        per_step = statistics.median(s.output_tokens / s.steps for s in replies if s.steps)
        core = next(p for p in proc.group_members(engine.pid) if p != engine.pid)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "step.raw"
            stop = threading.Event()
            profiled: list[float] = []

            def load() -> None:
                i = 0
                while not stop.is_set():
                    stats = complete_sync(engine, [{"role": "user", "content": prompts[i % len(prompts)]}], sampling).stats
                    profiled.append(stats.decode_tokens_per_s or 0.0)
                    i += 1

            worker = threading.Thread(target=load, daemon=True)
            worker.start()
            time.sleep(1.0)
            before = (proc.cpu_ticks(engine.pid), proc.cpu_ticks(core), time.monotonic())
            subprocess.run([spy, "record", "--pid", str(core), "--rate", str(args.rate), "--duration", str(int(args.seconds)), "--nonblocking",
                            "--threads", "--format", "raw", "--output", str(out)], check=True, capture_output=True)
            after = (proc.cpu_ticks(engine.pid), proc.cpu_ticks(core), time.monotonic())
            native = None
            if args.native:  # after py-spy, not beside it
                data = Path(tmp) / "perf.data"
                subprocess.run([perf, "record", "-F", str(NATIVE_HZ), "-g", "-p", str(core), "-o", str(data), "--", "sleep", str(args.seconds)],
                               check=True, capture_output=True)
                script = subprocess.run([perf, "script", "-i", str(data), "-F", "tid,ip,sym,dso"], check=True, capture_output=True, text=True, errors="replace")
                native = native_samples(script.stdout)
            stop.set()
            worker.join()
            raw = out.read_text(errors="replace").splitlines()
            if args.raw:
                shutil.copyfile(out, args.raw)
    finally:
        engine.stop()
    hz = os.sysconf("SC_CLK_TCK")
    wall = after[2] - before[2]
    by_thread: dict[str, Counter] = {}
    lines = Lines()
    for line in raw:
        thread, _, rest = line.partition(";")  # py-spy --threads: "thread (TID): NAME" first
        frames, count = _stack(rest)
        if not frames or not count:
            continue
        by_thread.setdefault(thread, Counter())[classify(frames, lines)] += count
    # the thread that runs the step: the one with the most forward-pass samples
    step_thread = max(by_thread, key=lambda t: sum(n for c, n in by_thread[t].items() if c.startswith("forward")))
    counts = by_thread[step_thread]
    busy = sum(n for c, n in counts.items() if c != "idle")
    print(machine_line(None))
    how = f"T={args.temperature:g} top_p {args.top_p:g}" if args.temperature > 0 else "greedy"
    print(f"{label} ({mode}), {how}, {args.max_tokens} tokens: unprofiled decode {statistics.median(quiet):.1f} tok/s "
          f"(engine clock, median of {len(quiet)}), {step_ms:.2f} ms a step, {per_step:.2f} tokens a step; under py-spy ({args.rate} Hz, nonblocking, {wall:.0f} s) "
          f"{statistics.median(profiled) if profiled else 0:.1f} tok/s")
    print(f"CPU over the window: engine core {(after[1] - before[1]) / hz / wall:.2f} cores, API server {(after[0] - before[0]) / hz / wall:.2f} cores; "
          f"the step thread busy in {busy} of {sum(counts.values())} samples\n")
    print("| component | share of the step thread's busy samples | ms of an unprofiled step |")
    print("|---|---|---|")
    for component, n in sorted(((c, n) for c, n in counts.items() if c != "idle"), key=lambda cn: -cn[1]):
        print(f"| {component} | {n / busy:.1%} | {n / busy * step_ms:.2f} |")
    if native is not None:
        print(f"\nnative, `perf record -F {NATIVE_HZ} -g` of the engine core for {args.seconds:g} s after py-spy "
              "(a kind is the sampled time over the window, as ms of an unprofiled step):")
        print("\n".join(native_table(native, str(core), NATIVE_HZ, args.seconds, step_ms)))
    if lines.unsorted:
        print("\ngraph lines in \"other graph ops\" (samples of every thread):")
        for text, n in lines.unsorted.most_common(8):
            print(f"  {n:6d}  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
