"""A GGUF file served as it is: its own blocks, on ggml's own CPU kernels, in vLLM.

`quantization = "termchat_ggml"` with `load_format = "termchat_gguf"`
(engine args; `weights = "ggml"` in a profile sets both):

- the loader reads the GGUF file a termchat model folder names
  (termchat-source.json, written by `models add` or `models prepare`),
  checks it is the same file (size and modification time) and the same
  model the folder's config describes, and hands each tensor to its module;
- each linear layer keeps the file's blocks (rows of bytes) in a ggml buffer
  of the kind ggml itself picks for that type on this CPU (AMX, CPU_REPACK or
  plain: ggml_op.cpp), and multiplies with ggml's own mul_mat; merged layers
  (q/k/v, gate/up) keep one ggml tensor per run of shards of one type
  (Q4_K_M keeps attn_v in Q6_K beside q and k in Q4_K);
- the output layer runs on the file's own blocks too (output.weight, or the
  embedding's when they are tied), and embedding rows come from the blocks
  through ggml's to_float;
- llama's q and k rows, which the GGUF converter permuted for ggml's rope,
  are put back in Hugging Face's order on load (rows of blocks move whole);
- norms and biases are float32 copies.

The engine's memory is about the file's size: blocks are read one tensor at a
time (os.pread) and the file is not kept mapped.

Registered by the plugin (plugin.register) when the operator was built for
this CPU (build.py); nothing here imports the rest of termchat.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from termchat.vllm_ext import gguf_file

NAME = "termchat_ggml"  # the quantization
LOAD_FORMAT = "termchat_gguf"  # the model loader
SOURCE_FILE = "termchat-source.json"
# model_type -> what the loader maps; llama's q/k rows come permuted from the converter
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
PERMUTED = {"llama"}

_loaded: str | None = None  # the library's path once loaded in this process


def layer_linears(i: int) -> list[tuple[str, list[str]]]:
    """Layer i's products as the engine packs them: vLLM's module under
    model.layers.i, and the GGUF tensors packed into it, in order (one ggml
    tensor per run of one block type). The loader and bench.rows read this."""
    b = f"blk.{i}"
    return [("self_attn.qkv_proj", [f"{b}.attn_q.weight", f"{b}.attn_k.weight", f"{b}.attn_v.weight"]),
            ("self_attn.o_proj", [f"{b}.attn_output.weight"]),
            ("mlp.gate_up_proj", [f"{b}.ffn_gate.weight", f"{b}.ffn_up.weight"]),
            ("mlp.down_proj", [f"{b}.ffn_down.weight"])]


def library() -> Path:
    from termchat.vllm_ext import build

    return build.LIBRARY


def unavailable() -> str | None:
    """Why the operator cannot run in this environment, in one line, or None."""
    from termchat.vllm_ext import build

    if not build.LIBRARY.is_file():
        return "the ggml operator is not built in this environment (the set-up builds it: python -m termchat.vllm_ext.build)"
    if build.built() is None:
        return "the ggml operator was built for another CPU or another torch; build it again: python -m termchat.vllm_ext.build --force"
    return None


def load() -> None:
    """Load the operator into torch (once per process); RuntimeError with the reason otherwise."""
    global _loaded
    if _loaded:
        return
    reason = unavailable()
    if reason:
        raise RuntimeError(reason)
    import torch

    torch.ops.load_library(str(library()))
    _loaded = str(library())


def source_of(folder: Path) -> dict:
    """The model folder's record of its GGUF file: {"gguf": path, "identity": [...], ...}."""
    try:
        source = json.loads((Path(folder) / SOURCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        source = None
    if not isinstance(source, dict) or not isinstance(source.get("gguf"), str):
        raise ValueError(f"{folder} names no GGUF file (its {SOURCE_FILE} has no \"gguf\"); add the model again with `termchat models add`")
    return source


def read_checked(folder: Path) -> gguf_file.Header:
    """The header of the folder's GGUF file, if it is still the file that was added."""
    source = source_of(folder)
    header = gguf_file.read(source["gguf"])
    recorded = source.get("identity")
    if isinstance(recorded, list) and len(recorded) == 4 and list(header.identity[2:]) != recorded[2:]:
        raise ValueError(f"{source['gguf']} changed since it was added (size or modification time); add it again with `termchat models add`")
    return header


def _pread(fd: int, offset: int, size: int) -> bytearray:
    buf = bytearray(size)
    view, done = memoryview(buf), 0
    while done < size:
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise ValueError(f"the GGUF file ended early at byte {offset + done:,}")
        done += n
    return buf


def give_back_freed_memory() -> None:
    """Return the loader's freed buffers to the system. Each tensor's blocks are
    read into a buffer and copied into ggml's; buffers under glibc's mmap
    threshold (which rises as large ones are freed) come from the heap, which
    keeps them after free: 93 MB of the 7B file's load stayed resident
    (`malloc_trim` measured in the engine; bench README). Elsewhere than glibc,
    nothing to do."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def unpermute_rows(rows, heads: int):
    """llama.cpp's converter permutes q/k rows for ggml's rope
    (reshape(heads, 2, n/heads/2, ...).swapaxes(1, 2)); this is its inverse, on rows of any bytes."""
    n = rows.shape[0]
    return rows.reshape(heads, n // heads // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def register() -> bool:
    """Register the termchat_ggml quantization and the termchat_gguf loader
    with vLLM; False where vLLM is missing or the operator is not built here."""
    if unavailable() is not None:
        return False
    try:
        import numpy as np
        import torch
        from torch import nn
        from vllm.model_executor.layers.linear import LinearBase, LinearMethodBase
        from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, register_quantization_config
        from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
        from vllm.model_executor.model_loader import register_model_loader
        from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    except ImportError:
        return False
    if NAME in QUANTIZATION_METHODS:
        return True
    extra = os.environ.get("TERMCHAT_GGML_EXTRA", "1") != "0"  # 0: ggml's plain buffers only (for measuring)

    def ops():
        load()
        return torch.ops.termchat_ggml

    def product(layer, x):
        """x times the layer's weight: one ggml tensor (the usual case) without a list to box."""
        if layer.ggml_groups == 1:
            return torch.ops.termchat_ggml.linear1(x, layer.ggml_w0)
        return torch.ops.termchat_ggml.linear(x, [getattr(layer, f"ggml_w{i}") for i in range(layer.ggml_groups)])

    class GgmlLinearMethod(LinearMethodBase):
        """A linear layer on the GGUF's blocks; the loader fills ggml_w0.. (one per type run)."""

        requires_device_loading = False

        def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size, params_dtype, **extra_weight_attrs):
            layer.ggml_k = input_size_per_partition
            layer.ggml_shards = list(output_partition_sizes)
            layer.ggml_groups = 0

        def apply(self, layer, x, bias=None):
            out = product(layer, x)
            return out if bias is None else out + bias

        def process_weights_after_loading(self, layer) -> None:
            if layer.ggml_groups == 0:
                raise ValueError(f"termchat_gguf: a linear layer got no weights ({type(layer).__name__}, {layer.ggml_shards} rows)")

    class GgmlEmbeddingMethod(QuantizeMethodBase):
        """Embedding rows from the blocks (to_float); the output layer on ggml_w0."""

        requires_device_loading = False

        def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size, params_dtype, **extra_weight_attrs):
            layer.ggml_k = input_size_per_partition
            layer.ggml_groups = 0
            layer.ggml_type = -1

        def embedding(self, layer, input_):
            rows = torch.ops.termchat_ggml.get_rows(layer.ggml_rows, input_, layer.ggml_type, layer.ggml_k)
            return rows.to(layer.params_dtype)

        def apply(self, layer, x, bias=None):
            out = product(layer, x)
            return out if bias is None else out + bias

        def tie_weights(self, layer, embed_tokens):
            return layer  # the loader packs the embedding's blocks for the output layer too

        def process_weights_after_loading(self, layer) -> None:
            pass

    @register_quantization_config(NAME)
    class GgmlConfig(QuantizationConfig):
        def get_name(self) -> str:
            return NAME

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
                return GgmlLinearMethod()
            if isinstance(layer, VocabParallelEmbedding):
                return GgmlEmbeddingMethod()
            return None

    @register_model_loader(LOAD_FORMAT)
    class GgufLoader(BaseModelLoader):
        """Weights from the GGUF file the model folder names (termchat-source.json)."""

        def download_model(self, model_config) -> None:
            read_checked(Path(model_config.model))

        def load_weights(self, model: nn.Module, model_config) -> None:
            folder = Path(model_config.model)
            header = read_checked(folder)
            config = model_config.hf_config
            kind = getattr(config, "model_type", "")
            if kind not in ARCHITECTURES:
                raise ValueError(f"termchat_gguf serves {', '.join(ARCHITECTURES)} models, not {kind!r}")
            fd = gguf_file.open_regular(header.path)
            try:
                loading = _Loading(model, config, kind, header, fd)
                loading.run()
            finally:
                os.close(fd)
            give_back_freed_memory()
            import logging

            kinds = ", ".join(f"{n} in {buft}" for buft, n in sorted(loading.buffers.items()))
            logging.getLogger("vllm.termchat_plugin").info("termchat_gguf: %s: %d tensors served as their GGUF blocks (%s)", header.path.name, len(loading.used), kinds)

    class _Loading:
        def __init__(self, model, config, kind, header, fd):
            self.modules = dict(model.named_modules())
            self.config, self.kind, self.header, self.fd = config, kind, header, fd
            self.used: set[str] = set()
            self.buffers: dict[str, int] = {}  # ggml buffer kind -> weights in it (the engine log says)
            self.ops = ops()

        def tensor(self, name: str) -> gguf_file.Tensor:
            if name not in self.header.tensors:
                raise ValueError(f"{self.header.path}: the tensor {name} is missing")
            self.used.add(name)
            return self.header.tensors[name]

        def rows(self, name: str, heads: int = 0):
            """The tensor's blocks as uint8 [rows, row_bytes], llama's q/k rows unpermuted."""
            t = self.tensor(name)
            raw = np.frombuffer(_pread(self.fd, t.offset, t.nbytes), dtype=np.uint8).reshape(t.rows, t.row_bytes)
            if heads and self.kind in PERMUTED:
                raw = np.ascontiguousarray(unpermute_rows(raw, heads))
            return t, torch.from_numpy(raw)

        def floats(self, name: str):
            t = self.tensor(name)
            raw = _pread(self.fd, t.offset, t.nbytes)
            kinds = {"F32": np.float32, "F16": np.float16}
            if t.type_name == "BF16":
                values = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
            elif t.type_name in kinds:
                values = np.frombuffer(raw, dtype=kinds[t.type_name]).astype(np.float32)
            else:
                raise ValueError(f"{self.header.path}: {name} is {t.type_name}; termchat reads norms and biases in F32, F16 or BF16")
            return torch.from_numpy(values.reshape(tuple(reversed(t.shape))).copy())

        def set_float(self, module: str, attribute: str, value) -> None:
            param = getattr(self.modules[module], attribute)
            if tuple(param.shape) != tuple(value.shape):
                raise ValueError(f"{self.header.path}: {module}.{attribute} takes {tuple(param.shape)} values, the file has {tuple(value.shape)}")
            param.data.copy_(value.to(param.dtype))

        def linear(self, module: str, names: list[str], heads: list[int]) -> None:
            layer = self.modules[module]
            parts = [self.rows(n, h) for n, h in zip(names, heads)]
            for (t, _), want in zip(parts, layer.ggml_shards):
                if t.rows != want or t.shape[0] != layer.ggml_k:
                    raise ValueError(f"{self.header.path}: {t.name} is {t.shape[0]} x {t.rows}; {module} takes {layer.ggml_k} x {want}")
            self.attach(layer, parts)

        def attach(self, layer, parts) -> None:
            groups: list[tuple[int, list]] = []
            for t, raw in parts:  # runs of one type become one ggml tensor
                if groups and groups[-1][0] == t.type:
                    groups[-1][1].append(raw)
                else:
                    groups.append((t.type, [raw]))
            for i, (kind, shards) in enumerate(groups):
                handle = self.ops.pack(shards, kind, parts[0][0].shape[0], extra)
                layer.register_buffer(f"ggml_w{i}", handle, persistent=False)
                buft = self.ops.buffer_name(handle)
                self.buffers[buft] = self.buffers.get(buft, 0) + 1
            layer.ggml_groups = len(groups)

        def run(self) -> None:
            c, layers = self.config, self.config.num_hidden_layers
            rope_heads = {"attn_q": c.num_attention_heads, "attn_k": c.num_key_value_heads}  # llama's permuted rows
            for i in range(layers):
                p, b = f"model.layers.{i}", f"blk.{i}"
                for module, names in layer_linears(i):
                    self.linear(f"{p}.{module}", names, [rope_heads.get(n.split(".")[2], 0) for n in names])
                self.set_float(f"{p}.input_layernorm", "weight", self.floats(f"{b}.attn_norm.weight"))
                self.set_float(f"{p}.post_attention_layernorm", "weight", self.floats(f"{b}.ffn_norm.weight"))
                if self.kind == "qwen2":
                    bias = torch.cat([self.floats(f"{b}.attn_{x}.bias") for x in "qkv"])
                    self.set_float(f"{p}.self_attn.qkv_proj", "bias", bias)
                if self.kind == "qwen3":
                    self.set_float(f"{p}.self_attn.q_norm", "weight", self.floats(f"{b}.attn_q_norm.weight"))
                    self.set_float(f"{p}.self_attn.k_norm", "weight", self.floats(f"{b}.attn_k_norm.weight"))
            self.set_float("model.norm", "weight", self.floats("output_norm.weight"))
            embed = self.modules["model.embed_tokens"]
            t, raw = self.rows("token_embd.weight")
            if t.shape[0] != embed.ggml_k:
                raise ValueError(f"{self.header.path}: token_embd.weight has rows of {t.shape[0]}, the model {embed.ggml_k}")
            embed.register_buffer("ggml_rows", raw, persistent=False)
            embed.ggml_type = t.type
            head = self.modules.get("lm_head")
            if head is not None:
                name = "output.weight" if "output.weight" in self.header.tensors else "token_embd.weight"
                self.attach(head, [(self.tensor(name), raw if name == "token_embd.weight" else self.rows(name)[1])])
            if "rope_freqs.weight" in self.header.tensors:  # llama 3's rope scaling: models add checked the config says the same
                rope = getattr(self.config, "rope_parameters", None) or {}
                if rope.get("rope_type") != "llama3":
                    raise ValueError(f"{self.header.path}: the file scales its rope (rope_freqs.weight) and the model's config does not; add it again")
                self.used.add("rope_freqs.weight")
            left = sorted(set(self.header.tensors) - self.used)
            if left:
                raise ValueError(f"{self.header.path}: termchat does not know what to do with {', '.join(left[:5])}" + (" ..." if len(left) > 5 else ""))

    return True


def dequantize(raw, type_id: int, k: int):
    """Rows of GGUF blocks (uint8 [rows, row_bytes]) as float32 [rows, k], by ggml's to_float (tests, checks)."""
    import torch

    load()
    rows = raw.shape[0]
    return torch.ops.termchat_ggml.get_rows(raw, torch.arange(rows), type_id, k)


if __name__ == "__main__":  # python -m termchat.vllm_ext.ggml: is the operator usable here?
    reason = unavailable()
    print(reason or f"the ggml operator is built for this CPU: {library()}")
    sys.exit(1 if reason else 0)
