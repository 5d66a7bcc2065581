"""The default model's sense of topic: is a prompt about programming?

The rules in classify.py see code *written* in a prompt and the words of a
programming request; they cannot know that "a monad", "an inner join" or "is
this year a leap year" are programming questions without a list of every such
term (on prompts written after them they scored 0.76). The packaged default
model knows: a linear probe on the mean of its hidden states after layer 6 (of
30) tells programming topics from others.

Those 6 layers run here, in numpy, from the prepared model's own safetensors
(about 85 MB read once per process, tens of milliseconds per prompt): no
engine, no torch, no network. Without the prepared model the rules decide
alone. The probe's weights (topic_probe.json) are fitted by
`python -m termchat.bench.classify_train` on the labelled prompt sets.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

WEIGHTS = Path(__file__).with_name("topic_probe.json")
MODEL = "termchat:smollm2-135m-instruct"
MAX_TOKENS = 128  # the start of a long prompt says what it is about; bounds the cost of a pasted file (~0.1 s)
READ_CHARS = 8 * MAX_TOKENS  # tokenized at most: 128 tokens are rarely over 600 characters (a 5 MB paste took 5.6 s to tokenize whole)


@dataclass(frozen=True)
class Probe:
    """A logistic regression on the standardized mean hidden state."""

    layers: int
    source: dict  # the default model's termchat-source.json (package, file) the probe was fitted on
    mean: list[float]
    scale: list[float]
    weights: list[float]
    bias: float

    @cached_property
    def _arrays(self):
        """mean, scale and weights as float32 arrays, made once, not per prompt."""
        import numpy as np

        return tuple(np.asarray(values, np.float32) for values in (self.mean, self.scale, self.weights))

    def logit(self, features) -> float:
        mean, scale, weights = self._arrays
        return float((features - mean) / scale @ weights + self.bias)


class Encoder:
    """The first layers of the default model (Llama architecture), in numpy."""

    def __init__(self, folder: Path, layers: int):
        import numpy as np
        from safetensors import safe_open
        from tokenizers import Tokenizer

        from termchat import models

        self.config = models.read_config(folder)
        if self.config is None:
            raise OSError(f"{folder}: no readable config.json")
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.layers = layers
        wanted = ("model.embed_tokens.weight", *(f"model.layers.{i}." for i in range(layers)))
        with safe_open(str(folder / "model.safetensors"), "np") as f:
            # matrices transposed once here, so that each product below reads them in order
            self.w = {
                name: (np.ascontiguousarray(f.get_tensor(name).T) if name.endswith("proj.weight") else f.get_tensor(name)).astype(np.float32, copy=False)
                for name in f.keys()
                if name.startswith(wanted)
            }

    def features(self, text: str):
        """Mean hidden state after `layers` layers over the first MAX_TOKENS tokens."""
        import numpy as np

        c, w = self.config, self.w
        ids = self.tokenizer.encode(text[:READ_CHARS]).ids[:MAX_TOKENS] or [c.get("bos_token_id", 0)]
        heads, kv_heads, head = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        eps = float(c["rms_norm_eps"])
        theta = float((c.get("rope_parameters") or {}).get("rope_theta", c.get("rope_theta", 10000.0)))
        n = len(ids)
        angles = np.outer(np.arange(n), 1.0 / theta ** (np.arange(0, head, 2) / head))
        cos = np.cos(np.concatenate([angles, angles], -1)).astype(np.float32)
        sin = np.sin(np.concatenate([angles, angles], -1)).astype(np.float32)
        mask = np.triu(np.full((n, n), -np.inf, np.float32), 1)
        scale = 1.0 / math.sqrt(head)  # a Python float: a numpy float64 would make every product float64

        def norm(x, gain):
            return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * gain

        def rope(t):
            half = head // 2
            return t * cos + np.concatenate([-t[..., half:], t[..., :half]], -1) * sin

        x = w["model.embed_tokens.weight"][ids]
        for i in range(self.layers):
            p = f"model.layers.{i}."
            h = norm(x, w[p + "input_layernorm.weight"])
            q = rope((h @ w[p + "self_attn.q_proj.weight"]).reshape(n, heads, head).transpose(1, 0, 2))
            k = rope((h @ w[p + "self_attn.k_proj.weight"]).reshape(n, kv_heads, head).transpose(1, 0, 2))
            v = (h @ w[p + "self_attn.v_proj.weight"]).reshape(n, kv_heads, head).transpose(1, 0, 2)
            k, v = np.repeat(k, heads // kv_heads, 0), np.repeat(v, heads // kv_heads, 0)
            a = q @ k.transpose(0, 2, 1) * scale + mask
            a = np.exp(a - a.max(-1, keepdims=True))
            a /= a.sum(-1, keepdims=True)
            x = x + (a @ v).transpose(1, 0, 2).reshape(n, heads * head) @ w[p + "self_attn.o_proj.weight"]
            h = norm(x, w[p + "post_attention_layernorm.weight"])
            gate = h @ w[p + "mlp.gate_proj.weight"]
            x = x + (gate / (1 + np.exp(-gate)) * (h @ w[p + "mlp.up_proj.weight"])) @ w[p + "mlp.down_proj.weight"]
        return x.mean(0)


def load_probe(path: Path | None = None) -> Probe:
    return Probe(**json.loads((path or WEIGHTS).read_text(encoding="utf-8")))


def model_source(folder: Path) -> dict:
    """What the prepared model was made from (its conversion time left out)."""
    data = json.loads((folder / "termchat-source.json").read_text(encoding="utf-8"))
    return {key: data.get(key) for key in ("package", "file")}


_lock = threading.Lock()
_loaded: tuple[Encoder, Probe] | None = None
_unavailable = False


def _load() -> tuple[Encoder, Probe] | None:
    """The encoder and the probe, loaded once; None when the prepared default
    model is missing or is not the one the probe was fitted on."""
    global _loaded, _unavailable
    with _lock:
        if _loaded is None and not _unavailable:
            from termchat import models

            try:
                probe = load_probe()
                folder = models.folder(MODEL)
                if not models.is_prepared(MODEL) or model_source(folder) != probe.source:
                    _unavailable = True
                else:
                    _loaded = (Encoder(folder, probe.layers), probe)
            except (OSError, ValueError, KeyError, ImportError):
                _unavailable = True  # a damaged model folder or a missing library: the rules alone
        return _loaded


def probability(text: str) -> float | None:
    """P(programming topic), or None when the probe cannot run here."""
    loaded = _load()
    if loaded is None:
        return None
    encoder, probe = loaded
    z = probe.logit(encoder.features(text))
    return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))


def warm_in_background() -> None:
    """Load the encoder ahead of the first prompt, off the caller's thread
    (a front-end starting: about 0.5 s it need not wait for)."""
    if _loaded is None and not _unavailable:
        threading.Thread(target=_load, name="termchat-topic-probe", daemon=True).start()


def forget() -> None:
    """Drop what was loaded (tests that change the models folder)."""
    global _loaded, _unavailable
    with _lock:
        _loaded, _unavailable = None, False
