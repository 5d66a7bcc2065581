"""GGUF files of the sizes users bring, written here with the `gguf` package:
nothing is fetched.

Decoding one token reads every weight once, so a file's speed depends on its
shape and block types, not on what the weights say: random blocks read the
same bytes as trained ones. The vocabulary is the packaged SmolLM2 file's
(49,152 tokens), so the files are whole models that `termchat models add`
accepts and llama.cpp loads.

- `1.7b`: SmolLM2-1.7B's shape (24 layers of 2,048, 32 heads, feed-forward
  8,192), Q4_1 matrices, the embedding in Q8_0 and tied, as the default's:
  about 1.1 GB.
- `7b`: Mistral-7B's shape (32 layers of 4,096, 32 heads over 8 key/value
  heads, feed-forward 14,336) in llama.cpp's Q4_K_M mix: Q4_K, with attn_v
  and ffn_down in Q6_K on the layers llama.cpp gives more bits
  (`use_more_bits`), the output layer in Q6_K: about 4.5 GB (Mistral-7B's
  own Q4_K_M file is 4.37 GB; this vocabulary is larger).

Written tensor by tensor (the writer never holds a whole file), into the
user's cache folder, once: `path(name)` writes it when it is missing.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from termchat import paths

SHAPES = {
    "1.7b": dict(layers=24, hidden=2048, heads=32, kv_heads=32, ffn=8192, mix="Q4_1", embedding="Q8_0", tied=True),
    "7b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, mix="Q4_K_M", embedding="Q4_K", tied=False),
}
# where a block keeps its float16 scale(s): the values they get keep weights about 0.02
_SCALES = {"Q4_1": ((0, 0.002), (2, -0.015)), "Q8_0": ((0, 0.0002),), "Q4_K": ((0, 0.00003), (2, 0.00001)), "Q6_K": ((208, 0.00001),)}


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's rule (llama-quant.cpp) for the layers Q4_K_M gives Q6_K's attn_v and ffn_down."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensor_types(shape: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (GGUF shape, row length first; type) of every tensor of the file."""
    h, f, L = shape["hidden"], shape["ffn"], shape["layers"]
    kv = shape["kv_heads"] * h // shape["heads"]
    out = {"token_embd.weight": ((h, VOCAB), shape["embedding"]), "output_norm.weight": ((h,), "F32")}
    if not shape["tied"]:
        out["output.weight"] = ((h, VOCAB), "Q6_K")
    for i in range(L):
        b = f"blk.{i}"
        more = "Q6_K" if shape["mix"] == "Q4_K_M" and use_more_bits(i, L) else None
        base = "Q4_K" if shape["mix"] == "Q4_K_M" else shape["mix"]
        out |= {f"{b}.attn_norm.weight": ((h,), "F32"), f"{b}.ffn_norm.weight": ((h,), "F32"),
                f"{b}.attn_q.weight": ((h, h), base), f"{b}.attn_k.weight": ((h, kv), base), f"{b}.attn_v.weight": ((h, kv), more or base),
                f"{b}.attn_output.weight": ((h, h), base), f"{b}.ffn_gate.weight": ((h, f), base), f"{b}.ffn_up.weight": ((h, f), base),
                f"{b}.ffn_down.weight": ((f, h), more or base)}
    return out


VOCAB = 49152


def folder() -> Path:
    return paths.cache_dir() / "bench-gguf"


def path(name: str) -> Path:
    """The file of SHAPES[name], written first if it is not there yet."""
    target = folder() / f"{name}.gguf"
    if not target.is_file():
        write(name, target)
    return target


def _copy_tokenizer(writer) -> None:
    from gguf import GGUFValueType

    from termchat.models import _gguf_path
    from termchat.vllm_ext import gguf_file

    source = gguf_file.read(_gguf_path(quiet=True))
    for key, value in source.metadata.items():
        if not key.startswith("tokenizer."):
            continue
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, np.ndarray):
            writer.add_array(key, value.tolist())
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        else:
            writer.add_key_value(key, value, GGUFValueType.UINT32)


def write(name: str, target: Path) -> None:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

    shape = SHAPES[name]
    rng = np.random.default_rng(0)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.part")
    writer = GGUFWriter(str(partial), "llama")
    writer.add_name(f"termchat bench {name} ({shape['mix']}, random weights)")
    writer.add_context_length(4096)
    writer.add_embedding_length(shape["hidden"])
    writer.add_block_count(shape["layers"])
    writer.add_feed_forward_length(shape["ffn"])
    writer.add_head_count(shape["heads"])
    writer.add_head_count_kv(shape["kv_heads"])
    writer.add_rope_dimension_count(shape["hidden"] // shape["heads"])
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB)
    _copy_tokenizer(writer)
    tensors = tensor_types(shape)
    for tensor, (dims, kind) in tensors.items():
        qtype = GGMLQuantizationType[kind]
        block, size = GGML_QUANT_SIZES[qtype]
        rows = int(np.prod(dims[1:]))
        nbytes = rows * dims[0] // block * size
        writer.add_tensor_info(tensor, (rows, dims[0] // block * size) if kind != "F32" else tuple(reversed(dims)), np.dtype(np.uint8 if kind != "F32" else np.float32), nbytes, raw_dtype=qtype if kind != "F32" else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    try:
        for tensor, (dims, kind) in tensors.items():
            if kind == "F32":
                writer.write_tensor_data(np.ones(tuple(reversed(dims)), np.float32))
                continue
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
            rows = int(np.prod(dims[1:]))
            raw = rng.integers(0, 256, size=(rows * dims[0] // block, size), dtype=np.uint8)
            for offset, value in _SCALES[kind]:
                raw[:, offset : offset + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
            writer.write_tensor_data(raw.reshape(rows, -1))
        writer.close()
        partial.rename(target)
    finally:
        partial.unlink(missing_ok=True)


if __name__ == "__main__":  # python -m termchat.bench.user_files 1.7b 7b: write them
    import sys

    for name in sys.argv[1:] or list(SHAPES):
        print(path(name), f"{path(name).stat().st_size / 1e9:.2f} GB")
