"""Who runs on the engine's cores while it decodes, and whom they displace.

    python -m termchat.bench.displaced [--profile local-plain] [--seconds 2] [--max-tokens 1000]

On a 2-core machine the engine's two threads (the one that runs the step and
OpenMP's second) want both cores for the whole step, and every other thread
that wakes takes one of them: vLLM's API server, the engine core's output
thread, this client. A thread taken off its core inside a parallel region
holds the other at the next barrier, so a few hundred microseconds of
front-end work cost the step about as much. This bench shows it: it starts
the profile's engine, streams a long greedy reply twice, one token a chunk
and then in the chunks termchat picks for the engine (client.chunk_tokens),
and records each reply's context switches for a few seconds with `perf`
(`sched:sched_switch`, the whole machine). For every thread it prints its
share of a core, how often it was switched in, and how often it took a core
from one of the engine's two busiest threads. Needs `perf` and the right to
trace (root, or perf_event_paranoid <= 1). Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from termchat.bench.peers import profile_specs, termchat_profile
from termchat.engine import proc
from termchat.progress import engine_start_line

PROMPT = "Write a long story about a lighthouse keeper and a storm, in many paragraphs."
STEP = " (the step's)"
SWITCH = re.compile(r"\[(\d+)\]\s+([\d.]+):\s+sched:sched_switch:.*?prev_pid=(\d+) .*?prev_state=(\S+) ==> .*?next_pid=(\d+)")


@dataclass
class Tally:
    """What `perf script` shows of a window: per thread id, seconds on a CPU and
    times switched in; per (displaced, taker), how often a runnable thread lost
    its CPU to another (not to idle)."""

    seconds: float = 0.0
    runtime: Counter = field(default_factory=Counter)
    switched_in: Counter = field(default_factory=Counter)
    took_from: Counter = field(default_factory=Counter)  # (displaced tid, taker tid) -> times


def tally(text: str) -> Tally:
    """Sum `perf script -F cpu,time,event,trace` lines of sched_switch events.
    A line that is not one is skipped (perf's own headers, other events)."""
    out = Tally()
    on_cpu: dict[str, tuple[str, float]] = {}
    first = last = None
    for line in text.splitlines():
        m = SWITCH.search(line)
        if not m:
            continue
        cpu, when, prev, state, nxt = m.group(1), float(m.group(2)), m.group(3), m.group(4), m.group(5)
        first = when if first is None else first
        last = when
        if cpu in on_cpu:
            tid, since = on_cpu[cpu]
            out.runtime[tid] += when - since
        on_cpu[cpu] = (nxt, when)
        out.switched_in[nxt] += 1
        if state.startswith("R") and prev != "0" and nxt != "0":  # preempted while runnable, by a thread
            out.took_from[(prev, nxt)] += 1
    out.seconds = (last - first) if first is not None else 0.0
    return out


def thread_names(roles: dict[str, str]) -> dict[str, str]:
    """Every thread of the machine now: tid -> "process / thread name", a process
    named by its role where it has one (roles: pid -> role)."""
    names = {}
    for task in Path("/proc").glob("[0-9]*/task/[0-9]*"):
        try:
            pid = task.parent.parent.name
            process = roles.get(pid) or f"{(Path('/proc') / pid / 'comm').read_text().strip()} {pid}"
            names[task.name] = f"{process} / {(task / 'comm').read_text().strip()}"
        except OSError:
            continue
    return names


def report(t: Tally, names: dict[str, str], engine_core: str, rows: int = 12) -> list[str]:
    """The table: the engine core's two busiest threads are the step's; every other
    thread name (its threads summed) with its share of a core, switch-ins and the
    times it took a core from the step's threads."""
    def name(tid: str) -> str:
        return "idle" if tid == "0" else names.get(tid, "threads that ended")

    ours = [tid for tid, _ in t.runtime.most_common() if names.get(tid, "").startswith(engine_core + " / ")][:2]
    groups: dict[str, list] = {}
    for tid, seconds in t.runtime.items():
        key = name(tid) + STEP if tid in ours else name(tid)
        group = groups.setdefault(key, [0.0, 0, 0, set()])
        group[0] += seconds
        group[1] += t.switched_in[tid]
        group[3].add(tid)
    lost = 0
    for (displaced, taker), n in t.took_from.items():
        if displaced in ours and taker not in ours:
            groups[name(taker)][2] += n
            lost += n
    lines = [f"window {t.seconds:.2f} s", "| thread | threads | share of a core | switched in | took a core from the step's threads |", "|---|---|---|---|---|"]
    for key, (seconds, ins, took, tids) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:rows]:
        share = seconds / t.seconds if t.seconds else 0.0
        mine = key.endswith(STEP)
        lines.append(f"| {key} | {len(tids)} | {share:.1%} | {ins} | {'-' if mine else took} |")
    lines.append(f"the step's threads lost a core to another thread {lost} times ({lost / t.seconds:.0f} a second)" if t.seconds else "no switches recorded")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m termchat.bench.displaced", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="local-plain", help="a built-in profile, NAME or NAME:FORMAT")
    parser.add_argument("--seconds", type=float, default=2.0, help="how long perf records each reply (0.5-30)")
    parser.add_argument("--max-tokens", type=int, default=1000, help="the reply's length: it must outlast the recording")
    args = parser.parse_args(argv)
    if not 0.5 <= args.seconds <= 30:
        parser.error("--seconds takes 0.5 to 30")
    perf = shutil.which("perf")
    if perf is None:
        print("perf is not installed here (Debian: apt install linux-perf)", file=sys.stderr)
        return 2
    from termchat.bench.command import machine_line
    from termchat.engine.client import Sampling, complete_sync
    from termchat.engine.connect import open_engine

    spec = profile_specs(parser, args.profile)[0]
    engine = open_engine(termchat_profile(spec), progress=engine_start_line(), attach=False)
    print(machine_line())
    try:
        complete_sync(engine, [{"role": "user", "content": "Say hi."}], Sampling(temperature=0.0, max_tokens=8))
        rate = engine.decode_rate
        core = next(p for p in proc.group_members(engine.pid) if p != engine.pid)
        for label, measured in (("one token a chunk", None), ("termchat's chunks", rate)):
            engine.decode_rate = measured
            result = {}

            def reply() -> None:
                stream = complete_sync(engine, [{"role": "user", "content": PROMPT}], Sampling(temperature=0.0, max_tokens=args.max_tokens))
                result["stream"] = stream

            worker = threading.Thread(target=reply)
            worker.start()
            time.sleep(1.0)  # past the prefill
            names = thread_names({str(os.getpid()): "this bench (the client)", str(engine.pid): "vLLM's API server", str(core): "engine core"})
            with tempfile.TemporaryDirectory() as tmp:
                data = Path(tmp) / "perf.data"
                rec = subprocess.run([perf, "record", "-q", "-o", str(data), "-e", "sched:sched_switch", "-a", "--", "sleep", str(args.seconds)],
                                     capture_output=True, text=True)
                text = subprocess.run([perf, "script", "-i", str(data), "-F", "cpu,time,event,trace"], capture_output=True, text=True).stdout if rec.returncode == 0 else ""
            worker.join()
            if rec.returncode != 0:
                print(f"perf could not record: {rec.stderr.strip()[:300]}", file=sys.stderr)
                return 2
            stream = result.get("stream")
            stats = stream.stats if stream else None
            speed = f"{stats.decode_tokens_per_s:.1f} tok/s, {stats.output_tokens} tokens in {len(stream.steps)} chunks" if stats and stats.decode_tokens_per_s else "no reply"
            print(f"\n{spec}, {label} ({stream.chunk_tokens if stream else '?'} tokens): {speed}")
            print("\n".join(report(tally(text), names, "engine core")))
            if stats and stats.output_tokens >= args.max_tokens and stream.steps and stream.steps[-1].at - stream.started < args.seconds + 1.0:
                print("the reply ended before the recording did: raise --max-tokens")
    finally:
        engine.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
