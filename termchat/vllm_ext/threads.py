"""The engine's threads follow the cores other processes leave free.

A decode step is hundreds of OpenMP parallel regions (every matmul, the
attention of every layer, inductor's fused kernels), each ending at a barrier.
With a busy process beside it on a 2-core machine, one of the engine's two
threads waits for the scheduler at every barrier while the other spins: the
default decoded at 0.6 tok/s beside one `python -c "while True: pass"`, 107
quiet (llama.cpp, with the same barriers: 2.8 against 239). One thread on the
free core waits for no one: 62-67 tok/s beside one busy process, 60-65 beside
two, against 88-90 quiet (`python -m termchat.bench.load`; bench README,
"Beside busy processes").

So before each step the worker asks `Governor.threads()`: every quarter of a
second it reads how much CPU time the machine's other processes took
(/proc/stat over the CPUs this process may run on, less /proc/self/stat),
and the step runs on the cores they leave free, at least one. Where the line
lies comes from `python -m termchat.bench.barriers` (a decode-like step of
batch-1 matmuls beside a process busy part of the time): two threads win
beside a process busy half the time (28.8 ms against 34.9), lose beside one
busy three quarters of it (65.4 against 35.4); so a core is given up when
others use more than 0.6 of one, and taken back under 0.35.

Only the thread count changes: ggml's matmuls, vLLM's attention (KV split
off) and inductor's kernels compute each output with one thread, and
termchat's own attention sums fixed parts of the context in a fixed order, so
a reply does not depend on it (test_ggml, test_attention, test_engine). Standard library only;
Linux, else the count stays as it started. TERMCHAT_ADAPTIVE_THREADS=0
turns it off.
"""

from __future__ import annotations

import logging
import os
import time

WINDOW_S = 0.25  # how often the load is read; a step is 5-80 ms
DROP_AT = 0.6  # cores others use: above this a thread gives its core up ...
RISE_AT = 0.35  # ... and below this it takes it back (a client streaming and the API server use 0.05-0.2)


def _cpu_busy_ticks(cpus: set[int], stat: str) -> int | None:
    """Busy clock ticks of these CPUs since boot, from /proc/stat's text."""
    total = 0
    found = 0
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or not name[3:].isdigit() or int(name[3:]) not in cpus:
            continue
        fields = rest.split()
        if len(fields) < 8 or not all(f.isdigit() for f in fields[:8]):
            return None
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
        total += user + nice + system + irq + softirq + steal
        found += 1
    return total if found == len(cpus) else None


def _own_ticks(stat: str) -> int | None:
    """utime + stime of this process (all its threads), from /proc/self/stat."""
    fields = stat.rpartition(")")[2].split()  # the name may hold spaces and parentheses
    if len(fields) < 13 or not (fields[11].isdigit() and fields[12].isdigit()):
        return None
    return int(fields[11]) + int(fields[12])


def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read(1 << 16)


class Governor:
    """How many threads the next step takes. `read` returns (busy ticks of
    the CPUs, this process's ticks) or None; `clock` is monotonic seconds."""

    def __init__(self, cores: int, read=None, clock=time.monotonic, hz: int | None = None):
        self.cores = max(1, cores)
        self.current = self.cores
        self.others: float | None = None  # cores the other processes used in the last window
        self._clock = clock
        self._hz = hz or os.sysconf("SC_CLK_TCK")
        cpus = os.sched_getaffinity(0) if read is None else set()
        self._read = read or (lambda: self._proc(cpus))
        self._last = None  # (time, busy ticks, own ticks)

    @staticmethod
    def _proc(cpus: set[int]):
        busy, own = _cpu_busy_ticks(cpus, _read("/proc/stat")), _own_ticks(_read("/proc/self/stat"))
        return None if busy is None or own is None else (busy, own)

    def threads(self) -> int:
        now = self._clock()
        if self._last is not None and now - self._last[0] < WINDOW_S:
            return self.current
        sample = self._read()
        if sample is None:
            return self.current
        if self._last is not None:
            elapsed = now - self._last[0]
            others = ((sample[0] - self._last[1]) - (sample[1] - self._last[2])) / (elapsed * self._hz)
            self.others = max(0.0, others)
            free = self.cores - self.others
            if free < self.current - DROP_AT:  # someone took part of a core this step uses
                self.current = max(1, int(free + (1 - DROP_AT)))
            elif free > self.current + 1 - RISE_AT:  # a whole core came back
                self.current = min(self.cores, int(free + RISE_AT))
        self._last = (now, *sample)
        return self.current


def adapt_worker_threads() -> bool:
    """Patch vLLM's CPU worker: each step first sets the thread count the
    Governor gives. False where there is nothing to patch (not Linux)."""
    if not os.path.exists("/proc/self/stat"):
        return False
    import torch
    from vllm.v1.worker import cpu_worker

    logger = logging.getLogger("vllm.termchat_plugin")  # the plugin's: lands in the engine log

    set_threads = torch._C.set_num_threads  # vLLM replaces torch.set_num_threads with a no-op after binding
    original = cpu_worker.CPUWorker.execute_model
    def execute_model(self, scheduler_output, *args, **kwargs):
        governor = getattr(self, "_termchat_governor", None)
        if governor is None:
            governor = self._termchat_governor = Governor(torch.get_num_threads())
        wanted = governor.threads()
        if wanted != torch.get_num_threads():
            logger.info("termchat: steps take %d thread(s); other processes used %.2f cores", wanted, governor.others or 0.0)
            set_threads(wanted)  # this thread's OpenMP count: every kernel of the step reads it
        return original(self, scheduler_output, *args, **kwargs)

    cpu_worker.CPUWorker.execute_model = execute_model
    return True


def one_gloo_loop() -> bool:
    """Every gloo process group of this process on one shared gloo device.

    vLLM's CPU worker makes 13 gloo process groups, even at world size 1 (the
    default group, then a device and a CPU group for each kind of
    parallelism). torch gives each group a gloo device of its own, and each
    device a thread that wakes every 10 ms (gloo's tcp `Device::loop`): 1,290
    wake-ups a second in an idle engine. During a reply they took a core from
    the step's two threads 2-7 times a step, 23-35 us each (median), and one
    thread off its core stalls the other at the next barrier (`perf sched`:
    26-58 ms of a 169-token reply; bench README, "Thirteen gloo loops").
    One device, shared, has one such thread; the groups work as before.
    torch builds a group's gloo backend with `ProcessGroupGloo(store,
    rank, size, timeout=...)`; this subclass gives that call the shared device
    and leaves every other form, and GLOO_SOCKET_IFNAME (a device per named
    interface), to torch. False where torch has no gloo."""
    from torch.distributed import distributed_c10d as c10d

    original = getattr(c10d, "ProcessGroupGloo", None)
    if original is None or not c10d.is_gloo_available() or os.environ.get("GLOO_SOCKET_IFNAME"):
        return False
    if getattr(original, "termchat_shared_device", False):
        return True
    devices = []

    class ProcessGroupGloo(original):
        termchat_shared_device = True

        def __init__(self, store, rank, size, *args, **kwargs):
            if args or set(kwargs) - {"timeout"}:  # options of the caller's own: as torch builds it
                super().__init__(store, rank, size, *args, **kwargs)
                return
            try:
                options = original._Options()
                if kwargs.get("timeout") is not None:
                    options._timeout = kwargs["timeout"]
                if not devices:
                    devices.append(original.create_default_device())
                options._devices = devices
            except Exception:  # a torch whose options differ: a device of the group's own, as before
                super().__init__(store, rank, size, **kwargs)
                return
            super().__init__(store, rank, size, options)

    c10d.ProcessGroupGloo = ProcessGroupGloo
    return True
