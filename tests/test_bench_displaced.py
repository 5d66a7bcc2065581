"""bench.displaced's reading of perf's context switches (a fixed trace, no engine)."""

from pytest import approx

from termchat.bench.displaced import report, tally

# CPU 0 runs the step thread (101) until the API server (300) preempts it, then the step
# thread again; CPU 1 runs OpenMP's second thread (102), which sleeps, then idle, then 102.
TRACE = """\
            perf  9 [000] 10.000000: sched:sched_switch: prev_comm=perf prev_pid=9 prev_prio=120 prev_state=S ==> next_comm=VLLM::EngineCor next_pid=101 next_prio=120
            perf  9 [001] 10.000000: sched:sched_switch: prev_comm=perf prev_pid=9 prev_prio=120 prev_state=S ==> next_comm=VLLM::EngineCor next_pid=102 next_prio=120
 VLLM::EngineCor 101 [000] 10.004000: sched:sched_switch: prev_comm=VLLM::EngineCor prev_pid=101 prev_prio=120 prev_state=R ==> next_comm=python next_pid=300 next_prio=120
          python 300 [000] 10.005000: sched:sched_switch: prev_comm=python prev_pid=300 prev_prio=120 prev_state=S ==> next_comm=VLLM::EngineCor next_pid=101 next_prio=120
 VLLM::EngineCor 102 [001] 10.006000: sched:sched_switch: prev_comm=VLLM::EngineCor prev_pid=102 prev_prio=120 prev_state=S ==> next_comm=swapper/1 next_pid=0 next_prio=120
         swapper 0 [001] 10.007000: sched:sched_switch: prev_comm=swapper/1 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=VLLM::EngineCor next_pid=102 next_prio=120
 VLLM::EngineCor 102 [001] 10.010000: sched:sched_switch: prev_comm=VLLM::EngineCor prev_pid=102 prev_prio=120 prev_state=R+ ==> next_comm=gloo_tcp_loop next_pid=103 next_prio=120
   gloo_tcp_loop 103 [001] 10.010010: sched:sched_switch: prev_comm=gloo_tcp_loop prev_pid=103 prev_prio=120 prev_state=S ==> next_comm=VLLM::EngineCor next_pid=102 next_prio=120
 VLLM::EngineCor 101 [000] 10.010010: sched:sched_switch: prev_comm=VLLM::EngineCor prev_pid=101 prev_prio=120 prev_state=S ==> next_comm=swapper/0 next_pid=0 next_prio=120
"""
NAMES = {"101": "engine core / VLLM::EngineCor", "102": "engine core / VLLM::EngineCor", "103": "engine core / gloo_tcp_loop", "300": "vLLM's API server / python"}


def test_a_trace_gives_each_threads_time_and_who_took_a_core_from_whom():
    t = tally("perf's header, not an event\n" + TRACE)
    assert t.seconds == approx(0.01001)
    assert t.runtime["101"] == approx(0.004 + 0.00501) and t.runtime["300"] == approx(0.001)
    assert t.runtime["102"] == approx(0.006 + 0.003) and t.runtime["0"] == approx(0.001)  # its last stretch has no end yet
    assert t.switched_in["102"] == 3 and t.switched_in["103"] == 1
    # only a runnable thread losing its CPU to another thread counts: not a sleep, not idle's turn
    assert t.took_from == {("101", "300"): 1, ("102", "103"): 1}


def test_the_report_names_the_steps_threads_and_counts_what_took_their_cores():
    lines = report(tally(TRACE), NAMES, "engine core")
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in lines if line.startswith("| ") and "---" not in line}
    assert rows["engine core / VLLM::EngineCor (the step's)"][0] == "2" and rows["engine core / VLLM::EngineCor (the step's)"][3] == "- |"
    assert rows["vLLM's API server / python"][3] == "1 |" and rows["engine core / gloo_tcp_loop"][3] == "1 |"
    assert lines[-1].startswith("the step's threads lost a core to another thread 2 times")
