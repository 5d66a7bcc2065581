"""The real engine: streaming, speculation statistics, the API key, `termchat ask`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from termchat.engine.client import ChatStream, Sampling, complete_sync

from .conftest import ROOT, TERMCHAT

pytestmark = pytest.mark.engine

REPEAT_CODE = """Repeat this code exactly, with no comment:

def add(a, b):
    return a + b


def sub(a, b):
    return a - b


def mul(a, b):
    return a * b
"""


def test_reply_streams_in_several_steps(shared_engine):
    stream = complete_sync(shared_engine, [{"role": "user", "content": "Count from 1 to 20."}], Sampling(temperature=0.0, max_tokens=40))
    assert len(stream.steps) > 3
    times = [s.at for s in stream.steps]
    assert times == sorted(times) and times[-1] > times[0]  # arrived over time, not in one piece
    assert stream.text == "".join(s.text for s in stream.steps) and stream.text.strip()
    assert stream.stats.output_tokens == sum(len(s.token_ids) for s in stream.steps)
    assert stream.stats.decode_tokens_per_s > 0 and stream.stats.ttft_s > 0
    # the engine's own decode time (--enable-per-request-metrics), within what this client waited
    assert stream.stats.decode_source == "server" and 0 < stream.stats.decode_s <= times[-1] - stream.started


def test_a_reply_whose_log_probabilities_list_u2028_streams_whole(shared_engine):
    """vLLM corrects a top-log-probability alternative that completes a
    character the reply began (bytes e2 80 sampled, a8 listed) to U+2028, and
    its JSON leaves U+2028 raw. A client that split SSE lines at it (httpx's
    aiter_lines does) broke a sampled reply in CI as "not JSON". Greedy, this
    prompt makes the engine send raw U+2028 (checked first, on the bare
    stream), and the client must still read the whole reply."""
    messages = [{"role": "user", "content": "Echo: x\u2027y\u2027z\u2027w"}]
    sampling = Sampling(temperature=0.0, max_tokens=40, logprobs=True, top_logprobs=20)
    stream = complete_sync(shared_engine, messages, sampling)
    assert stream.stats.finish_reason in ("stop", "length") and stream.text
    assert len(stream.token_logprobs) == stream.stats.output_tokens == len(stream.token_top)
    body = ChatStream(shared_engine, messages, sampling).body()
    raw = httpx.post(shared_engine.base_url + "/chat/completions", json=body, headers=shared_engine.headers(), timeout=120).content.decode()
    assert "\u2028" in raw, "the engine sent no raw U+2028 this time: the test needs another prompt"


def test_local_speculation_pays_on_repeated_code(shared_engine):
    stream = complete_sync(shared_engine, [{"role": "user", "content": REPEAT_CODE}], Sampling(temperature=0.0, max_tokens=120))
    stats = stream.stats
    assert stats.acceptance_source == "server"
    assert stats.acceptance_rate > 0.3, stats.summary()
    assert stats.mean_acceptance_length > 1.5, stats.summary()
    assert len(stats.acceptance_per_position) == shared_engine.profile.num_speculative_tokens
    # some steps carried several tokens: drafts were accepted where we could see them
    assert max(len(s.token_ids) for s in stream.steps) > 1


def test_the_api_key_is_nowhere_on_disk_or_in_ps(shared_engine):
    from termchat.paths import data_dir

    key = shared_engine.api_key
    assert key and key not in shared_engine.log_path.read_text(errors="replace")
    cmdline = (Path("/proc") / str(shared_engine.pid) / "cmdline").read_bytes().decode(errors="replace")
    assert "termchat.engine.guarded_server" in cmdline and key not in cmdline  # vLLM behind its argument guard
    for db in data_dir().glob("termchat.db*"):
        # read in another process: opening and closing the database file here would
        # drop the POSIX locks of this process's live connections and corrupt it
        assert subprocess.run(["grep", "-q", "-F", "-e", key, "--", str(db)]).returncode == 1, db


def test_request_without_the_api_key_is_refused(shared_engine):
    body = {"model": shared_engine.model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(shared_engine.base_url + "/chat/completions", json=body, timeout=30).status_code == 401
    wrong = {"Authorization": "Bearer not-the-key"}
    assert httpx.post(shared_engine.base_url + "/chat/completions", json=body, headers=wrong, timeout=30).status_code == 401
    assert httpx.post(shared_engine.base_url + "/chat/completions", json=body, headers=shared_engine.headers(), timeout=60).status_code == 200


def test_ask_json_attaches_to_the_served_engine_and_reports_every_statistic(shared_engine):
    result = subprocess.run([*TERMCHAT, "ask", "--json"], input=REPEAT_CODE, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    for key in ("text", "output_tokens", "ttft_s", "decode_tokens_per_s", "acceptance_rate", "mean_acceptance_length", "acceptance_per_position", "temperature"):
        assert key in data, key
    assert data["output_tokens"] > 0 and data["text"]
    assert data["temperature"] == 0.0  # a code prompt: the profile's code_temperature
    assert data["acceptance_source"] == "server"
    # attached, not owned: the shared engine is still up
    assert httpx.get(shared_engine.root_url + "/health", timeout=10).status_code == 200


def test_ask_streams_text_to_stdout_and_stats_to_stderr(shared_engine):
    result = subprocess.run([*TERMCHAT, "ask", "Say hello."], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "tok/s" in result.stderr and "T=0.7" in result.stderr and "text prompt" in result.stderr


def test_the_engine_core_runs_rmsnorm_on_vllms_cpu_kernels(shared_engine):
    # vllm_plugin.use_cpu_norm_kernels: vLLM registers its C++ RMSNorm for GPUs only, and on
    # a CPU ran eight torch ops per norm, 61 norms per step; the engine core's priority now
    # puts the C++ kernels first (native stays the fallback)
    log = shared_engine.log_path.read_text(errors="replace")
    chosen = [line for line in log.splitlines() if "Final IR op priority" in line and "EngineCore" in line]
    assert chosen and "rms_norm=['termchat_cpu_c', 'native']" in chosen[-1] and "fused_add_rms_norm=['termchat_cpu_c', 'native']" in chosen[-1], chosen


def test_a_cpu_engine_loads_cached_kernels_without_torchs_compiler_probes_unless_the_user_asks():
    # vllm_plugin.quick_compiled_load: torch's inductor dlopen-probed each vector ISA in nine
    # fresh Pythons and preprocessed its header with g++ on every compiled start (1.6 s of 1.9)
    code = ("from termchat.vllm_ext import plugin as vllm_plugin; print(vllm_plugin.quick_compiled_load()); "
            "from torch._inductor import config; print(config.cpp.vec_isa_ok, config.cpp_cache_precompile_headers)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHINDUCTOR_")}
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert plain.stdout.split() == ["True", "True", "False"], plain.stderr[-2000:]
    asked = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                           env={**env, "TORCHINDUCTOR_VEC_ISA_OK": "0", "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "1"})
    assert asked.stdout.split() == ["True", "False", "True"], asked.stderr[-2000:]


def test_vllms_cpu_rmsnorm_kernels_compute_what_the_native_norm_computes():
    import torch

    from termchat.vllm_ext import plugin as vllm_plugin

    vllm_plugin.use_cpu_norm_kernels()
    from vllm import ir

    generator = torch.Generator().manual_seed(0)
    x, residual, weight = (torch.randn(shape, generator=generator) for shape in ((7, 576), (7, 576), (576,)))
    native, kernel = (ir.ops.rms_norm.impls[p].impl_fn(x, weight, 1e-5) for p in ("native", vllm_plugin.NORM_PROVIDER))
    assert torch.allclose(native, kernel, rtol=1e-5, atol=1e-5)
    native = ir.ops.fused_add_rms_norm.impls["native"].impl_fn(x.clone(), residual.clone(), weight, 1e-5)
    kernel = ir.ops.fused_add_rms_norm.impls[vllm_plugin.NORM_PROVIDER].impl_fn(x.clone(), residual.clone(), weight, 1e-5)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(native, kernel))
    # arguments the kernels do not take go to the native norm
    supports = ir.ops.rms_norm.impls[vllm_plugin.NORM_PROVIDER].supports_args
    assert supports(x, weight, 1e-5) and not supports(x, weight, 1e-5, 64) and not supports(x.t(), weight, 1e-5)


def test_the_built_in_engine_forks_its_engine_core_and_corrects_sampling_there(shared_engine):
    # TERMCHAT_FORK_ENGINE_CORE (guarded_server.fork_engine_core): two processes, the engine
    # core forked from the API server; termchat's sampling self-check ran in the engine core
    # (the process that samples) and not in the API server, whose OpenMP work before the
    # fork would hang the child
    import re

    from termchat.engine.proc import group_members

    members = group_members(shared_engine.pid)
    assert len(members) == 2, members
    core = next(p for p in members if p != shared_engine.pid)
    assert (Path("/proc") / str(core) / "stat").read_text().split()[3] == str(shared_engine.pid)  # its child
    log = shared_engine.log_path.read_text(errors="replace")
    checked = [line for line in log.splitlines() if "termchat: replaced" in line or "could not self-check" in line]
    assert checked and all(re.match(r"\(EngineCore pid=\d+\)", line) for line in checked), checked
    # and the samplers' other corrections with it, each said once, in the engine core only
    for patch in ("sample_by_position", "short_verification", "quick_recovered_noise", "top_p"):
        said = [line for line in log.splitlines() if line.endswith(f"({patch})")]
        assert len(said) == 1 and said[0].startswith("(EngineCore pid="), (patch, said)


def test_a_busy_process_changes_the_threads_not_the_reply(shared_engine):
    """Beside busy processes the engine steps on the cores they leave free
    (vllm_ext/threads.py: one thread on a 2-core machine, where two waited for
    each other at every barrier and decoded at 0.6 tok/s). The reply is the
    same token for token: each output is computed by one thread whatever the
    count."""
    import re
    import time

    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("one core: there is no thread to give up")
    messages = [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."}]
    sampling = Sampling(temperature=0.0, max_tokens=48)
    quiet = complete_sync(shared_engine, messages, sampling)
    seen = len(shared_engine.log_path.read_text(errors="replace"))
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores - 1)]
    try:
        time.sleep(1.0)
        loaded = complete_sync(shared_engine, messages, sampling)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    counts = [int(n) for n in re.findall(r"termchat: steps take (\d+) thread", shared_engine.log_path.read_text(errors="replace")[seen:])]
    assert counts and min(counts) < cores, counts  # it gave cores up while the busy processes ran
    assert [t for s in loaded.steps for t in s.token_ids] == [t for s in quiet.steps for t in s.token_ids]
    assert loaded.text == quiet.text


def test_the_engine_has_one_gloo_loop_thread(shared_engine):
    """vLLM's CPU worker makes 13 gloo process groups at world size 1, and torch
    gave each a TCP loop thread waking every 10 ms: 1,290 wake-ups a second in
    an idle engine, and a core taken from the step's threads 550-830 times in
    2 s of decoding (bench README, "Thirteen gloo loops"). The groups share one
    device now (threads.one_gloo_loop): one loop in the whole server."""
    from termchat.engine.proc import group_members

    names = []
    for pid in group_members(shared_engine.pid):  # the server's process group: it and its engine core
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                names.append(open(f"/proc/{pid}/task/{task}/comm").read().strip())
            except OSError:
                pass
    assert "VLLM::EngineCor" in names  # the engine core was among them
    assert names.count("gloo_tcp_loop") == 1, names


def test_the_engine_allocates_with_onetbbs_malloc(shared_engine):
    """The engine's processes run with oneTBB's scalable malloc preloaded
    (process.scalable_malloc): glibc's malloc took 3% of the step thread."""
    from termchat.engine.proc import group_members

    members = group_members(shared_engine.pid)
    assert len(members) >= 2  # the server and its engine core
    for pid in members:
        with open(f"/proc/{pid}/maps") as maps:
            assert "libtbbmalloc_proxy.so" in maps.read(), pid


def test_the_allocator_stays_glibcs_when_the_user_preloads_or_says_so():
    from termchat.engine.process import scalable_malloc

    ours = scalable_malloc({})
    assert ours is not None and [p.rsplit("/", 1)[-1] for p in ours.split(":")] == ["libtbbmalloc.so.2", "libtbbmalloc_proxy.so.2"]
    assert scalable_malloc({"TERMCHAT_MALLOC": "glibc"}) is None
    assert scalable_malloc({"LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4"}) is None  # the user's choice stays


def test_a_start_that_compiles_says_so_and_one_that_loads_the_cache_does_not(tmp_path):
    """The progress of an engine start names the long phase (vLLM compiling the
    model on the first start of its settings) from vLLM's own log lines, and
    says nothing special once the compiled model was loaded or the engine is up."""
    from termchat.engine.process import COMPILING, LOADED_COMPILED, ManagedEngine
    from termchat.profiles import builtin_profiles

    log = tmp_path / "engine.log"
    engine = ManagedEngine(profile=builtin_profiles()["local"], base_url="http://127.0.0.1:1/v1", api_key="k", model_name="m", log_path=log, owned=False)
    assert engine.start_phase() == ""  # no log yet
    log.write_text("INFO Loading weights took 0.38 seconds\n")
    assert engine.start_phase() == ""
    log.write_text(log.read_text() + f"INFO [cpu_model_runner.py:87] {COMPILING}...\n")
    assert "compiling the model for this CPU" in engine.start_phase()
    assert "compiling the model for this CPU" in engine._progress_line()
    log.write_text(log.read_text() + f"INFO [decorators.py:319] [backbone] {LOADED_COMPILED} from path /x\n")
    assert engine.start_phase() == ""
    log.write_text(f"INFO {COMPILING}...\nINFO [core.py:402] init engine (profile, create kv cache, warmup model) took 84.21 s\n")
    assert engine.start_phase() == ""  # compiled, and up
