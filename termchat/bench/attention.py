"""A decode step's attention: vLLM's CPU kernel against termchat's own, timed together.

    python -m termchat.bench.attention [--contexts 50,300,1000,4000] [--rows 1,4,17] [--rounds 40]

The default model's attention (9 query heads, 3 KV heads of 64, float32, KV
blocks of 128 tokens) over 30 layers, each with a KV cache of its own, for a
request whose new rows (1: a plain decode step; more: drafts being verified)
sit at the end of `context` tokens. Each round runs one step through
termchat_attn's attend() with every layer on vLLM's kernel (VLLM_CPU_ATTN_SPLIT_KV
off, as the engine runs it), then with every layer on the own kernel
(vllm_ext/attention_op.cpp), so a slow minute of a shared host slows both.
Prints the ms of the 30 layers (median of rounds) and vLLM's over the own's,
then the same ratio of each kernel's best round: on a shared host whose speed
drifts by a third within minutes, the best rounds moved least between runs
(bench README, "Drafts of 16 on the own attention kernel").
Both include writing the step's keys and values into the cache, and the
Python call per layer (a few us) that the compiled model does not make.
"""

from __future__ import annotations

import argparse
import statistics

from termchat.bench.command import _ints, machine_line
from termchat.bench.kernels import timed_together

HEADS, KV_HEADS, HEAD, BLOCK, LAYERS = 9, 3, 64, 128, 30


def step_passes(torch, ops, context: int, rows: int) -> dict:
    """name -> the 30 attend() calls of one step, with every layer on that kernel."""
    blocks = -(-context // BLOCK)
    caches = [torch.randn(blocks, KV_HEADS, BLOCK, 2 * HEAD) for _ in range(LAYERS)]
    q, k, v = torch.randn(rows, HEADS, HEAD), torch.randn(rows, KV_HEADS, HEAD), torch.randn(rows, KV_HEADS, HEAD)
    out = torch.empty(rows, HEADS, HEAD)
    start, seq = torch.tensor([0, rows], dtype=torch.int32), torch.tensor([context], dtype=torch.int32)
    table = torch.arange(blocks, dtype=torch.int32).view(1, -1)
    slots = torch.arange(context - rows, context, dtype=torch.int64)
    metadata = torch.ops._C.get_scheduler_metadata(1, HEADS, KV_HEADS, HEAD, seq, torch.float32, start, True, -1, "vec", False, None, "auto")

    def layers(own: bool):
        def call():
            for index, cache in enumerate(caches):
                ops.set_layer(index, 0, cache, "vec", HEAD ** -0.5, -1, 0.0, 1.0, 1.0, "auto", own)
            ops.set_step(0, rows, start, seq, table, slots, metadata, True, None)
            for index in range(LAYERS):
                ops.attend(q, k, v, out, index)
            ops.end_steps()
        return [call]

    return {"vllm": layers(False), "own": layers(True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="50,300,1000,4000", help="tokens of context, the new rows included")
    parser.add_argument("--rows", default="1,4,17", help="new rows of the step: 1 decodes, more verify drafts")
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    contexts, row_counts = _ints(args.contexts, "--contexts"), _ints(args.rows, "--rows")
    from termchat.vllm_ext import isa

    isa.emulate()  # TERMCHAT_CPU_ISA=avx2: the operator's AVX2 build, and torch's and vLLM's AVX2 code
    import torch
    from vllm.platforms import current_platform

    from termchat.vllm_ext import ggml

    if ggml.unavailable():
        raise SystemExit(f"the termchat_ggml operator is not built: {ggml.unavailable()}")
    current_platform.import_kernels()
    ggml.load()
    ops = torch.ops.termchat_attn
    torch.manual_seed(0)
    print(machine_line())
    print(f"attention of {LAYERS} layers (ms, median of {args.rounds} rounds; threads {torch.get_num_threads()})\n")
    print("| context | rows | vLLM's kernel | own kernel | vLLM / own | best rounds: vLLM / own |\n|---|---|---|---|---|---|")
    for context in contexts:
        for rows in row_counts:
            if rows > context:
                continue
            times = timed_together(step_passes(torch, ops, context, rows), args.rounds)
            vllm, own = (statistics.median(times[name]) * 1000 for name in ("vllm", "own"))
            best = min(times["vllm"]) / min(times["own"])
            print(f"| {context} | {rows} | {vllm:.3f} | {own:.3f} | {vllm / own:.2f} | {best:.2f} |", flush=True)


if __name__ == "__main__":
    main()
