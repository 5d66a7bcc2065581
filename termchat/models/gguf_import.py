"""Bring your own model: a GGUF file a user already has (from Ollama, LM Studio,
the Hugging Face cache, anywhere) becomes `termchat:NAME`, offline, in seconds.

The file is served as it is (`weights = "ggml"`: its own blocks on ggml's
kernels, vllm_ext/ggml.py), so `add` writes only what vLLM needs beside it:
the model's config.json, its tokenizer (transformers builds it from the
file's vocabulary) and termchat-source.json, which names the file and how
it was when added (size, modification time). Nothing is copied.

A model is added only when it is whole. Before anything is written, the
header is read within limits (vllm_ext/gguf_file.py) and checked against the
architecture: every tensor it needs is there with the right shape and a type
ggml's CPU kernels multiply, nothing is left over, the heads divide, the
vocabulary has tokens, the rope matches, and every block's scales are finite
(the whole file is read). Anything else gets one line and exit 2
(`UserError`) and leaves nothing behind; transformers' own messages never
reach the user raw. The folder is written under a hidden temporary name and
renamed at the end.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from termchat import models, paths
from termchat.errors import UserError
from termchat.progress import ProgressLine
from termchat.vllm_ext import gguf_file
from termchat.vllm_ext.ggml import ARCHITECTURES

SERVED = tuple(ARCHITECTURES)  # general.architecture values the GGUF loader maps (Mistral files say "llama")
# the tensor types ggml's CPU kernels multiply that termchat serves (and checks the scales of)
MATRIX_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")
VECTOR_TYPES = ("F32", "F16", "BF16")  # norms and biases
TYPES = MATRIX_TYPES
# where each block keeps its float16 scale(s): byte offsets (ggml-common.h's block layouts)
SCALE_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82), "Q3_K": (108,),
                "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,), "IQ4_XS": (0,)}
MAX_CONTEXT = 4096  # what the built-in profiles serve; a profile's max_model_len may ask more
CHUNK = 64 << 20


@dataclass
class GgufFile:
    path: Path
    architecture: str
    name: str  # general.name, or ""
    parameters: int
    types: dict[str, int] = field(default_factory=dict)  # tensor type -> tensors
    bytes: int = 0
    header: gguf_file.Header | None = None


def inspect(path: str | Path) -> GgufFile:
    """Read a GGUF file's header (within limits) and describe it; one
    UserError naming the file and what is wrong otherwise."""
    path = Path(path).expanduser()
    try:
        header = gguf_file.read(path)
    except gguf_file.GgufError as exc:
        raise UserError(str(exc)) from None
    architecture = header.architecture
    if architecture is None:
        raise UserError(f"{path}: the GGUF header names no architecture (general.architecture); it is not a model file termchat can serve")
    parts = header.get("split.count", int)
    if parts is not None and parts > 1:
        raise UserError(f"{path}: one part of a model split in {parts} files; merge them first (llama.cpp's `llama-gguf-split --merge FIRST-PART OUT.gguf`)")
    if not header.tensors:
        raise UserError(f"{path}: the GGUF file holds no tensors (a vocabulary-only file?)")
    info = GgufFile(path, architecture, header.get("general.name", str) or "", 0, bytes=header.size, header=header)
    for tensor in header.tensors.values():
        info.types[tensor.type_name] = info.types.get(tensor.type_name, 0) + 1
        info.parameters += tensor.elements
    return info


def _int(header: gguf_file.Header, key: str, default: int | None = None, low: int = 1, high: int = 1 << 24) -> int:
    value = header.get(key)
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        shown = "missing" if value is None else f"{value!r}"[:40]
        raise UserError(f"{header.path}: {key} is {shown}; a whole model has a whole number from {low} to {high:,} there")
    return value


def _real(header: gguf_file.Header, key: str, default: float, low: float = 0.0) -> float:
    value = header.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= low:
        raise UserError(f"{header.path}: {key} is {value!r}; it must be a finite number above {low:g}")
    return float(value)


def config_of(info: GgufFile) -> dict:
    """The model's config.json (Hugging Face's keys, as vLLM reads them) from
    the header, every number checked; UserError otherwise."""
    header, arch = info.header, info.architecture
    if arch not in SERVED:
        raise UserError(f"{info.path}: architecture '{arch}' is not one termchat serves (it serves {', '.join(SERVED)}; Mistral files say llama)")
    layers = _int(header, f"{arch}.block_count", high=1000)
    hidden = _int(header, f"{arch}.embedding_length", high=1 << 17)
    ffn = _int(header, f"{arch}.feed_forward_length", high=1 << 20)
    heads = _int(header, f"{arch}.attention.head_count", high=4096)
    kv_heads = _int(header, f"{arch}.attention.head_count_kv", default=heads, high=4096)
    if heads % kv_heads:
        raise UserError(f"{info.path}: {heads} attention heads do not divide into {kv_heads} key/value heads")
    if header.get(f"{arch}.attention.key_length") is None and hidden % heads:
        raise UserError(f"{info.path}: {heads} attention heads do not divide the hidden size {hidden}")
    head_dim = _int(header, f"{arch}.attention.key_length", default=hidden // heads, high=4096)
    if _int(header, f"{arch}.attention.value_length", default=head_dim, high=4096) != head_dim:
        raise UserError(f"{info.path}: keys and values of different lengths; termchat serves models whose heads have one length")
    if _int(header, f"{arch}.rope.dimension_count", default=head_dim, high=4096) != head_dim:
        raise UserError(f"{info.path}: the rope turns part of each head only ({arch}.rope.dimension_count); termchat serves models whose rope turns the whole head")
    if head_dim % 2:
        raise UserError(f"{info.path}: heads of {head_dim} values; the rope needs an even number")
    tokens = header.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise UserError(f"{info.path}: the file has no vocabulary (tokenizer.ggml.tokens); termchat needs the tokenizer inside the GGUF file")
    vocab = len(tokens)
    if _int(header, f"{arch}.vocab_size", default=vocab, high=1 << 22) != vocab:
        raise UserError(f"{info.path}: {arch}.vocab_size says {header.get(f'{arch}.vocab_size')}, the vocabulary holds {vocab} tokens")
    context = _int(header, f"{arch}.context_length", default=MAX_CONTEXT, high=1 << 24)
    config = {
        "architectures": [ARCHITECTURES[arch]], "model_type": arch, "hidden_size": hidden, "intermediate_size": ffn,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "max_position_embeddings": context, "rms_norm_eps": _real(header, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        "rope_parameters": {"rope_type": "default", "rope_theta": _real(header, f"{arch}.rope.freq_base", 10000.0)},
        "vocab_size": vocab, "tie_word_embeddings": "output.weight" not in header.tensors, "hidden_act": "silu", "dtype": "float32",
    }
    if arch == "llama":
        config |= {"attention_bias": False, "mlp_bias": False}
    for key, name in (("bos_token_id", "tokenizer.ggml.bos_token_id"), ("eos_token_id", "tokenizer.ggml.eos_token_id")):
        token = header.get(name)
        if token is not None:
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab:
                raise UserError(f"{info.path}: {name} is {token!r}, not a token of its {vocab}")
            config[key] = token
    _check_tensors(info, config)
    return config


def expected_tensors(config: dict) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """(required, optional): tensor name -> shape in ggml's order (row length first)."""
    arch, hidden, ffn, vocab = config["model_type"], config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = config["head_dim"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    required = {"token_embd.weight": (hidden, vocab), "output_norm.weight": (hidden,)}
    optional = {"output.weight": (hidden, vocab), "rope_freqs.weight": (head_dim // 2,)}
    for i in range(config["num_hidden_layers"]):
        b = f"blk.{i}"
        required |= {f"{b}.attn_norm.weight": (hidden,), f"{b}.attn_q.weight": (hidden, q), f"{b}.attn_k.weight": (hidden, kv),
                     f"{b}.attn_v.weight": (hidden, kv), f"{b}.attn_output.weight": (q, hidden), f"{b}.ffn_norm.weight": (hidden,),
                     f"{b}.ffn_gate.weight": (hidden, ffn), f"{b}.ffn_up.weight": (hidden, ffn), f"{b}.ffn_down.weight": (ffn, hidden)}
        if arch == "qwen2":
            required |= {f"{b}.attn_q.bias": (q,), f"{b}.attn_k.bias": (kv,), f"{b}.attn_v.bias": (kv,)}
        if arch == "qwen3":
            required |= {f"{b}.attn_q_norm.weight": (head_dim,), f"{b}.attn_k_norm.weight": (head_dim,)}
    return required, optional


def _check_tensors(info: GgufFile, config: dict) -> None:
    tensors = info.header.tensors
    required, optional = expected_tensors(config)
    missing = [n for n in required if n not in tensors]
    if missing:
        raise UserError(f"{info.path}: not a whole {config['model_type']} model: {missing[0]} is missing" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    extra = sorted(set(tensors) - set(required) - set(optional))
    if extra:
        raise UserError(f"{info.path}: {extra[0]} is not a tensor of a {config['model_type']} model of this shape" + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "") + "; the architecture field may not match the tensors")
    for name, shape in {**required, **{n: s for n, s in optional.items() if n in tensors}}.items():
        t = tensors[name]
        if t.shape != shape:
            raise UserError(f"{info.path}: {name} has shape {list(t.shape)}, a {config['model_type']} model of this config needs {list(shape)}")
        allowed = VECTOR_TYPES if len(shape) == 1 else MATRIX_TYPES
        if t.type_name not in allowed:
            raise UserError(f"{info.path}: tensor {name} is of type {t.type_name}, which termchat does not serve (it serves {', '.join(allowed)}); pick a file of another quantization")
    if "rope_freqs.weight" in tensors:
        if config["model_type"] != "llama":
            raise UserError(f"{info.path}: rope_freqs.weight in a {config['model_type']} model; termchat serves rope scaling for llama 3 only")
        config["rope_parameters"] = _llama3_rope(info, config)


def _llama3_rope(info: GgufFile, config: dict) -> dict:
    """Llama 3.1's rope scaling, which its GGUF keeps as rope_freqs.weight (one
    factor per frequency): the llama3 parameters that give those factors, checked."""
    import numpy as np

    t = info.header.tensors["rope_freqs.weight"]
    fd = gguf_file.open_regular(info.path)
    try:
        raw = os.pread(fd, t.nbytes, t.offset)
    finally:
        os.close(fd)
    if t.type_name != "F32":
        raise UserError(f"{info.path}: rope_freqs.weight is {t.type_name}; llama.cpp writes it in F32")
    factors = np.frombuffer(raw, dtype=np.float32)
    theta, dim = config["rope_parameters"]["rope_theta"], config["head_dim"]
    rope = {"rope_type": "llama3", "rope_theta": theta, "factor": float(factors.max()), "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": _int(info.header, "llama.rope.scaling.original_context_length", default=8192)}
    freqs = theta ** -(np.arange(0, dim, 2, dtype=np.float64) / dim)
    wavelen = 2 * math.pi / freqs
    low, high = rope["original_max_position_embeddings"] / rope["low_freq_factor"], rope["original_max_position_embeddings"] / rope["high_freq_factor"]
    smooth = (rope["original_max_position_embeddings"] / wavelen - rope["low_freq_factor"]) / (rope["high_freq_factor"] - rope["low_freq_factor"])
    want = np.where(wavelen < high, 1.0, np.where(wavelen > low, rope["factor"], 1 / ((1 - smooth) / rope["factor"] + smooth)))
    if not np.isfinite(factors).all() or not np.allclose(factors, want, rtol=1e-3):
        raise UserError(f"{info.path}: rope_freqs.weight is not llama 3's rope scaling; termchat serves no other")
    return rope


def scan_scales(info: GgufFile, progress=None) -> None:
    """Read the whole file: every block's scales, and every float tensor's
    values, must be finite (a NaN scale makes a block of NaN weights)."""
    import numpy as np

    fd = gguf_file.open_regular(info.path)
    try:
        for t in sorted(info.header.tensors.values(), key=lambda t: t.offset):
            block = gguf_file.TYPES[t.type][2]
            step = max(block, CHUNK // block * block)
            for start in range(0, t.nbytes, step):
                raw = os.pread(fd, min(step, t.nbytes - start), t.offset + start)
                if t.type_name in ("F32", "F16", "BF16"):
                    values = np.frombuffer(raw, dtype={"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[t.type_name])
                    finite = ((values & 0x7F80) != 0x7F80).all() if t.type_name == "BF16" else np.isfinite(values).all()
                else:
                    blocks = np.frombuffer(raw, dtype=np.uint8).reshape(-1, block)
                    finite = all(np.isfinite(blocks[:, o : o + 2].copy().view(np.float16)).all() for o in SCALE_FIELDS[t.type_name])
                if not finite:
                    raise UserError(f"{info.path}: tensor {t.name} holds NaN or infinite {'values' if t.type_name in VECTOR_TYPES else 'block scales'}; the file is damaged, copy it again")
            if progress:
                progress(t)
    finally:
        os.close(fd)


def add(file: str | Path, name: str | None = None, quiet: bool = False) -> str:
    """Add `file` as termchat:NAME (its stem by default); returns the name."""
    info = inspect(file)
    short = (name or _default_name(info)).lower()
    full = f"termchat:{short}"
    if full in models.BUILTIN or short in {m.folder for m in models.BUILTIN.values()}:
        raise UserError(f"'{short}' is the packaged model's name; pick another with --name")
    target = models.folder(full)  # checks the name
    if target.exists() or target.is_symlink():
        raise UserError(f"{full} exists already ({target}); remove it with `termchat models remove {short}` or pick another --name")
    started = time.monotonic()
    progress = ProgressLine(every=10.0)
    progress.last = started  # in a log, a line only for a step that takes a while: a refusal stays one line
    show = (lambda line: None) if quiet else progress.show
    config = config_of(info)
    show(f"[1/3] checking {info.path.name} whole ({info.bytes / 1e9:.2f} GB, {len(info.header.tensors)} tensors)")
    try:
        scan_scales(info, lambda t: show(f"[1/3] checking {info.path.name} whole: {t.name}"))
        _check_memory(info)
    finally:
        progress.done()
    show("[2/3] writing its config and tokenizer")
    with tempfile.TemporaryDirectory(prefix="termchat-add-") as staging:  # all of it before the models folder is touched
        staged = Path(staging)
        (staged / "config.json").write_text(json.dumps(config, indent=2))
        try:
            _tokenizer(info, staged)
        finally:
            progress.done()
        source = {"gguf": str(info.path.resolve()), "identity": list(info.header.identity), "bytes": info.bytes, "architecture": info.architecture,
                  "gguf_name": info.name, "types": info.types, "added_at": time.time()}
        (staged / "termchat-source.json").write_text(json.dumps(source, indent=2))
        _place(staged, target)
    if not quiet:
        progress.say(f"added {full} in {time.monotonic() - started:.0f} s; {info.path} is served as it is: keep it there")
    return full


def _place(staged: Path, target: Path) -> None:
    """Copy the staged files into a hidden folder beside `target`, then rename
    it: a failure leaves nothing, not even an `added/` folder made for it."""
    parent = target.parent
    made = not parent.exists()
    work = None
    try:
        if not parent.is_symlink():  # a link to a folder (a bigger disk) is the user's own: used as it is
            paths.private_dir(parent)
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=parent))
        for item in staged.iterdir():
            shutil.copyfile(item, work / item.name)
            (work / item.name).chmod(0o600)
        work.rename(target)
        work = None
    except OSError as exc:
        raise UserError(f"writing {target} failed ({exc.strerror or exc}); nothing was kept") from None
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
            if made:
                shutil.rmtree(parent, ignore_errors=True)


def _tokenizer(info: GgufFile, folder: Path) -> None:
    """transformers builds the tokenizer from the file's vocabulary; it must
    round-trip text and carry a chat template (termchat chats through it)."""
    try:
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise UserError("adding a model needs `transformers`: pip install -e '.[cpu]'") from None
    hf_logging.set_verbosity_error()
    try:
        with contextlib.redirect_stderr(io.StringIO()), _quiet_loggers():
            tokenizer = AutoTokenizer.from_pretrained(str(info.path.parent), gguf_file=info.path.name)
            sample = "def f(x):\n    return x + 1  # café"
            round_trip = tokenizer.decode(tokenizer.encode(sample, add_special_tokens=False))
            tokenizer.save_pretrained(str(folder))
    except Exception as exc:  # transformers' own errors, in one line of ours
        first = (str(exc).strip().splitlines() or [""])[0]
        raise UserError(f"{info.path}: its tokenizer cannot be built ({type(exc).__name__}: {first[:160]}); the file's vocabulary is damaged or of a kind termchat does not read") from None
    if round_trip != sample:
        raise UserError(f"{info.path}: its tokenizer does not give text back as it was (a damaged vocabulary?)")
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(f"{info.path}: the file has no chat template (tokenizer.chat_template); termchat chats through it, so take an instruct/chat file")


@contextlib.contextmanager
def _quiet_loggers():
    names = ("transformers", "gguf")
    levels = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.ERROR)
    try:
        yield
    finally:
        for n, level in levels.items():
            logging.getLogger(n).setLevel(level)


def _check_memory(info: GgufFile) -> None:
    """Serving maps every block into memory: a file larger than this machine's
    memory less 2 GB (the engine, its KV cache) cannot answer here."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return
    if info.bytes > total - (2 << 30):
        raise UserError(f"{info.path}: serving its {info.bytes / 1e9:.1f} GB needs more than this machine's {total / 1e9:.0f} GB of memory; pick a smaller quantization")


def _default_name(info: GgufFile) -> str:
    stem = info.path.name.removesuffix(".gguf")
    candidate = models.slug(stem)
    if not models.NAME.fullmatch(candidate or "-"):
        raise UserError(f"{info.path}: name it with --name NAME (its file name '{stem}' is not a model name)")
    return candidate


def remove(name: str) -> Path:
    """Delete an added model's folder (never the packaged one, never its GGUF file)."""
    full = name if name.startswith("termchat:") else f"termchat:{name}"
    if full in models.BUILTIN:
        raise UserError(f"{full} is the packaged model; it is not removed (delete {models.folder(full)} by hand if you must)")
    target = models.folder(full)
    if target.is_symlink() or not target.is_dir():
        raise UserError(f"no added model {full}; `termchat models list` shows them")
    shutil.rmtree(target)
    return target
