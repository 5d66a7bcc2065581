"""One attention call per layer: vLLM's CPU attention without Python in the step.

vLLM runs a CPU decoder layer's attention as two Python custom ops
(`unified_kv_cache_update`, `unified_attention_with_output`). Each looks up
the forward context, the layer and its metadata in Python and calls a C++
kernel through a Python wrapper: 59 us a layer in the default's decode step,
of which the two kernels take about 32 (bench README, "One attention call per
layer"). Here the layer calls `termchat_attn::attend` (attention_op.cpp),
which makes the same two kernel calls in C++:

- each eligible layer gets an index when it is built (`Attention.__init__`);
  its forward calls `attend(query, key, value, output, index)`, which the
  compiled graph calls directly;
- what stays fixed for a layer (its KV cache views, scale, ISA) is handed to
  C++ when its group's metadata is built and the cache is new;
- a step's metadata (slots, sequence lengths, block table, vLLM's scheduler
  metadata) is handed over once per step and KV-cache group, by the metadata
  builder, and dropped after the model's forward (`end_steps`), so a forward
  without metadata (warm-up, profiling) does nothing, as vLLM's does;
- the compiled model's cache key says the patch is on (vLLM's key would not
  tell the two graphs apart).

The kernels and their arguments are vLLM's own, so the result is the same to
the bit (tests/test_attention.py). Layers it does not cover (encoder, cross
attention, ALiBi, sinks, a shared KV cache, a quantized query, a backend other
than CPU_ATTN) keep vLLM's path. TERMCHAT_FAST_ATTENTION=0 turns it off.

A float32 layer with vLLM's "vec" cache layout, head size 64 or 128, no window,
soft cap or scaled cache (the default's, a GGUF file's) runs termchat's own
kernel in attend() for the rows after each request's prompt (decoding and
verifying drafts; "own", attention_op.cpp). vLLM's, with the KV split off as
row invariance needs, gives each KV head one thread (3 heads on 2 cores). The
own kernel cuts each row's context at fixed 64-token boundaries, merges the
parts in order and feeds one load of K or V to every query head of its group:
a row's output is the same alone, in a verification or in any other step, on
any number of threads, and within float32 rounding of vLLM's (test_attention).
A prompt's rows keep vLLM's kernel, faster on a prefill's many rows; the model
runner hands the prompt lengths over before each forward. TERMCHAT_OWN_ATTENTION=0
keeps vLLM's kernel for every row.
"""

from __future__ import annotations

import itertools

_installed = False
_indices = itertools.count()  # each eligible layer's number in attention_op.cpp


def eligible(layer) -> bool:
    """Does this layer compute exactly what vLLM's CPU attention would, through attend()?"""
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    impl = getattr(layer, "impl", None)
    return (
        type(impl) is CPUAttentionBackendImpl
        and impl.attn_type == AttentionType.DECODER
        and impl.alibi_slopes is None
        and impl.sinks is None
        and getattr(layer, "kv_sharing_target_layer_name", None) is None
        and getattr(layer, "query_quant", None) is None
    )


def install(own: bool = True) -> bool:
    """Patch vLLM's Attention layer, the CPU metadata builder and the model
    runner; False where the operator is not built or vLLM lacks the parts.
    `own`: layers the own kernel covers run it (C++ checks which do)."""
    global _installed
    if _installed:
        return True
    from termchat.vllm_ext import ggml

    if ggml.unavailable():
        return False
    import torch
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadataBuilder
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    ggml.load()  # the same library holds termchat_attn
    if not hasattr(torch.ops.termchat_attn, "attend"):
        return False
    ops = torch.ops.termchat_attn

    original_init = Attention.__init__

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.termchat_index = next(_indices) if eligible(self) else None

    original_forward = Attention.forward

    def forward(self, query, key, value, output_shape=None, output_dtype=None):
        index = getattr(self, "termchat_index", None)
        if index is None or output_shape is not None or key is None or value is None:
            return original_forward(self, query, key, value, output_shape, output_dtype)
        hidden = self.num_heads * self.head_size_v
        output = torch.empty((query.shape[0], hidden), dtype=output_dtype or query.dtype, device=query.device)
        output = output.view(-1, self.num_heads, self.head_size_v)
        ops.attend(query.view(-1, self.num_heads, self.head_size), key.view(-1, self.num_kv_heads, self.head_size),
                   value.view(-1, self.num_kv_heads, self.head_size_v), output, index)
        return output.view(-1, hidden)

    groups: dict[int, int] = {}  # id(builder) -> its group's number here

    original_build = CPUAttentionMetadataBuilder.build

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        metadata = original_build(self, common_prefix_len, common_attn_metadata, fast_build)
        group = groups.setdefault(id(self), len(groups))
        register_layers(self, group)
        ops.set_step(group, metadata.num_actual_tokens, metadata.query_start_loc, metadata.seq_lens, metadata.block_table,
                     metadata.slot_mapping, metadata.scheduler_metadata, bool(metadata.causal), metadata.dynamic_causal)
        return metadata

    def register_layers(builder, group: int) -> None:
        """Hand C++ the layers' KV caches: once, and again if vLLM binds new ones."""
        seen = getattr(builder, "termchat_caches", None)
        from vllm.config import get_layers_from_vllm_config

        layers = get_layers_from_vllm_config(builder.vllm_config, Attention, builder.layer_names) if seen is None else builder.termchat_layers
        caches = tuple(layer.kv_cache.data_ptr() for layer in layers.values())
        if caches == seen:
            return
        for layer in layers.values():
            index = getattr(layer, "termchat_index", None)
            if index is None or layer.kv_cache.dim() != 4:
                continue
            impl = layer.impl
            ops.set_layer(index, group, layer.kv_cache, layer.isa, impl.scale, impl.sliding_window, float(impl.logits_soft_cap),
                          float(layer._k_scale_float), float(layer._v_scale_float), impl.kv_cache_dtype, own)
        builder.termchat_layers, builder.termchat_caches = layers, caches

    original_model_forward = GPUModelRunner._model_forward

    def _model_forward(self, *args, **kwargs):
        try:
            if own:  # a prompt's rows keep vLLM's kernel: the requests' prompt lengths, in the metadata's order
                batch = self.input_batch
                ops.set_prompts(batch.num_prompt_tokens_cpu_tensor[: batch.num_reqs])
            return original_model_forward(self, *args, **kwargs)
        finally:
            ops.end_steps()

    # vLLM keys its compiled model by the config and the forward's name, then checks only that the
    # files the cached graph traced are unchanged: an engine without this patch would load a graph
    # that calls attend() (and skips attention, no layer being registered), one with it a graph
    # without. So the patch and the operator's build go into the key.
    from vllm.compilation import caching

    from termchat.vllm_ext import build as operator_build

    original_factors = caching.aot_compile_hash_factors
    marker = f"termchat_attn {operator_build.fingerprint()['operator']}"

    def aot_compile_hash_factors(vllm_config):
        return [*original_factors(vllm_config), marker]

    caching.aot_compile_hash_factors = aot_compile_hash_factors
    Attention.__init__ = __init__
    Attention.forward = forward
    CPUAttentionMetadataBuilder.build = build
    GPUModelRunner._model_forward = _model_forward
    _installed = True
    return True


def python_ops_keep_the_python_wrapper(warn) -> None:
    """A layer that runs vLLM's own attention ops turns inductor's C++ wrapper off
    for its model, before the model is compiled.

    The built-in CPU profiles compile with the C++ wrapper (`cpp_wrapper`, 0.3-0.7
    ms a step faster: bench README). It cannot call vLLM's Python attention ops
    ("arg type PyObject is not yet supported by custom_op_wrapper"), so a model
    with such a layer failed to compile and the engine did not start: with the
    one-call attention off (TERMCHAT_FAST_ATTENTION=0), without the built
    operator, or with a layer attend() does not cover. Such a model now compiles
    with the Python wrapper. The compiled model's cache key follows the setting.
    `warn(message)` says so once. It asks at layer-build time whether install()
    ran, so the two may be installed in either order."""
    from vllm.config import get_current_vllm_config
    from vllm.model_executor.layers.attention.attention import Attention

    original_init = Attention.__init__

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        if _installed and eligible(self):  # attend() runs it (install()'s own test): no Python op in the graph
            return
        inductor = get_current_vllm_config().compilation_config.inductor_compile_config
        if inductor.pop("cpp_wrapper", False):
            warn(f"termchat: inductor's C++ wrapper is off for this model: layer {getattr(self, 'layer_name', '?')} runs vLLM's "
                 "Python attention ops, which it cannot call (the Python wrapper compiles it; steps 0.3-0.7 ms slower)")

    Attention.__init__ = __init__
