"""Four-bit weights on torch's CPU int4 kernel, as a vLLM quantization method.

`quantization = "termchat_int4"` in a profile's `[engine]` (vLLM's
`--quantization termchat_int4`) keeps every linear layer's weight as 4-bit
integers in groups of 32 along the input, with a scale and a zero per group:
`w = (q - 8) * scale + zero`, the format of torch's own CPU kernel
`torch._weight_int4pack_mm_for_cpu` (the one gpt-fast and torchao use; it has
AVX2 and AVX-512 paths). Its activations go in as bfloat16: with float32 ones
the kernel takes a path about 11x slower (bench/README.md, "matmuls per
format").

The default model's float32 weights are the dequantized Q4_1 blocks of its
GGUF file (32 weights, `w = d * q + m`, q in 0..15). Q4_1 chose m as the
block's minimum and d as its range / 15, so the block's minimum and maximum
give d and m back, and the 4-bit codes are recovered exactly (`quantize`):
nothing is quantized a second time; `scale = d`, `zero = m + 8 d` (the
kernel's own rounding of the scales to bfloat16 is the only change).

The output layer (tied to the embedding in the default model) is read whole
every step: 28 M weights, as many bytes in float32 as all the int4 layers
twice over. Its GGUF blocks are Q8_0, not 4-bit, so it goes to bfloat16
instead (vLLM's oneDNN path; the 8-bit codes fit bfloat16 exactly, only the
scales round), while embedding lookups keep the float32 rows.
`termchat_int4_f32head` keeps the output layer float32 (for measuring; a
name of its own, since vLLM's compile cache is keyed by the settings, not by
the environment). `termchat_int4_int4head` puts the output layer on the int4
kernel too: its Q8_0 weights quantized again to 4 bits in groups of 32 (min
and range, the Q4_1 way), 18 MB a step instead of bfloat16's 57 MB; a second
quantization, so only the quality guard can admit it. `termchat_int4_int8head`
puts it on torch's int8 weight-only kernel (`_weight_int8pack_mm`: one scale
per row, where Q8_0 has one per 32 weights, so it too is quantized again):
28 MB a step.
Registered by the vLLM plugin (plugin.register); nothing here imports
the rest of termchat.
"""

from __future__ import annotations

NAME = "termchat_int4"
NAMES = {NAME: "bfloat16", "termchat_int4_f32head": "float32", "termchat_int4_int4head": "int4", "termchat_int4_int8head": "int8"}  # quantization name -> output layer
GROUP = 32


def quantize(weight, group: int = GROUP):
    """(codes [n, k] int32 in 0..15, step [n, k/group], low [n, k/group]) of a
    float weight [n, k]: per group its minimum and (maximum - minimum) / 15, the
    Q4_1 way, so Q4_1-dequantized weights give their own codes back."""
    import torch

    n, k = weight.shape
    w = weight.float().reshape(n, k // group, group)
    low, high = w.amin(-1), w.amax(-1)
    step = (high - low) / 15
    safe = torch.where(step > 0, step, torch.ones_like(step))  # a constant group: every code 0
    codes = torch.round((w - low[..., None]) / safe[..., None]).clamp(0, 15).to(torch.int32)
    return codes.reshape(n, k), step, low


def pack(weight, group: int = GROUP):
    """The kernel's operands for a float weight [n, k]: packed codes and the
    [k/group, n, 2] bfloat16 scales and zeros."""
    import torch

    codes, step, low = quantize(weight, group)
    packed = torch._convert_weight_to_int4pack_for_cpu(codes, 2)
    scales_and_zeros = torch.stack([step.t(), (low + 8 * step).t()], -1).contiguous().to(torch.bfloat16)
    return packed, scales_and_zeros


def supported(weight, group: int = GROUP) -> bool:
    """A matrix the kernel takes (a 3-D expert weight or a ragged shape is not)."""
    return weight.dim() == 2 and weight.shape[1] % group == 0 and weight.shape[0] % 8 == 0


def register() -> bool:
    """Register `termchat_int4` with vLLM (its out-of-tree quantization hook).
    False where vLLM or torch's kernel is missing."""
    try:
        import torch
        from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
        from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, register_quantization_config
        from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
        from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod, VocabParallelEmbedding
    except ImportError:
        return False
    if not hasattr(torch, "_weight_int4pack_mm_for_cpu"):
        return False
    if all(name in QUANTIZATION_METHODS for name in NAMES):
        return True

    def int4_product(x, packed, scales_and_zeros, bias):
        """x @ w.T (+ bias) for w packed by `pack`, bfloat16 activations on the way in."""
        rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        out = torch._weight_int4pack_mm_for_cpu(rows, packed, GROUP, scales_and_zeros).to(x.dtype)
        out = out.reshape(*x.shape[:-1], out.shape[-1])
        return out if bias is None else out + bias

    class Int4LinearMethod(UnquantizedLinearMethod):
        """Loads the float weight as vLLM does, then keeps only its 4-bit form."""

        def process_weights_after_loading(self, layer) -> None:
            weight = layer.weight.data
            if not supported(weight):  # a shape the kernel does not take: vLLM's own float path
                return super().process_weights_after_loading(layer)
            packed, scales_and_zeros = pack(weight)
            layer.int4_packed = torch.nn.Parameter(packed, requires_grad=False)
            layer.int4_scales_and_zeros = torch.nn.Parameter(scales_and_zeros, requires_grad=False)
            layer.weight = torch.nn.Parameter(torch.empty(0, dtype=weight.dtype), requires_grad=False)  # the float copy freed

        def apply(self, layer, x, bias=None):
            if not hasattr(layer, "int4_packed"):
                return super().apply(layer, x, bias)
            return int4_product(x, layer.int4_packed, layer.int4_scales_and_zeros, bias)

    class BF16HeadMethod(UnquantizedEmbeddingMethod):
        """Embedding lookups from the float32 rows; the logits from a bfloat16 copy."""

        def process_weights_after_loading(self, layer) -> None:
            super().process_weights_after_loading(layer)
            shadow = torch.nn.Module()
            shadow.weight = torch.nn.Parameter(layer.weight.data.to(torch.bfloat16), requires_grad=False)
            dispatch_cpu_unquantized_gemm(shadow, remove_weight=True)  # vLLM's own choice of kernel
            layer.bf16_head = shadow  # oneDNN's packed copy lives in cpu_linear's closure (weight emptied);
            # without oneDNN's bfloat16 (AVX2 machines) it is torch's linear on shadow.weight

        def apply(self, layer, x, bias=None):
            head = layer.bf16_head
            out = head.cpu_linear(x.to(torch.bfloat16), head.weight, None).to(x.dtype)
            return out if bias is None else out + bias

    class Int4HeadMethod(UnquantizedEmbeddingMethod):
        """Embedding lookups from the float32 rows; the logits on the int4 kernel."""

        def process_weights_after_loading(self, layer) -> None:
            super().process_weights_after_loading(layer)
            if not supported(layer.weight.data):  # a shape the kernel does not take: vLLM's own float path
                return
            packed, scales_and_zeros = pack(layer.weight.data)
            layer.int4_head_packed = torch.nn.Parameter(packed, requires_grad=False)
            layer.int4_head_scales_and_zeros = torch.nn.Parameter(scales_and_zeros, requires_grad=False)

        def apply(self, layer, x, bias=None):
            if not hasattr(layer, "int4_head_packed"):
                return super().apply(layer, x, bias)
            return int4_product(x, layer.int4_head_packed, layer.int4_head_scales_and_zeros, bias)

    class Int8HeadMethod(UnquantizedEmbeddingMethod):
        """Embedding lookups from the float32 rows; the logits on the int8 kernel (a scale per row)."""

        def process_weights_after_loading(self, layer) -> None:
            super().process_weights_after_loading(layer)
            weight = layer.weight.data.float()
            scales = (weight.abs().amax(1) / 127).clamp(min=1e-12)
            codes = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
            layer.int8_head = torch.nn.Parameter(codes, requires_grad=False)
            layer.int8_head_scales = torch.nn.Parameter(scales.to(torch.bfloat16), requires_grad=False)

        def apply(self, layer, x, bias=None):
            rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
            out = torch._weight_int8pack_mm(rows, layer.int8_head, layer.int8_head_scales).to(x.dtype)
            out = out.reshape(*x.shape[:-1], out.shape[-1])
            return out if bias is None else out + bias

    HEADS = {"bfloat16": BF16HeadMethod, "int4": Int4HeadMethod, "int8": Int8HeadMethod}  # float32: vLLM's own

    def config_class(name: str, head: str):
        class Int4Config(QuantizationConfig):
            def get_name(self) -> str:
                return name

            @classmethod
            def get_supported_act_dtypes(cls):
                return [torch.float32, torch.bfloat16]

            @classmethod
            def get_min_capability(cls) -> int:
                return 0

            @staticmethod
            def get_config_filenames() -> list[str]:
                return []

            @classmethod
            def from_config(cls, config):
                return cls()

            def get_quant_method(self, layer, prefix: str):
                if isinstance(layer, LinearBase):
                    return Int4LinearMethod()
                if isinstance(layer, VocabParallelEmbedding) and "lm_head" in prefix and head in HEADS:
                    return HEADS[head]()
                return None  # the embedding lookups (and a float32 head): vLLM's own

        return Int4Config

    for name, head in NAMES.items():
        register_quantization_config(name)(config_class(name, head))
    return True
