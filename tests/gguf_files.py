"""Small llama GGUF files the tests write themselves, in each tensor type
`termchat models add` converts: nothing is fetched from anywhere.

The model is random and tiny (1 layer, hidden 256: K-quant rows need a
multiple of 256), with the packaged SmolLM2 file's tokenizer copied in (its
first 1024 tokens), so
transformers and vLLM read it as a real llama file. Where the gguf package
quantizes a type (Q4_0 ... Q8_0), it does; for the K-quants it cannot, the
blocks are random bytes with small finite scales, which every dequantizer
reads. `write_llama` returns what each weight must dequantize to, in
llama.cpp's layout (q and k rows permuted for its rope).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

HIDDEN, FFN, HEADS, KV_HEADS, LAYERS = 256, 512, 4, 2, 1

# where a K-quant block keeps its float16 scale(s): byte offsets in the block
_F16_FIELDS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,), "IQ4_XS": (0,)}


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (HF layout -> GGUF)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _copy_tokenizer(writer, source: Path, vocab: int) -> None:
    """The source's tokenizer, cut to its first `vocab` tokens (the special
    tokens and the 256 byte symbols come first) and the merges among them: any
    text still encodes, and reading the file takes a second, not eight."""
    for key, value, kind, sub in _tokenizer_fields(source, vocab):
        writer.add_key_value(key, value, kind, sub_type=sub)


@functools.lru_cache(maxsize=4)
def _tokenizer_fields(source: Path, vocab: int) -> list[tuple]:
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(str(source))
    tokens = reader.fields["tokenizer.ggml.tokens"]
    kept = {bytes(tokens.parts[i]).decode("utf-8") for i in tokens.data[:vocab]}
    fields = []
    for key, f in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = f.types[0]
        if kind == GGUFValueType.ARRAY:
            sub = f.types[1]
            values = [bytes(f.parts[i]).decode("utf-8") if sub == GGUFValueType.STRING else f.parts[i].tolist()[0] for i in f.data]
            if key == "tokenizer.ggml.merges":
                values = [m for m in values if set(m.split(" ")) <= kept and m.replace(" ", "") in kept]
            elif len(values) == len(tokens.data):
                values = values[:vocab]
            fields.append((key, values, kind, sub))
        elif kind == GGUFValueType.STRING:
            fields.append((key, bytes(f.parts[f.data[0]]).decode("utf-8"), kind, None))
        else:
            fields.append((key, f.parts[f.data[0]].tolist()[0], kind, None))
    return fields


def _encode(weights: np.ndarray, kind: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(what the file holds, what it dequantizes to)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

    qtype = GGMLQuantizationType[kind]
    if kind == "F32":
        return weights.astype(np.float32), weights.astype(np.float32)
    if kind == "F16":
        held = weights.astype(np.float16)
        return held, held.astype(np.float32)
    if kind in _F16_FIELDS:
        block, size = GGML_QUANT_SIZES[qtype]
        rows, cols = weights.shape
        raw = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
        for offset in _F16_FIELDS[kind]:
            raw[:, offset : offset + 2] = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)
        raw = raw.reshape(rows, cols // block * size)
    else:
        raw = quants.quantize(weights, qtype)
    return raw, quants.dequantize(raw, qtype).reshape(weights.shape).astype(np.float32)


def write_llama(path: Path, kind: str, tokenizer_from: Path, seed: int = 0, vocab: int = 1024, layers: int = LAYERS) -> dict[str, np.ndarray]:
    """Write a one-layer llama GGUF whose matrices are all of type `kind`
    (norms stay F32, as llama.cpp keeps them); return tensor name -> the float
    values the file holds (GGUF names and layout)."""
    from gguf import GGMLQuantizationType, GGUFWriter

    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(path), "llama")
    writer.add_name(f"termchat-test-{kind.lower()}")
    writer.add_context_length(2048)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    _copy_tokenizer(writer, tokenizer_from, vocab)
    vocab = len(writer.kv_data[0]["tokenizer.ggml.tokens"].value)
    writer.add_vocab_size(vocab)

    head_dim = HIDDEN // HEADS
    shapes = {"token_embd.weight": (vocab, HIDDEN), "output_norm.weight": (HIDDEN,)}
    for i in range(layers):
        shapes |= {
            f"blk.{i}.attn_norm.weight": (HIDDEN,),
            f"blk.{i}.attn_q.weight": (HIDDEN, HIDDEN),
            f"blk.{i}.attn_k.weight": (KV_HEADS * head_dim, HIDDEN),
            f"blk.{i}.attn_v.weight": (KV_HEADS * head_dim, HIDDEN),
            f"blk.{i}.attn_output.weight": (HIDDEN, HIDDEN),
            f"blk.{i}.ffn_norm.weight": (HIDDEN,),
            f"blk.{i}.ffn_gate.weight": (FFN, HIDDEN),
            f"blk.{i}.ffn_up.weight": (FFN, HIDDEN),
            f"blk.{i}.ffn_down.weight": (HIDDEN, FFN),
        }
    held = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            values = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
            writer.add_tensor(name, values)
            held[name] = values
            continue
        values = (0.05 * rng.standard_normal(shape)).astype(np.float32)
        data, held[name] = _encode(values, kind, rng)
        if data.dtype == np.uint8:
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=GGMLQuantizationType[kind])
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return held
