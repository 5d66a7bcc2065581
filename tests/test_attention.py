"""termchat_attn: a layer's attention as one C++ call (termchat/vllm_ext/attention_op.cpp).

attend() must do exactly what vLLM's two CPU attention ops do for a decoder
layer: write the step's keys and values into the KV cache at its slots, then
attend over the cache. Here both run on the same random step, a prefill beside
a decode and a verification of drafts, and must agree to the bit, cache and
output. No engine: the engine's own replies go through the same call in
test_engine and test_speculation.
"""

from __future__ import annotations

import pytest

from termchat.vllm_ext import ggml

needs_operator = pytest.mark.skipif(ggml.unavailable() is not None, reason=f"{ggml.unavailable()}")

HEADS, KV_HEADS, HEAD, BLOCK, BLOCKS = 9, 3, 64, 128, 6  # the default model's attention


@pytest.fixture(scope="module")
@needs_operator
def ops():
    import torch
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    ggml.load()
    return torch.ops.termchat_attn


def step(torch, queries: list[int], contexts: list[int]):
    """A batch: request i adds queries[i] tokens after contexts[i] already cached, in blocks of its own."""
    torch.manual_seed(len(queries) * 7 + sum(queries))
    tokens = sum(queries)
    seq_lens = [c + q for c, q in zip(contexts, queries)]
    per = max(-(-s // BLOCK) for s in seq_lens)
    block_table = torch.arange(len(queries) * per, dtype=torch.int32).reshape(len(queries), per)
    slots = [int(block_table[i, p // BLOCK]) * BLOCK + p % BLOCK for i, (c, q) in enumerate(zip(contexts, queries)) for p in range(c, c + q)]
    start = torch.tensor([0, *torch.tensor(queries).cumsum(0).tolist()], dtype=torch.int32)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    isa = "vec"
    metadata = torch.ops._C.get_scheduler_metadata(len(queries), HEADS, KV_HEADS, HEAD, seq, torch.float32, start, True, -1, isa, False, None, "auto")
    cache = torch.randn(BLOCKS * len(queries), KV_HEADS, BLOCK, 2 * HEAD)  # what earlier steps left
    q, k, v = torch.randn(tokens, HEADS, HEAD), torch.randn(tokens, KV_HEADS, HEAD), torch.randn(tokens, KV_HEADS, HEAD)
    return dict(tokens=tokens, start=start, seq=seq, block_table=block_table, slots=torch.tensor(slots, dtype=torch.int64),
                metadata=metadata, cache=cache, q=q, k=k, v=v, isa=isa)


def vllm_way(torch, s, scale):
    """CPUAttentionBackendImpl.do_kv_cache_update, then .forward, as vLLM calls them."""
    cache = s["cache"].clone()
    blocks, heads, block, _ = cache.shape
    key_cache, value_cache = cache.view(blocks, heads, block * 2, -1).chunk(2, dim=2)
    torch.ops._C.cpu_attn_reshape_and_cache(s["k"], s["v"], key_cache, value_cache, s["slots"], s["isa"], 1.0, 1.0, "auto")
    out = torch.full((s["tokens"], HEADS, HEAD), float("nan"))
    torch.ops._C.cpu_attention_with_kv_cache(s["q"], key_cache, value_cache, out, s["start"], s["seq"], scale, True, None, -1,
                                             s["block_table"], 0.0, s["metadata"], None, None, 1.0, 1.0, "auto")
    return cache, out


def termchat_way(torch, ops, s, scale, index=0, group=0, live=True):
    cache = s["cache"].clone()
    ops.set_layer(index, group, cache, s["isa"], scale, -1, 0.0, 1.0, 1.0, "auto")
    ops.end_steps()
    if live:
        ops.set_step(group, s["tokens"], s["start"], s["seq"], s["block_table"], s["slots"], s["metadata"], True, None)
    out = torch.full((s["tokens"], HEADS, HEAD), float("nan"))
    ops.attend(s["q"], s["k"], s["v"], out, index)
    ops.end_steps()
    return cache, out


@pytest.mark.parametrize("queries,contexts", [([1], [300]), ([17, 1], [0, 200]), ([4, 4, 1], [129, 40, 511])],
                         ids=["decode", "prefill beside a decode", "draft verification"])
def test_one_call_writes_the_cache_and_attends_as_vllm_does(ops, queries, contexts):
    import torch

    s = step(torch, queries, contexts)
    scale = HEAD ** -0.5
    want_cache, want = vllm_way(torch, s, scale)
    cache, out = termchat_way(torch, ops, s, scale)
    assert not torch.isnan(want).any()
    assert torch.equal(cache, want_cache)
    assert torch.equal(out, want)
    assert not torch.equal(cache, s["cache"])  # the step's keys did land


def test_without_a_steps_metadata_nothing_is_written(ops):
    """vLLM's warm-up and profiling forwards carry no metadata: its attention then does nothing."""
    import torch

    s = step(torch, [1], [50])
    cache, out = termchat_way(torch, ops, s, 0.125, live=False)
    assert torch.equal(cache, s["cache"])
    assert torch.isnan(out).all()
    assert not ops.step_live(0)


def test_each_layer_reads_its_own_groups_step(ops):
    """Two KV-cache groups (a model and its draft): a layer attends with its own group's metadata."""
    import torch

    a, b = step(torch, [1], [300]), step(torch, [3], [20])
    _, want_a = vllm_way(torch, a, 0.125)
    _, want_b = vllm_way(torch, b, 0.125)
    cache_a, cache_b = a["cache"].clone(), b["cache"].clone()
    ops.set_layer(0, 0, cache_a, "vec", 0.125, -1, 0.0, 1.0, 1.0, "auto")
    ops.set_layer(1, 1, cache_b, "vec", 0.125, -1, 0.0, 1.0, 1.0, "auto")
    ops.set_step(1, b["tokens"], b["start"], b["seq"], b["block_table"], b["slots"], b["metadata"], True, None)
    ops.set_step(0, a["tokens"], a["start"], a["seq"], a["block_table"], a["slots"], a["metadata"], True, None)
    out_a, out_b = torch.empty(1, HEADS, HEAD), torch.empty(3, HEADS, HEAD)
    ops.attend(b["q"], b["k"], b["v"], out_b, 1)
    ops.attend(a["q"], a["k"], a["v"], out_a, 0)
    ops.end_steps()
    assert torch.equal(out_a, want_a) and torch.equal(out_b, want_b)


def test_a_layer_never_registered_is_an_error_during_a_step_and_skipped_in_warm_up(ops):
    """vLLM warms the compiled model up before any step registers the layers: nothing to do then.
    During a step, a layer C++ does not know would leave its output unwritten: an error."""
    import torch

    args = (torch.zeros(1, HEADS, HEAD), torch.zeros(1, KV_HEADS, HEAD), torch.zeros(1, KV_HEADS, HEAD))
    out = torch.full((1, HEADS, HEAD), 7.0)
    ops.end_steps()
    ops.attend(*args, out, 4000)
    assert (out == 7.0).all()
    s = step(torch, [1], [10])
    ops.set_step(0, s["tokens"], s["start"], s["seq"], s["block_table"], s["slots"], s["metadata"], True, None)
    try:
        with pytest.raises(RuntimeError, match="never registered"):
            ops.attend(*args, out, 4000)
    finally:
        ops.end_steps()
