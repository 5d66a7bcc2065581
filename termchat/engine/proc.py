"""Everything termchat reads of /proc (and /sys, of the CPU): one module, the
standard library only (the engine process imports it for its watchdog).

A pid alone does not name a process (pids are recycled); a pid with its start
time (`started_at`) does, and that pair is what leases and state files record.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from termchat.vllm_ext import isa

PROC = Path("/proc")


def pids() -> Iterator[int]:
    try:
        names = os.listdir(PROC)
    except OSError:
        return
    for name in names:
        if name.isdigit():
            yield int(name)


def stat_fields(pid: int | str) -> list[str]:
    """/proc/PID/stat after the command name (which may hold spaces and
    parentheses): [0] state, [1] parent, [2] process group, [11]/[12] user and
    system ticks, [19] start time; [] when the process is gone."""
    try:
        return (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def started_at(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field
    22): with the pid, it names one process, never a later one given the same pid."""
    fields = stat_fields(pid)
    return fields[19] if len(fields) > 19 and fields[0] != "Z" else None


def is_running(pid: int, start: str | None) -> bool:
    """Is the process that had this pid and start time still the one running?"""
    return bool(start) and started_at(pid) == start


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group."""
    members = []
    for pid in pids():
        fields = stat_fields(pid)
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            members.append(pid)
    return members


def children(parent: int) -> set[int]:
    """Live processes whose parent is `parent`."""
    found = set()
    for pid in pids():
        fields = stat_fields(pid)
        if len(fields) > 1 and fields[0] != "Z" and fields[1] == str(parent):
            found.add(pid)
    return found


def _group_sum(pgid: int, file: str, key: str) -> int:
    """One kB field of /proc/PID/<file>, summed over a process group, in bytes."""
    total = 0
    for pid in group_members(pgid):
        try:
            for line in (PROC / str(pid) / file).read_text().splitlines():
                if line.startswith(key):
                    total += int(line.split()[1]) * 1024
                    break
        except (OSError, ValueError, IndexError):
            pass
    return total


def rss_bytes(pgid: int) -> int:
    """Resident memory of a process group (the engine and any helper it started),
    each process's own figure summed: pages the processes share (an engine core
    forked from its server shares its imports) count once per process."""
    return _group_sum(pgid, "status", "VmRSS:")


def pss_bytes(pgid: int) -> int:
    """A process group's resident memory with each shared page counted once
    (the kernel's proportional set size, split among the sharers)."""
    return _group_sum(pgid, "smaps_rollup", "Pss:")


def cpu_ticks(pid: int) -> int:
    """User + system clock ticks of one process so far; 0 when it is gone."""
    fields = stat_fields(pid)
    return int(fields[11]) + int(fields[12]) if len(fields) > 12 else 0


def cpu_seconds(pgid: int) -> float:
    """User + system CPU time of a process group so far (to show an idle engine uses none)."""
    return sum(cpu_ticks(pid) for pid in group_members(pgid)) / os.sysconf("SC_CLK_TCK")


def meminfo(key: str) -> int:
    """A /proc/meminfo figure in bytes (MemAvailable, MemTotal); 0 when unknown."""
    try:
        for line in (PROC / "meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def memory_available() -> int:
    return meminfo("MemAvailable")


def cpu_model() -> str:
    try:
        for line in (PROC / "cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")  # what decides the CPU kernels


def cpu_flags() -> set[str]:
    try:
        for line in (PROC / "cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return isa.visible(set(line.split(":", 1)[1].split()))  # TERMCHAT_CPU_ISA=avx2 hides AVX-512 and AMX
    except OSError:
        pass
    return set()


def cache_sizes() -> dict[str, str]:
    """The first CPU's caches: {"L1d": "32K", "L2": "512K", "L3": "32768K"} (from /sys)."""
    found = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size = ((index / name).read_text().strip() for name in ("level", "type", "size"))
        except OSError:
            continue
        if kind != "Instruction":
            found[f"L{level}" + ("d" if kind == "Data" else "")] = size
    return found


def threads_per_core() -> int | None:
    """Hardware threads that share cpu0's core (1 without SMT; None if /sys does not say).
    Two vCPUs that are one core's two threads give a compute-bound program (llama.cpp's
    4-bit decode) about one core's speed, and a memory-bound one nearly the same."""
    try:
        siblings = Path("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list").read_text().strip()
    except OSError:
        return None
    count = 0
    for part in siblings.split(","):
        low, _, high = part.partition("-")
        try:
            count += int(high or low) - int(low) + 1
        except ValueError:
            return None
    return count or None


def owner(pid: int) -> int | None:
    try:
        return (PROC / str(pid)).stat().st_uid
    except OSError:
        return None


def cmdline(pid: int) -> bytes:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return b""


def command_name(pid: int) -> str:
    try:
        return (PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        return "?"


def pipe_holders(inode: int, skip_pgid: int) -> list[int]:
    """Processes outside group `skip_pgid` (and not this one) holding pipe `inode` open."""
    wanted, found = f"pipe:[{inode}]", []
    for pid in pids():
        try:
            if pid == os.getpid() or os.getpgid(pid) == skip_pgid:
                continue
            fds = PROC / str(pid) / "fd"
            if any(os.readlink(fds / fd) == wanted for fd in os.listdir(fds)):
                found.append(pid)
        except OSError:
            continue
    return found


def pid_alive(pid: int) -> bool:
    return _signal_reaches(os.kill, pid)


def group_alive(pgid: int) -> bool:
    """Does a process of this group still run?"""
    return _signal_reaches(os.killpg, pgid)


def _signal_reaches(send, target: int) -> bool:
    try:
        send(target, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        return True
    return True
