"""Benchmark: what one small op costs after a layer's weights have streamed through the caches.

    python -m termchat.bench.cold_ops [--calls 1000]

bench.step puts vLLM's KV-cache write at ~22 us a layer in the engine (timed
there too: 19-24 us a call), where the same op called in a loop costs 3-4 us.
This is the smaller experiment: before each call, stream a buffer of N MB
through the caches (as a decode layer's matmuls stream its weights) and time
the call alone: vLLM's `cpu_attn_reshape_and_cache` (one token's K and V, the
default model's 3 KV heads of 64) and a view and chunk of the KV cache (no
kernel at all: Python and torch's dispatcher only). Run at one thread and at
all. No engine; asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m termchat.bench.cold_ops", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--mb", default="0,0.5,1,2,4,16", help="MB streamed before each call, comma-separated, 0 to 4096")
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error("--calls takes a whole number of at least 1")
    try:
        sizes = [float(x) for x in args.mb.split(",")]
    except ValueError:
        parser.error(f"--mb takes numbers separated by commas, not {args.mb!r}")
    if not all(0 <= mb <= 4096 for mb in sizes):
        parser.error("--mb takes sizes from 0 to 4096 MB")

    import torch
    import vllm._custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    from termchat.bench.command import machine_line

    heads, dim, block, blocks = 3, 64, 128, 64
    isa = _get_attn_isa(torch.float32, block, dim)
    cache = torch.zeros(blocks, heads, block, 2 * dim)
    key_cache, value_cache = cache.view(blocks, heads, block * 2, dim).chunk(2, dim=2)
    key, value = torch.randn(1, heads, dim), torch.randn(1, heads, dim)
    slot = torch.tensor([1000], dtype=torch.int64)

    def write() -> None:
        ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slot, isa)

    def view() -> None:
        cache.view(blocks, heads, block * 2, dim).chunk(2, dim=2)

    def timed(call, streamed: torch.Tensor | None) -> float:
        total = 0.0
        for _ in range(args.calls):
            if streamed is not None:
                streamed.mul_(1.0)  # reads and writes every byte of it
            began = time.perf_counter()
            call()
            total += time.perf_counter() - began
        return total / args.calls * 1e6

    print(machine_line())
    print(f"us a call, mean of {args.calls}; before each call N MB streamed through the caches")
    print(f"| MB streamed | threads | KV-cache write (vLLM's op) | view and chunk (no kernel) |\n|---|---|---|---|")
    all_threads = torch.get_num_threads()
    for mb in sizes:
        streamed = torch.randn(int(mb * 2**20 / 4)) if mb > 0 else None
        for threads in sorted({1, all_threads}):
            torch.set_num_threads(threads)
            timed(write, streamed)  # warm-up
            print(f"| {mb:g} | {threads} | {timed(write, streamed):.1f} | {timed(view, streamed):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
