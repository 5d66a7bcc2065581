"""The engine's thread count follows the cores other processes leave free
(vllm_ext/threads.py): the decisions on scripted /proc readings, the parsing
of /proc's text. That a product does not depend on the thread count:
test_ggml.test_a_product_does_not_depend_on_the_thread_count; that a reply
does not: test_engine.test_a_busy_process_changes_the_threads_not_the_reply."""

from termchat.vllm_ext import threads
from termchat.vllm_ext.threads import Governor

HZ = 100


class Machine:
    """Scripted /proc readings: each window, others use `others` cores and this process `ours`."""

    def __init__(self):
        self.now, self.busy, self.own = 0.0, 0, 0
        self.broken = False

    def run(self, seconds: float, others: float, ours: float = 1.0):
        self.now += seconds
        self.own += round(ours * seconds * HZ)
        self.busy += round((ours + others) * seconds * HZ)

    def read(self):
        return None if self.broken else (self.busy, self.own)


def governor(cores=2):
    m = Machine()
    return m, Governor(cores, read=m.read, clock=lambda: m.now, hz=HZ)


def test_a_busy_process_takes_a_core_and_gives_it_back():
    m, g = governor()
    assert g.threads() == 2  # the first reading only starts the window
    m.run(0.3, others=0.1, ours=2.0)
    assert g.threads() == 2  # the API server and a client streaming: stay
    m.run(0.3, others=0.9, ours=1.1)
    assert g.threads() == 1 and abs(g.others - 0.9) < 0.05
    m.run(0.3, others=1.0, ours=1.0)
    assert g.threads() == 1
    m.run(0.3, others=0.2, ours=1.0)
    assert g.threads() == 2


def test_hysteresis_keeps_the_count_between_the_thresholds():
    m, g = governor()
    g.threads()
    m.run(0.3, others=0.5, ours=1.5)
    assert g.threads() == 2  # half a core used elsewhere: not enough to give one up
    m.run(0.3, others=1.0)
    assert g.threads() == 1
    m.run(0.3, others=0.5)
    assert g.threads() == 1  # nor to take it back


def test_more_cores_give_up_as_many_as_others_use():
    m, g = governor(cores=8)
    g.threads()
    m.run(0.5, others=2.9, ours=5.0)
    assert g.threads() == 5
    m.run(0.5, others=9.0, ours=1.0)  # more busy processes than cores: one thread, never none
    assert g.threads() == 1


def test_readings_within_a_window_do_not_resample_and_a_failed_reading_keeps_the_count():
    m, g = governor()
    g.threads()
    m.run(0.1, others=1.0)
    assert g.threads() == 2  # 0.1 s: the window is not over
    m.run(0.2, others=1.0)
    assert g.threads() == 1
    m.broken = True
    m.run(0.3, others=0.0)
    assert g.threads() == 1


def test_a_slow_step_is_read():
    """Beside a busy process two threads took 1.6 s a step (0.6 tok/s). A
    rule that skipped long windows as an idle engine's (tried: between
    replies `termchat ask`'s start-up took a core for a second) never read
    them, and the engine stayed there; every window is read."""
    m, g = governor()
    g.threads()
    m.run(1.6, others=1.0, ours=1.0)
    assert g.threads() == 1


def test_proc_text_is_read_as_data():
    stat = "cpu  10 0 10 100 0 0 0 0 0 0\ncpu0 4 1 2 50 9 1 1 1 0 0\ncpu1 6 0 8 50 0 0 0 0 0 0\nintr 1 2\n"
    assert threads._cpu_busy_ticks({0, 1}, stat) == (4 + 1 + 2 + 1 + 1 + 1) + (6 + 8)
    assert threads._cpu_busy_ticks({0}, stat) == 10
    assert threads._cpu_busy_ticks({0, 2}, stat) is None  # a CPU of ours missing: no figure
    assert threads._cpu_busy_ticks({0}, "cpu0 4 x 2 50 9 1 1 1\n") is None
    own = "1234 (python (x) y) R 1 2 3 4 5 6 7 8 9 10 17 25 0 0 20 0 3"
    assert threads._own_ticks(own) == 17 + 25
    assert threads._own_ticks("1234 (short) R 1") is None


def test_this_machine_reads():
    g = Governor(2)
    assert g._read() is not None  # /proc/stat and /proc/self/stat parse here



GLOO_GROUPS = """
import os, sys
import torch, torch.distributed as dist
from termchat.vllm_ext import threads
shared = sys.argv[1] == "shared"
if shared:
    assert threads.one_gloo_loop()
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
groups = [dist.new_group([0], backend="gloo") for _ in range(4)]
total = torch.tensor([1.0, 2.0])
dist.all_reduce(total, group=groups[2])
dist.barrier(group=groups[3])
loops = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")].count("gloo_tcp_loop")
for group in groups:
    dist.destroy_process_group(group)
dist.destroy_process_group()
print(loops, total.tolist())
"""


def test_one_gloo_loop_gives_every_process_group_one_shared_loop_thread():
    """torch gives each gloo process group a device and a thread of its own that
    wakes every 10 ms (vLLM makes 13 at world size 1); with one_gloo_loop the
    groups share one, and still reduce, meet at a barrier and close."""
    import subprocess
    import sys

    def run(mode):
        out = subprocess.run([sys.executable, "-c", GLOO_GROUPS, mode], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        loops, total = out.stdout.strip().splitlines()[-1].split(" ", 1)
        return int(loops), total

    assert run("torch's") == (5, "[1.0, 2.0]")  # the default group and four more, a loop each
    assert run("shared") == (1, "[1.0, 2.0]")


def test_one_gloo_loop_leaves_a_named_interface_to_torch(monkeypatch):
    """GLOO_SOCKET_IFNAME asks torch for a device per named interface: not replaced."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    assert threads.one_gloo_loop() is False
