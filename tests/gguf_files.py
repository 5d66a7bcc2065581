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


def permute(w: np.ndarray, heads: int, inverse: bool = False) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (HF layout -> GGUF), or its inverse."""
    if inverse:
        return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
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

        def scaled(scale: float) -> np.ndarray:
            for offset in _F16_FIELDS[kind]:
                raw[:, offset : offset + 2] = np.frombuffer(np.float16(scale).tobytes(), np.uint8)
            return raw.reshape(rows, cols // block * size)

        spread = quants.dequantize(scaled(1.0), qtype).std()  # random codes: scale them to the other types' spread
        raw = scaled(float(weights.std()) / float(spread))
    else:
        try:
            raw = quants.quantize(weights, qtype)
        except NotImplementedError:  # a type gguf neither quantizes nor termchat serves: random blocks, never read
            block, size = GGML_QUANT_SIZES[qtype]
            raw = rng.integers(0, 256, size=(weights.shape[0], weights.shape[1] // block * size), dtype=np.uint8)
            return raw, np.zeros(weights.shape, np.float32)
    return raw, quants.dequantize(raw, qtype).reshape(weights.shape).astype(np.float32)


def write_llama(path: Path, kind: str, tokenizer_from: Path, seed: int = 0, vocab: int = 1024, layers: int = LAYERS,
                keys: dict | None = None, drop: tuple[str, ...] = (), shapes_override: dict | None = None, architecture: str = "llama",
                kinds: dict | None = None) -> dict[str, np.ndarray]:
    """Write a one-layer llama GGUF whose matrices are all of type `kind`
    (norms stay F32, as llama.cpp keeps them); return tensor name -> the float
    values the file holds (GGUF names and layout).

    For files that are not whole: `keys` sets metadata (None deletes a key;
    an int is written as uint32), `drop` leaves tensors out, `shapes_override`
    gives tensors another shape, `architecture` is what the header claims
    over llama's tensors, `kinds` gives single tensors another type."""
    from gguf import GGMLQuantizationType, GGUFWriter

    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(path), architecture)
    writer.arch = "llama"  # the keys below under llama's names, whatever the header claims
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
    for key, value in (keys or {}).items():
        writer.kv_data[0].pop(key, None)
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif value is not None:
            writer.add_uint32(key, value)

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
    shapes |= shapes_override or {}
    held = {}
    for name, shape in shapes.items():
        if name in drop:
            continue
        if len(shape) == 1:
            values = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
            writer.add_tensor(name, values)
            held[name] = values
            continue
        values = (0.05 * rng.standard_normal(shape)).astype(np.float32)
        this = (kinds or {}).get(name, kind)
        data, held[name] = _encode(values, this, rng)
        if data.dtype == np.uint8:
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=GGMLQuantizationType[this])
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return held


def reference_logprobs(held: dict[str, np.ndarray], ids: list[int], heads: int = HEADS, kv_heads: int = KV_HEADS, theta: float = 10000.0, eps: float = 1e-5) -> np.ndarray:
    """log-softmax of the next token at each position of `ids`, by a float64
    llama forward over the values the file holds (Hugging Face's layout: q
    and k rows unpermuted, neox rope, tied output layer): an implementation
    independent of vLLM and ggml."""
    w = {k: v.astype(np.float64) for k, v in held.items()}
    hidden = w["token_embd.weight"].shape[1]
    dim = hidden // heads

    def norm(x, weight):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight

    def rope(x):  # [T, heads, dim]
        inv = theta ** -(np.arange(0, dim, 2) / dim)
        angle = np.arange(len(ids))[:, None] * inv[None, :]
        cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
        a, b = x[..., : dim // 2], x[..., dim // 2 :]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)

    x = w["token_embd.weight"][ids]
    layers = 1 + max(int(k.split(".")[1]) for k in w if k.startswith("blk."))
    for i in range(layers):
        b = f"blk.{i}"
        h = norm(x, w[f"{b}.attn_norm.weight"])
        q = rope((h @ permute(w[f"{b}.attn_q.weight"], heads, inverse=True).T).reshape(len(ids), heads, dim))
        k = rope((h @ permute(w[f"{b}.attn_k.weight"], kv_heads, inverse=True).T).reshape(len(ids), kv_heads, dim))
        v = (h @ w[f"{b}.attn_v.weight"].T).reshape(len(ids), kv_heads, dim)
        k, v = np.repeat(k, heads // kv_heads, 1), np.repeat(v, heads // kv_heads, 1)
        scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(dim)
        scores = np.where(np.tril(np.ones((len(ids), len(ids)), bool))[None], scores, -np.inf)
        attn = np.exp(scores - scores.max(-1, keepdims=True))
        attn /= attn.sum(-1, keepdims=True)
        x = x + np.einsum("hts,shd->thd", attn, v).reshape(len(ids), hidden) @ w[f"{b}.attn_output.weight"].T
        h = norm(x, w[f"{b}.ffn_norm.weight"])
        gate = h @ w[f"{b}.ffn_gate.weight"].T
        x = x + ((gate / (1 + np.exp(-gate))) * (h @ w[f"{b}.ffn_up.weight"].T)) @ w[f"{b}.ffn_down.weight"].T
    logits = norm(x, w["output_norm.weight"]) @ w.get("output.weight", w["token_embd.weight"]).T
    logits -= logits.max(-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))
