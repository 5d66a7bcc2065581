"""termchat_int4: the default model's 4-bit codes recovered from its float32
weights, and torch's int4 kernel computing what the float32 matmul computes
(the engine serving it: test_speculation.py / bench.int4)."""

from __future__ import annotations

from dataclasses import replace

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


def test_int4_and_the_default_ggml_engine_score_float32s_replies_as_float32_does(shared_engine):
    """Real engines, eager (a compile per test run would cost a minute): the
    float32 engine's greedy replies are as probable under an engine with
    `quantization = "termchat_int4"` and under the shared default (which runs
    the GGUF's own blocks on ggml where the operator is built) as under
    float32, within 1%, the quality guard's limit (bench/README.md has the
    figures over 1,037 tokens); and each answers."""
    from termchat.bench.formats import continuation_logprob
    from termchat.engine.client import Sampling, complete_sync
    from termchat.engine.connect import open_engine
    from termchat.profiles import builtin_profiles, in_format

    base = builtin_profiles()["local"].without_speculation()
    eager = lambda fmt: replace(in_format(base, fmt), name=f"{fmt}-eager", engine_args={**in_format(base, fmt).engine_args, "enforce_eager": True})  # noqa: E731
    prompts = ["Write a Python function that checks whether a number is prime.", "Explain what a linked list is.", "Write a short poem about the sea at night."]
    scores, logs, own = {}, {}, {}
    for fmt in ("float32", "int4"):
        engine = open_engine(eager(fmt), attach=False)
        try:
            logs[fmt] = engine.log_path.read_text(errors="replace")
            if fmt == "float32":
                replies = [complete_sync(engine, [{"role": "user", "content": p}], Sampling(temperature=0.0, max_tokens=64)).text for p in prompts]
            own[fmt] = complete_sync(engine, [{"role": "user", "content": prompts[0]}], Sampling(temperature=0.0, max_tokens=32))
            scores[fmt] = [engine.run(lambda p=p, r=r: continuation_logprob(engine, p, r)) for p, r in zip(prompts, replies)]
        finally:
            engine.stop()
    scores["default"] = [shared_engine.run(lambda p=p, r=r: continuation_logprob(shared_engine, p, r)) for p, r in zip(prompts, replies)]
    assert "quantization=termchat_int4" in logs["int4"]  # vLLM took the method, not a float path
    assert own["int4"].stats.output_tokens == 32 and "def" in own["int4"].text
    total = sum(n for _, n in scores["float32"])
    assert total >= 120  # three replies of up to 64 tokens
    reference = sum(s for s, _ in scores["float32"]) / total
    for fmt in ("int4", "default"):
        assert sum(n for _, n in scores[fmt]) == total
        mean = sum(s for s, _ in scores[fmt]) / total
        assert abs(mean - reference) <= 0.01 * abs(reference), (fmt, mean, reference)
