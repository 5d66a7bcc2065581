"""The termchat_ggml operator: a GGUF's own blocks multiplied by ggml's CPU
kernels inside torch (termchat/vllm_ext/ggml_op.cpp).

For every tensor type termchat serves, a small GGUF is written here
(tests/gguf_files.py), its blocks are read back by termchat's reader, and the
operator's product is compared with the product of the `gguf` package's own
dequantized weights, an independent implementation of the format. No engine.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests import gguf_files
from termchat.models import gguf_import
from termchat.vllm_ext import ggml, gguf_file

needs_operator = pytest.mark.skipif(ggml.unavailable() is not None, reason=f"{ggml.unavailable()}")
TYPES = [t for t in gguf_import.MATRIX_TYPES if t != "F32"]


@pytest.fixture(scope="module")
@needs_operator
def op():
    import torch

    ggml.load()
    return torch.ops.termchat_ggml


@pytest.fixture(scope="module")
def written(tmp_path_factory, prepared_model) -> dict:
    from termchat import models

    folder = tmp_path_factory.mktemp("ggml")
    packaged = models._gguf_path(quiet=True)
    return {kind: (folder / f"{kind}.gguf", gguf_files.write_llama(folder / f"{kind}.gguf", kind, packaged)) for kind in TYPES}


def blocks(path, name: str):
    """A tensor's blocks as the engine's loader reads them: uint8 [rows, row_bytes]."""
    import torch

    header = gguf_file.read(path)
    t = header.tensors[name]
    with open(path, "rb") as handle:
        handle.seek(t.offset)
        raw = np.frombuffer(handle.read(t.nbytes), dtype=np.uint8).reshape(t.rows, t.row_bytes)
    return t, torch.from_numpy(raw.copy())


@pytest.mark.parametrize("kind", TYPES)
@needs_operator
def test_each_type_multiplies_as_the_gguf_package_dequantizes_it(kind, written, op):
    import torch

    path, held = written[kind]
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.0.ffn_up.weight"):
        t, raw = blocks(path, name)
        assert t.type_name == kind
        weight = torch.from_numpy(held[name]).double()  # what gguf dequantizes the blocks to
        for extra in (True, False):  # ggml's AMX/repacked buffer where it takes this type, and its plain one
            handle = op.pack([raw], t.type, t.shape[0], extra)
            x = torch.randn(5, t.shape[0], generator=torch.Generator().manual_seed(1))
            got = op.linear(x, [handle]).double()
            want = x.double() @ weight.T
            # ggml brings the activations to the type's vec_dot_type, as llama.cpp does: F16 rounds
            # them to half precision (~0.03%), BF16 to bfloat16 (~0.3%), the quantized types to 8 bits (~0.5%)
            tolerance = {"F16": 1e-3, "BF16": 5e-3}.get(kind, 2e-2)
            assert ((got - want).norm() / want.norm()).item() < tolerance, (kind, name, extra, op.buffer_name(handle))
        rows = op.get_rows(raw, torch.tensor([0, t.rows - 1, 3]), t.type, t.shape[0])  # ggml's to_float, no activations
        assert torch.equal(rows, torch.from_numpy(held[name][[0, t.rows - 1, 3]])), (kind, name)


@needs_operator
def test_a_row_comes_out_the_same_alone_or_beside_others(written, op):
    """Speculation verifies drafts several rows at a time, plain decoding one:
    a row's product must not depend on its neighbours, or greedy text would
    change with speculation (here: ggml's AMX tile path for many rows and its
    VNNI path for one give identical bits, and so does termchat's own path for
    2-8 rows of Q4_1 in the AMX buffer, two weights side by side included)."""
    import torch

    for kind in ("Q4_1", "Q8_0", "Q4_K", "Q6_K"):
        t, raw = blocks(written[kind][0], "blk.0.ffn_up.weight")
        handle = op.pack([raw], t.type, t.shape[0], True)
        _, raw2 = blocks(written[kind][0], "blk.0.ffn_gate.weight")
        second = op.pack([raw2], t.type, t.shape[0], True)
        for n in (2, 3, 8, 9, 17):
            x = torch.randn(n, t.shape[0], generator=torch.Generator().manual_seed(n))
            together = op.linear(x, [handle, second])
            alone = torch.cat([op.linear(x[i : i + 1], [handle, second]) for i in range(n)])
            assert torch.equal(together, alone), (kind, n, op.buffer_name(handle))


@needs_operator
def test_a_product_does_not_depend_on_the_thread_count(written, op):
    """The engine steps on fewer threads beside a busy process
    (vllm_ext/threads.py): each output is one thread's dot product, so the
    bits are the same on one thread or two."""
    import torch

    before = torch.get_num_threads()
    try:
        for kind in ("Q4_1", "Q8_0", "Q4_K", "Q6_K"):
            t, raw = blocks(written[kind][0], "blk.0.ffn_up.weight")
            handle = op.pack([raw], t.type, t.shape[0], True)
            for rows in (1, 17):
                x = torch.randn(rows, t.shape[0], generator=torch.Generator().manual_seed(3))
                torch.set_num_threads(1)
                one = op.linear(x, [handle])
                torch.set_num_threads(2)
                two = op.linear(x, [handle])
                assert torch.equal(one, two), (kind, rows, op.buffer_name(handle))
    finally:
        torch.set_num_threads(before)


@needs_operator
def test_shards_of_different_types_fill_their_own_columns(written, op):
    """Q4_K_M keeps attn_v in Q6_K beside q and k in Q4_K: one layer, two ggml tensors."""
    import torch

    q_t, q = blocks(written["Q4_K"][0], "blk.0.attn_q.weight")
    v_t, v = blocks(written["Q6_K"][0], "blk.0.attn_v.weight")
    x = torch.randn(3, q_t.shape[0], generator=torch.Generator().manual_seed(3))
    handles = [op.pack([q], q_t.type, q_t.shape[0], True), op.pack([v], v_t.type, v_t.shape[0], True)]
    both = op.linear(x, handles)
    assert both.shape == (3, q_t.rows + v_t.rows)
    assert torch.equal(both[:, : q_t.rows], op.linear(x, handles[:1])) and torch.equal(both[:, q_t.rows :], op.linear(x, handles[1:]))
    stacked = op.pack([q, q], q_t.type, q_t.shape[0], True)  # two shards of one type stack into one tensor
    assert torch.equal(op.linear(x, [stacked]), torch.cat([op.linear(x, handles[:1])] * 2, 1))
    # Q4_1 beside Q6_K: without AMX, termchat's tiles take the one and ggml's graph the other
    t1, q41 = blocks(written["Q4_1"][0], "blk.0.attn_q.weight")
    mixed = [op.pack([q41], t1.type, t1.shape[0], True), handles[1]]
    for n in (1, 3, 9):
        x = torch.randn(n, q_t.shape[0], generator=torch.Generator().manual_seed(n))
        both = op.linear(x, mixed)
        assert torch.equal(both[:, : t1.rows], op.linear(x, mixed[:1])) and torch.equal(both[:, t1.rows :], op.linear(x, mixed[1:])), op.buffer_name(mixed[0])


@needs_operator
def test_q4_1_and_q8_0_without_amx_are_tiled_where_the_cpu_has_avx512_vnni(written, op):
    """On AVX512-VNNI without AMX (AMD Zen 4/5) ggml multiplies Q4_1 and Q8_0 one activation
    row at a time (17 rows cost 10x and 14x one); pack() then writes tiles itself and the
    few-rows kernels run every row count. Their product is ggml's own plain path's to float
    rounding (both quantize the activations with ggml's own quantize_row), at 1 and 17 rows."""
    import torch

    from termchat.vllm_ext import isa

    flags = set(open("/proc/cpuinfo").read().split())
    for kind in ("Q4_1", "Q8_0"):  # the default's layers and its output layer
        t, raw = blocks(written[kind][0], "blk.0.ffn_down.weight")
        handle = op.pack([raw], t.type, t.shape[0], True)
        if "amx_int8" in flags or "avx512_vnni" not in flags or isa.avx2_only() or os.environ.get("TERMCHAT_GGML_FEW_ROWS") == "0":
            pytest.skip(f"ggml's own buffer here: {op.buffer_name(handle)}")
        assert op.buffer_name(handle) == f"CPU (termchat's {kind.lower()} tiles)"
        plain = op.pack([raw], t.type, t.shape[0], False)
        assert op.buffer_name(plain) == "CPU"
        for n in (1, 17):
            x = torch.randn(n, t.shape[0], generator=torch.Generator().manual_seed(n))
            ours, ggmls = op.linear(x, [handle]), op.linear(x, [plain])
            assert torch.allclose(ours, ggmls, rtol=1e-4, atol=1e-4 * ggmls.abs().max().item()), (kind, (ours - ggmls).abs().max())


@needs_operator
def test_a_tensor_that_is_not_a_packed_weight_is_refused_in_one_line(written, op):
    import torch

    t, raw = blocks(written["Q8_0"][0], "blk.0.attn_q.weight")
    handle = op.pack([raw], t.type, t.shape[0], True)
    with pytest.raises(RuntimeError, match="not a weight made by termchat_ggml::pack"):
        op.linear(torch.randn(1, t.shape[0]), [handle.clone()])
    with pytest.raises(RuntimeError, match="(?i)not whole q8_0 blocks"):
        op.pack([raw], t.type, t.shape[0] - 1, True)


def test_llama_q_and_k_rows_come_back_in_hugging_faces_order():
    w = np.arange(8 * 3).reshape(8, 3)
    assert np.array_equal(ggml.unpermute_rows(gguf_files.permute(w, 2), 2), w)


def test_a_build_that_fails_is_one_line_and_keeps_what_was_there(monkeypatch, tmp_path, capsys):
    """The set-up goes on without the operator (the other formats stay); a built one is not touched."""
    from termchat.vllm_ext import build

    monkeypatch.setattr(build, "OUT", tmp_path / "termchat-ggml")
    monkeypatch.setattr(build, "LIBRARY", tmp_path / "termchat-ggml" / "termchat_ggml.so")
    monkeypatch.setattr(build, "STAMP", tmp_path / "termchat-ggml" / "build.json")

    def offline(work, log):
        raise RuntimeError("`pip download llama-cpp-python==0.3.36 ...` failed (exit 1): no network")

    monkeypatch.setattr(build, "ggml_source", offline)
    assert build.main(["--force"]) == 1
    lines = capsys.readouterr().err.splitlines()  # what it starts, then why it stopped: no traceback
    assert len(lines) == 2 and "building ggml" in lines[0] and "Traceback" not in "".join(lines)
    assert "the ggml operator was not built (RuntimeError: `pip download" in lines[1] and 'weights = "ggml" is unavailable, the other formats stay' in lines[1]
    assert not build.LIBRARY.exists()


@needs_operator
def test_many_row_counts_share_one_scratch_and_stay_right(written, op):
    """Decode, draft verification and short prefills call each layer with up to
    64 rows, and each row count's ggml plan is kept. Their quantized activations
    share one scratch buffer per thread: a buffer per plan grew a 7B engine by
    40-50 MB with every prompt of a new length. Here 10 small weights at every
    row count from 1 to 64 kept 11.3 MB in buffers of their own, 0.07 MB with
    the shared one; the products stay right as it grows under older plans."""
    import torch

    def rss() -> int:
        return next(int(line.split()[1]) << 10 for line in open("/proc/self/status") if line.startswith("VmRSS:"))

    handles, xs = [], []
    for kind in ("Q4_1", "Q8_0", "Q4_K", "Q6_K", "Q5_0"):
        for name in ("blk.0.ffn_down.weight", "blk.0.ffn_up.weight"):
            t, raw = blocks(written[kind][0], name)
            handles.append(op.pack([raw], t.type, t.shape[0], True))
            xs.append(torch.randn(64, t.shape[0], generator=torch.Generator().manual_seed(4)))
    first = [op.linear(x[:1], [h]) for x, h in zip(xs, handles)]  # the smallest plans, built first
    before = rss()
    for rows in range(2, 65):
        for x, h in zip(xs, handles):
            op.linear(x[:rows], [h])
    grown = rss() - before
    assert grown < 3 << 20, f"{grown / 1e6:.1f} MB kept by 630 plans"
    assert all(torch.equal(op.linear(x[:1], [h]), f) for x, h, f in zip(xs, handles, first))
    assert all(torch.equal(op.linear(x[:64], [h])[:1], f) for x, h, f in zip(xs, handles, first))
