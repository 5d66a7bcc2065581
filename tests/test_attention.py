"""termchat_attn: a layer's attention as one C++ call (termchat/vllm_ext/attention_op.cpp).

attend() must do exactly what vLLM's two CPU attention ops do for a decoder
layer: write the step's keys and values into the KV cache at its slots, then
attend over the cache. Here both run on the same random step, a prefill beside
a decode and a verification of drafts, and must agree to the bit, cache and
output. No engine: the engine's own replies go through the same call in
test_engine and test_speculation.

A float32 layer may run termchat's own kernel instead (set_layer's `own`, the
engine's default): its output cannot equal vLLM's to the bit (other sums), so it
is held to a float64 reference at least as closely as vLLM's is, and to the
property speculation needs: a row's output is the same alone, in a verification
of drafts or in a prefill, on one thread or two.
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


SHAPES = {"default": (HEADS, KV_HEADS, HEAD), "a 1.7B file's": (16, 8, 128), "a 7B file's": (28, 4, 128)}  # query heads, KV heads, head size


def step(torch, queries: list[int], contexts: list[int], shape=(HEADS, KV_HEADS, HEAD)):
    """A batch: request i adds queries[i] tokens after contexts[i] already cached, in blocks of its own."""
    heads, kv_heads, head = shape
    torch.manual_seed(len(queries) * 7 + sum(queries))
    tokens = sum(queries)
    seq_lens = [c + q for c, q in zip(contexts, queries)]
    per = max(-(-s // BLOCK) for s in seq_lens)
    block_table = torch.arange(len(queries) * per, dtype=torch.int32).reshape(len(queries), per)
    slots = [int(block_table[i, p // BLOCK]) * BLOCK + p % BLOCK for i, (c, q) in enumerate(zip(contexts, queries)) for p in range(c, c + q)]
    start = torch.tensor([0, *torch.tensor(queries).cumsum(0).tolist()], dtype=torch.int32)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    isa = "vec"
    metadata = torch.ops._C.get_scheduler_metadata(len(queries), heads, kv_heads, head, seq, torch.float32, start, True, -1, isa, False, None, "auto")
    cache = torch.randn(BLOCKS * len(queries), kv_heads, BLOCK, 2 * head)  # what earlier steps left
    q, k, v = torch.randn(tokens, heads, head), torch.randn(tokens, kv_heads, head), torch.randn(tokens, kv_heads, head)
    return dict(tokens=tokens, start=start, seq=seq, block_table=block_table, slots=torch.tensor(slots, dtype=torch.int64),
                metadata=metadata, cache=cache, q=q, k=k, v=v, isa=isa)


def vllm_way(torch, s, scale):
    """CPUAttentionBackendImpl.do_kv_cache_update, then .forward, as vLLM calls them."""
    cache = s["cache"].clone()
    blocks, heads, block, _ = cache.shape
    key_cache, value_cache = cache.view(blocks, heads, block * 2, -1).chunk(2, dim=2)
    torch.ops._C.cpu_attn_reshape_and_cache(s["k"], s["v"], key_cache, value_cache, s["slots"], s["isa"], 1.0, 1.0, "auto")
    out = torch.full(s["q"].shape, float("nan"))
    torch.ops._C.cpu_attention_with_kv_cache(s["q"], key_cache, value_cache, out, s["start"], s["seq"], scale, True, None, -1,
                                             s["block_table"], 0.0, s["metadata"], None, None, 1.0, 1.0, "auto")
    return cache, out


def termchat_way(torch, ops, s, scale, index=0, group=0, live=True, own=False, window=-1, softcap=0.0):
    cache = s["cache"].clone()
    ops.set_layer(index, group, cache, s["isa"], scale, window, softcap, 1.0, 1.0, "auto", own)
    ops.end_steps()
    if live:
        ops.set_step(group, s["tokens"], s["start"], s["seq"], s["block_table"], s["slots"], s["metadata"], True, None)
    out = torch.full(s["q"].shape, float("nan"))
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


def float64_attention(torch, s, scale, cache):
    """Each row's softmax attention over its request's cached tokens 0..position, in float64."""
    blocks, kv_heads, block, _ = cache.shape
    heads, head = s["q"].shape[1:]
    key_cache, value_cache = cache.view(blocks, kv_heads, block * 2, -1).chunk(2, dim=2)
    rows = []
    for r in range(len(s["seq"])):
        first, last, length = int(s["start"][r]), int(s["start"][r + 1]), int(s["seq"][r])
        used = [int(b) for b in s["block_table"][r, : -(-length // BLOCK)]]
        keys = torch.cat([key_cache[b].reshape(kv_heads, head, BLOCK).transpose(1, 2) for b in used], 1)[:, :length].double()  # K is kept [head size][block]
        values = torch.cat([value_cache[b] for b in used], 1)[:, :length].double()
        for i in range(last - first):
            position = length - (last - first) + i
            q = s["q"][first + i].double().view(kv_heads, heads // kv_heads, head)
            weights = (torch.einsum("gqd,gtd->gqt", q, keys[:, : position + 1]) * scale).softmax(-1)
            rows.append(torch.einsum("gqt,gtd->gqd", weights, values[:, : position + 1]).reshape(heads, head))
    return torch.stack(rows)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("queries,contexts", [([1], [300]), ([17, 1], [0, 200]), ([4, 4, 1], [129, 40, 511]), ([1], [0])],
                         ids=["decode", "prefill beside a decode", "draft verification", "first token"])
def test_own_kernel_is_as_close_to_float64_as_vllms(ops, queries, contexts, shape):
    import torch

    s = step(torch, queries, contexts, shape)
    scale = shape[2] ** -0.5
    want_cache, vllm_out = vllm_way(torch, s, scale)
    cache, out = termchat_way(torch, ops, s, scale, own=True)
    assert torch.equal(cache, want_cache)  # the same keys and values in the same layout: vLLM's kernel could read them
    exact = float64_attention(torch, s, scale, want_cache)
    own_error, vllm_error = (out.double() - exact).abs().max().item(), (vllm_out.double() - exact).abs().max().item()
    assert own_error <= max(2 * vllm_error, 1e-6), (own_error, vllm_error)
    assert not torch.equal(out, vllm_out) or queries == [1] and contexts == [0]  # another kernel indeed (one token: softmax of one is 1)


def own_rows(torch, ops, s, first: int, count: int, prompt: int | None = None):
    """Rows first..first+count of a one-request step `s` through the own kernel, the cache
    holding the tokens before them (and `s`'s keys for these rows written again)."""
    ops.end_steps()
    rows = slice(first, first + count)
    ops.set_step(0, count, torch.tensor([0, count], dtype=torch.int32), torch.tensor([first + count], dtype=torch.int32), s["block_table"],
                 s["slots"][rows], s["metadata"], True, None)
    if prompt is not None:
        ops.set_prompts(torch.tensor([prompt], dtype=torch.int32))
    out = torch.full((count, *s["q"].shape[1:]), float("nan"))
    ops.attend(s["q"][rows], s["k"][rows], s["v"][rows], out, 0)
    ops.end_steps()
    return out


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_own_kernel_gives_a_row_the_same_bits_alone_in_a_verification_or_a_prefill_on_any_thread_count(ops, shape):
    """Speculation's promise rests on this: a verification step computes each row as a plain step would."""
    import torch

    s = step(torch, [300], [0], shape)  # a prefill of 300 tokens: parts of 64 end inside it
    ops.set_layer(0, 0, s["cache"].clone(), "vec", shape[2] ** -0.5, -1, 0.0, 1.0, 1.0, "auto", True)
    threads = torch.get_num_threads()
    try:
        prefill = own_rows(torch, ops, s, 0, 300)
        verification = own_rows(torch, ops, s, 250, 5)  # rows 250-254 again
        alone = [own_rows(torch, ops, s, 250 + i, 1)[0] for i in range(5)]
        torch.set_num_threads(1)
        one_thread = own_rows(torch, ops, s, 250, 5)
    finally:
        torch.set_num_threads(threads)
    assert not torch.isnan(prefill).any()
    for i in range(5):
        assert torch.equal(verification[i], prefill[250 + i]) and torch.equal(alone[i], prefill[250 + i]) and torch.equal(one_thread[i], prefill[250 + i])


def test_with_prompt_lengths_a_prompts_rows_keep_vllms_kernel_and_the_replys_rows_the_own(ops):
    """The engine hands the prompt lengths over: a prefill's rows are vLLM's (faster there), the rows
    after the prompt the own kernel's, the same bits as that row decoded alone."""
    import torch

    s = step(torch, [300], [0])
    scale = HEAD ** -0.5
    _, vllm_out = vllm_way(torch, s, scale)
    ops.set_layer(0, 0, s["cache"].clone(), "vec", scale, -1, 0.0, 1.0, 1.0, "auto", True)
    out = own_rows(torch, ops, s, 0, 300, prompt=280)  # a prompt of 280 tokens and 20 of a reply, in one step (a recompute)
    decoded = torch.stack([own_rows(torch, ops, s, 280 + i, 1, prompt=280)[0] for i in range(20)])
    assert torch.equal(out[:280], vllm_out[:280])
    assert torch.equal(out[280:], decoded) and not torch.equal(decoded, vllm_out[280:])
    verified = own_rows(torch, ops, s, 290, 4, prompt=280)
    assert torch.equal(verified, decoded[10:14])


@pytest.mark.parametrize("window,softcap", [(64, 0.0), (-1, 30.0)], ids=["sliding window", "soft cap"])
def test_layers_the_own_kernel_does_not_cover_keep_vllms(ops, window, softcap):
    """A window or a soft cap: set_layer leaves the layer on vLLM's kernel, asked for the own or not."""
    import torch

    s = step(torch, [3], [200])
    scale = HEAD ** -0.5
    metadata = torch.ops._C.get_scheduler_metadata(1, HEADS, KV_HEADS, HEAD, s["seq"], torch.float32, s["start"], True, window, "vec", False, None, "auto")
    s = {**s, "metadata": metadata}
    cache = s["cache"].clone()
    blocks, heads, block, _ = cache.shape
    key_cache, value_cache = cache.view(blocks, heads, block * 2, -1).chunk(2, dim=2)
    torch.ops._C.cpu_attn_reshape_and_cache(s["k"], s["v"], key_cache, value_cache, s["slots"], "vec", 1.0, 1.0, "auto")
    want = torch.full((3, HEADS, HEAD), float("nan"))
    torch.ops._C.cpu_attention_with_kv_cache(s["q"], key_cache, value_cache, want, s["start"], s["seq"], scale, True, None, window,
                                             s["block_table"], softcap, metadata, None, None, 1.0, 1.0, "auto")
    _, out = termchat_way(torch, ops, s, scale, own=True, window=window, softcap=softcap)
    assert not torch.isnan(want).any() and torch.equal(out, want)
