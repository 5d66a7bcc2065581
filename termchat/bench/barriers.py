"""One thread or two beside other work: the smaller experiment behind vllm_ext/threads.py.

    python -m termchat.bench.barriers [--seconds 5]

A decode-like step without an engine: 30 layers of seven batch-1 float32
matmuls at the default model's shapes (576 x 576 ... 576 x 1536), each an
OpenMP parallel region that ends at a barrier, as the engine's kernels do.
For each load beside it (quiet; a process busy part of every 16 ms, as a
terminal UI is while a reply streams; one or two `while True: pass`) it
prints the median step time on one thread and on all cores, each in a fresh
process (OMP_NUM_THREADS is read at start). Where one thread wins, the
engine's Governor should give a core up.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

STEP = r"""
import sys, time, torch
torch.manual_seed(0)
h, f = 576, 1536
ws = [(torch.randn(h, h), torch.randn(h, h // 3), torch.randn(h, h // 3), torch.randn(h, h), torch.randn(h, f), torch.randn(h, f), torch.randn(f, h)) for _ in range(30)]
x = torch.randn(1, h)
def step():
    y = x
    for q, k, v, o, g, u, d in ws:
        a = y @ q; y @ k; y @ v; y2 = a @ o
        t = torch.nn.functional.silu(y2 @ g) * (y2 @ u)
        y = torch.nn.functional.rms_norm(t @ d, (h,))
for _ in range(20): step()
times, end = [], time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    t = time.perf_counter(); step(); times.append(time.perf_counter() - t)
times.sort()
print(times[len(times) // 2] * 1e3)
"""

PART_BUSY = r"""
import sys, time
busy, idle = float(sys.argv[1]), float(sys.argv[2])
while True:
    end = time.perf_counter() + busy
    while time.perf_counter() < end: pass
    time.sleep(idle)
"""

LOADS = [  # label, [(busy s, idle s) per process; None: always busy]
    ("quiet", []),
    ("busy 25% of the time", [(0.004, 0.012)]),
    ("busy 50%", [(0.008, 0.008)]),
    ("busy 75%", [(0.012, 0.004)]),
    ("1 busy process", [None]),
    ("2 busy processes", [None, None]),
]


def step_ms(threads: int, seconds: float) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run([sys.executable, "-c", STEP, str(seconds)], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m termchat.bench.barriers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measuring time per cell")
    args = parser.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    from termchat.bench.command import machine_line

    print(machine_line(None))
    print(f"median step ms (30 layers x 7 batch-1 matmuls, float32), one thread against {cores}, each beside the load\n")
    print(f"| load beside it | 1 thread | {cores} threads | {cores} threads / 1 |")
    print("|---|---|---|---|")
    for label, procs in LOADS:
        started = [subprocess.Popen([sys.executable, "-c", "while True: pass"] if p is None else [sys.executable, "-c", PART_BUSY, str(p[0]), str(p[1])]) for p in procs]
        try:
            time.sleep(1.0 if started else 0.0)
            one, many = step_ms(1, args.seconds), step_ms(cores, args.seconds)
        finally:
            for p in started:
                p.kill()
                p.wait()
        print(f"| {label} | {one:.1f} | {many:.1f} | {many / one:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
