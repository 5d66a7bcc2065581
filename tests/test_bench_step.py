"""bench.step's budget: each sampled stack goes under the component it names
(py-spy's raw lines as they come; no engine)."""

from termchat.bench import step
from termchat.bench.step import Lines, _stack, classify

RUNNER = "execute_model (vllm/v1/worker/cpu_worker.py:90);CPUModelRunner.execute_model (vllm/v1/worker/gpu_model_runner.py:3000)"


def classified(frames: str, lines: Lines | None = None) -> str:
    parsed, count = _stack(frames + " 3")
    assert count == 3
    return classify(parsed, lines or Lines())


def test_stages_and_ops_are_told_apart(tmp_path, monkeypatch):
    generated = tmp_path / "ab" / "cabxyz.py"  # inductor keeps a module cabxyz.py under <cache>/ab/
    generated.parent.mkdir()
    generated.write_text("def call(args):\n    buf1 = torch.ops.termchat_ggml.linear1.default(buf0, arg3_1)\n    cpp_fused_add_0(buf1)\n    buf2 = empty_strided_cpu((s72, 576), (576, 1))\n")
    monkeypatch.setattr(Lines, "ROOTS", [tmp_path])
    lines = Lines()
    graph = RUNNER + ";_model_forward (vllm/v1/worker/gpu_model_runner.py:2800);CompiledFxGraph.__call__ (torch/_inductor/output_code.py:763)"
    assert classified(graph + ";Runner.call (cabxyz.py:2)", lines) == "forward: matmuls (ggml)"
    assert classified(graph + ";Runner.call (cabxyz.py:3)", lines) == "forward: inductor's fused kernels"
    assert classified(graph + ";Runner.call (cabxyz.py:4)", lines) == "forward: other graph ops"
    assert lines.unsorted  # what no rule named is listed under the table
    assert classified(graph + ";CPUAttentionBackendImpl.forward (vllm/v1/attention/backends/cpu_attn.py:440)") == "forward: attention"
    assert classified(graph + ";CPUAttentionBackendImpl.do_kv_cache_update (vllm/v1/attention/backends/cpu_attn.py:477)") == "forward: KV-cache update"
    assert classified(RUNNER + ";_prepare_inputs (vllm/v1/worker/gpu_model_runner.py:1500)") == "input preparation"
    assert classified(RUNNER + ";LlamaForCausalLM.compute_logits (vllm/model_executor/models/llama.py:600)") == "output layer (compute_logits)"
    assert classified("EngineCore.step (vllm/v1/engine/core.py:400);Scheduler.schedule (vllm/v1/core/sched/scheduler.py:300)") == "scheduler"
    assert classified("EngineCoreProc.run_busy_loop (vllm/v1/engine/core.py:900);Queue.get (queue.py:171)") == "idle"


def test_a_frame_with_an_odd_file_or_line_still_parses():
    frames, count = _stack("f (x.py:notanumber);g (weird (name).py:12) 7")
    assert count == 7 and frames[0] == ("f", "x.py", 0) and frames[1][2] == 12
    assert step.classify(frames, Lines()) == "engine core: other"


def test_inductors_cpp_wrapper_is_one_line_of_the_budget_not_outside_the_graph():
    """The built-ins compile with inductor's C++ wrapper: the whole graph is one native call
    under a generated `_wrap_func.<locals>.g`, which the budget names as such (its op kinds
    need --op-kinds), never as work outside the graph."""
    frames = [("EngineCore.step", "core.py", 1), ("GPUModelRunner.execute_model", "gpu_model_runner.py", 2),
              ("GPUModelRunner._model_forward", "gpu_model_runner.py", 3), ("LlamaModel.forward", "llama.py", 406),
              ("CompiledFxGraph.__call__", "output_code.py", 763), ("_wrap_func.<locals>.g", "cybhlbg2ty.py", 4501)]
    assert step.classify(frames, Lines()) == step.CPP_GRAPH
    assert step.classify(frames[:-1], Lines()) == "forward: outside the graph"


PERF_SCRIPT = """ 100 
\t          101755 _PyEval_EvalFrameDefault (/usr/lib/libpython3.11.so.1.0)
\t    7f6d18e3e040 [unknown] ([unknown])

 101 
\t           1de62 [unknown] (/venv/torch/lib/libgomp.so.1)
\t               0 [unknown] ([unknown])

 101 
\t           2b013 (anonymous namespace)::q4_1_few_rows_tile<1> (/venv/termchat-ggml/termchat_ggml.so)
\t           1e02a [unknown] (/venv/torch/lib/libgomp.so.1)

 100 
\t           3c0d1 own::scores<64l, 3l, 4l> (/venv/termchat-ggml/termchat_ggml.so)

 100 
\t           1e02a [unknown] (/venv/torch/lib/libgomp.so.1)
\t           3c0d1 ggml_linear (/venv/termchat-ggml/termchat_ggml.so)

 100 
\t        ffffffff do_syscall_64 ([kernel.kallsyms])

 102 
\t           11111 something_else (/usr/lib/libfoo.so)
"""


def test_native_samples_go_under_the_kind_their_frames_name():
    by_thread = step.native_samples(PERF_SCRIPT)
    assert by_thread["100"] == {"Python": 1, "attention (termchat's kernel)": 1, "waiting in OpenMP (barrier or dock)": 1,
                                "the kernel (system calls, faults, switches)": 1}
    assert by_thread["101"] == {"waiting in OpenMP (barrier or dock)": 1, "matmuls and output layer (ggml)": 1}
    assert by_thread["102"] == {"other": 1}
    table = step.native_table(by_thread, "100", hz=1, seconds=10, step_ms=5.0)  # 10 possible samples a thread
    assert "step thread" in table[0] and "OpenMP worker" in table[0]  # the busiest other thread: 101, not 102
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:] for line in table[2:]}
    assert rows["Python"][0] == "0.50" and rows["waiting in OpenMP (barrier or dock)"] == ["0.50", "0.50 |"]
    assert rows["off a core (not sampled)"] == ["3.00", "4.00 |"]  # 6 of 10 and 8 of 10 samples missing, of 5 ms
