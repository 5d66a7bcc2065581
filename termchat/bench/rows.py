"""What drafted tokens cost to verify on this CPU: one step's matmuls of the default model at 1 to 17 rows.

    python -m termchat.bench.rows [--rounds 30]

A speculative step multiplies the last token and its drafts, one row each, by
every weight matrix; a plain step multiplies one row. Where the kernel is bound
by memory the extra rows are nearly free, and drafts pay as soon as a few are
accepted. Where it is bound by arithmetic (ggml's 4-bit product with AVX2 code
only, no VNNI or AMX) each further row costs a good part of a whole one, and
only categories whose drafts are mostly accepted (edits, extraction) gain
(bench README, "Do drafts pay on this machine?").

This times the layer matmuls and the output layer of one step, in the format
the built-in profiles run here (`weights = "auto"`): ggml on the default
model's own GGUF blocks, packed as the engine packs them, or float32 (torch's
linear, vLLM's path for unquantized weights). Every row count is timed in each
round, in turn, and each is given as the median of its per-round ratios to
one row.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROW_COUNTS = (1, 2, 4, 8, 17)  # a plain step; 1, 3, 7 drafts; suffix decoding's most (16)


def ggml_calls(torch, rows: dict[int, object], config: dict) -> dict[int, list]:
    """The engine's products of one step on the default's own blocks: qkv, o, gate_up
    and down per layer, then the output layer (the tied embedding's Q8_0 blocks)."""
    from gguf import GGUFReader

    from termchat import models
    from termchat.profiles import DEFAULT_MODEL
    from termchat.vllm_ext import ggml

    ggml.load()
    path = models.gguf_file_of(Path(models.resolve(DEFAULT_MODEL)))  # resolve follows this environment's package
    tensors = {t.name: t for t in GGUFReader(path).tensors}
    layers = 1 + max(int(name.split(".")[1]) for name in tensors if name.startswith("blk."))
    groups = [names for i in range(layers) for _, names in ggml.layer_linears(i)]
    groups.append(["output.weight" if "output.weight" in tensors else "token_embd.weight"])
    handles = []
    for group in groups:
        parts = [tensors[name] for name in group]
        k = int(parts[0].shape[0])
        handle = torch.ops.termchat_ggml.pack([torch.from_numpy(p.data.copy()) for p in parts], int(parts[0].tensor_type), k, True)
        handles.append((handle, k))
    return {n: [lambda h=h, x=x[k]: torch.ops.termchat_ggml.linear1(x, h) for h, k in handles] for n, x in rows.items()}


def float32_calls(torch, rows: dict[int, object], config: dict) -> dict[int, list]:
    """The same products on float32 weights of the default's shapes (torch's linear)."""
    from termchat.bench.kernels import shapes

    torch.manual_seed(0)
    weights = [torch.randn(n, k) * 0.05 for _ in range(config["num_hidden_layers"]) for k, n in shapes(config)]
    weights.append(torch.randn(config["vocab_size"], config["hidden_size"]) * 0.05)
    linear = torch.nn.functional.linear
    return {n: [lambda w=w, x=x[w.size(1)]: linear(x, w) for w in weights] for n, x in rows.items()}


KERNELS = {"ggml": ggml_calls, "float32": float32_calls}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args(argv)
    from termchat.vllm_ext import isa

    isa.emulate()  # TERMCHAT_CPU_ISA=avx2: torch's AVX2 code in this process too
    from termchat.bench.command import machine_line
    from termchat.bench.kernels import timed_together
    from termchat.engine import weights
    from termchat.errors import UserError
    from termchat.profiles import DEFAULT_MODEL

    print(machine_line())
    try:
        fmt, why = weights.choose_format(weights.AUTO, DEFAULT_MODEL)
    except UserError as exc:
        print(f"the built-ins' weight format: {exc}")
        return 1
    if fmt not in KERNELS:
        print(f"the built-ins run {fmt} here ({why}); this bench times {' and '.join(KERNELS)} only")
        return 1
    import torch

    from termchat import models

    config = models.read_config(models.folder(DEFAULT_MODEL))
    sizes = {config["hidden_size"], config["intermediate_size"]}
    torch.manual_seed(0)
    rows = {n: {k: torch.randn(n, k) for k in sizes} for n in ROW_COUNTS}
    passes = KERNELS[fmt](torch, rows, config)
    print(f"{fmt} ({why}), {torch.get_num_threads()} threads, {len(passes[1])} products a step, {args.rounds} rounds")
    times = timed_together(passes, args.rounds)
    ratios = {n: statistics.median(a / b for a, b in zip(times[n], times[1])) for n in ROW_COUNTS}
    print(f"{'rows':>5} {'ms a step':>10} {'x one row':>10}")
    for n in ROW_COUNTS:
        print(f"{n:5d} {statistics.median(times[n]) * 1e3:10.2f} {ratios[n]:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
