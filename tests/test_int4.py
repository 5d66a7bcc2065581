"""termchat_int4: the default model's 4-bit codes recovered from its float32
weights, and torch's int4 kernel computing what the float32 matmul computes
(the engine serving it: test_speculation.py / bench.int4)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from termchat.vllm_ext import int4 as vllm_int4  # noqa: E402


def q4_1_weights(n: int, k: int, seed: int = 0):
    """Weights as a GGUF Q4_1 file dequantizes them: per block of 32, d * q + m,
    with d and m stored as float16 and the codes spanning 0..15."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k // 32, 32), generator=g)
    codes[..., 3], codes[..., 17] = 0, 15
    d = (torch.rand(n, k // 32, generator=g) * 0.01 + 1e-3).half().float()
    m = (-torch.rand(n, k // 32, generator=g) * 0.05).half().float()
    return (codes.float() * d[..., None] + m[..., None]).reshape(n, k), codes.to(torch.int32).reshape(n, k)


def test_the_codes_of_q4_1_blocks_come_back_exactly_from_their_dequantized_weights():
    weight, codes = q4_1_weights(192, 576)
    got, step, low = vllm_int4.quantize(weight)
    assert torch.equal(got, codes)
    back = (got.reshape(192, 18, 32).float() * step[..., None] + low[..., None]).reshape(192, 576)
    assert torch.equal(back, weight)


def test_a_constant_group_gets_codes_not_nan():
    weight = torch.full((8, 64), 0.25)
    codes, step, low = vllm_int4.quantize(weight)
    assert torch.equal(codes, torch.zeros_like(codes)) and torch.all(step == 0) and torch.all(low == 0.25)


def test_the_int4_kernel_computes_the_float32_product_within_bfloat16_rounding():
    weight, _ = q4_1_weights(1536, 576, seed=1)
    packed, scales_and_zeros = vllm_int4.pack(weight)
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(2))
    want = x @ weight.t()
    got = torch._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), packed, 32, scales_and_zeros).float()
    assert ((got - want).norm() / want.norm()).item() < 0.01  # bf16 activations and scales: 0.3% here
    wrong = torch._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), packed, 32, scales_and_zeros.flip(-1)).float()
    assert ((wrong - want).norm() / want.norm()).item() > 0.1  # the check can tell scale from zero


def test_the_default_models_weights_are_its_q4_1_blocks(prepared_model):
    """Every layer matrix of the prepared default model round-trips: the float32
    weights are dequantized Q4_1, so four bits lose nothing of them."""
    from safetensors.torch import load_file

    weights = load_file(str(prepared_model / "model.safetensors"))
    matrices = {name: w for name, w in weights.items() if w.dim() == 2 and "embed" not in name}
    assert len(matrices) == 210  # 30 layers x (q, k, v, o, gate, up, down)
    for name, w in matrices.items():
        codes, step, low = vllm_int4.quantize(w)
        n, k = w.shape
        back = (codes.reshape(n, k // 32, 32).float() * step[..., None] + low[..., None]).reshape(n, k)
        assert torch.allclose(back, w, rtol=0, atol=1e-7), name


def test_an_int4_engine_scores_float32s_replies_as_float32_does(shared_engine):
    """The real engine with `quantization = "termchat_int4"` (eager: a compile per
    test run would cost a minute): it answers, and the float32 engine's greedy
    replies are as probable under it as under float32 (within 1%, the guard's
    limit; bench/README.md has the figures over 1,280 tokens)."""
    from dataclasses import replace

    from termchat.bench.formats import continuation_logprob
    from termchat.engine.client import Sampling, complete_sync
    from termchat.engine.connect import open_engine

    from termchat.profiles import builtin_profiles

    base = builtin_profiles()["local"].without_speculation()
    profile = replace(base, name="int4-eager", engine_args={**base.engine_args, "quantization": "termchat_int4", "enforce_eager": True})
    prompts = ["Write a Python function that checks whether a number is prime.", "Explain what a linked list is.", "Write a short poem about the sea at night."]
    replies = [complete_sync(shared_engine, [{"role": "user", "content": p}], Sampling(temperature=0.0, max_tokens=64)).text for p in prompts]
    reference = [shared_engine.run(lambda p=p, r=r: continuation_logprob(shared_engine, p, r)) for p, r in zip(prompts, replies)]
    engine = open_engine(profile, attach=False)
    try:
        log = engine.log_path.read_text(errors="replace")
        own = complete_sync(engine, [{"role": "user", "content": prompts[0]}], Sampling(temperature=0.0, max_tokens=32))
        scored = [engine.run(lambda p=p, r=r: continuation_logprob(engine, p, r)) for p, r in zip(prompts, replies)]
    finally:
        engine.stop()
    assert "quantization=termchat_int4" in log  # vLLM took the method, not a float path
    assert own.stats.output_tokens == 32 and "def" in own.text
    total = sum(n for _, n in reference)
    assert total == sum(n for _, n in scored) >= 120  # three replies of up to 64 tokens
    mean, ref_mean = sum(s for s, _ in scored) / total, sum(s for s, _ in reference) / total
    assert abs(mean - ref_mean) <= 0.01 * abs(ref_mean), (mean, ref_mean)


def test_a_weight_format_is_a_change_of_the_profile_and_an_unknown_one_is_refused():
    from termchat.errors import UserError
    from termchat.profiles import builtin_profiles, in_format

    base = builtin_profiles()["local"].without_speculation()
    int4 = in_format(base, "int4")
    assert int4.engine_args == {**base.engine_args, "quantization": "termchat_int4"} and int4.dtype == "float32"
    assert "quantization" not in in_format(int4, "bfloat16").engine_args and in_format(int4, "bfloat16").dtype == "bfloat16"
    with pytest.raises(UserError, match="unknown weight format 'int3'; known: float32, bfloat16, int4"):
        in_format(base, "int3")


def test_models_list_says_the_format_on_disk_and_the_bytes_each_format_reads_per_token(prepared_model, capsys):
    from types import SimpleNamespace

    from termchat import cli, models

    counts = total, embed, head = models.weight_counts(prepared_model)
    assert (embed, head) == (49152 * 576, 0)  # tied: the output layer is the embedding
    assert models.bytes_per_token(counts) == total * 4
    assert models.bytes_per_token(counts, "bfloat16") == total * 2
    assert models.bytes_per_token(counts, "float32", "termchat_int4") == (total - embed) * 0.625 + embed * 2
    assert models.bytes_per_token(counts, "float32", "awq") is None  # not known: no figure rather than a wrong one
    assert cli.cmd_models_list(SimpleNamespace()) == 0
    out = capsys.readouterr().out
    assert "float32 safetensors, dequantized from SmolLM2-135M-Instruct.Q4_1.gguf" in out
    assert 'read per token: float32 538 MB, bfloat16 269 MB, int4 (quantization = "termchat_int4") 123 MB' in out
