"""How a profile speculates: a typed view of vLLM's `speculative_config`.

A profile's `[speculative]` table (or the vLLM 0.8 keys) becomes one frozen
`Speculation`; every reader (command line, status bar, picker, store, bench,
advisor) asks it, and only `vllm_config()` turns it back into vLLM's mapping.
Keys termchat does not interpret (`draft_sample_method`, `revision`...) are
kept in `options` and passed through.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from termchat.models import short_name

METHODS = ("draft_model", "ngram", "suffix", "eagle", "eagle3", "mtp", "medusa", "mlp_speculator")
METHODS_NEEDING_MODEL = ("draft_model", "eagle", "eagle3", "medusa", "mlp_speculator")
# ngram and suffix propose only where they find a match (suffix: only as many
# tokens as it trusts), so their acceptance rate is not comparable with a
# fixed-k method's; tokens per step against a step's cost is (advisor.band)
ADAPTIVE_METHODS = ("ngram", "suffix")
MAX_TOKENS = 64  # vLLM's rejection sampler takes up to 128; past ~7 (32 for suffix) nothing is gained
KEY_TYPES: dict[str, tuple[type, ...]] = {
    "method": (str,),
    "model": (str,),
    "num_speculative_tokens": (int,),
    "prompt_lookup_min": (int,),
    "prompt_lookup_max": (int,),
    "draft_tensor_parallel_size": (int,),
    "quantization": (str,),
    "max_model_len": (int,),
    "revision": (str,),
}
LEGACY_KEYS = ("speculative_model", "num_speculative_tokens", "ngram_prompt_lookup_min", "ngram_prompt_lookup_max")
_TYPED = ("method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")


@dataclass(frozen=True)
class Speculation:
    method: str
    num_speculative_tokens: int
    model: str | None = None  # the draft model, for methods that have one
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    options: dict[str, Any] = field(default_factory=dict)  # other vLLM keys, passed as they are

    @property
    def k(self) -> int:
        return self.num_speculative_tokens

    @property
    def adaptive(self) -> bool:
        """Proposes a varying number of drafts (only where it finds a match)."""
        return self.method in ADAPTIVE_METHODS

    def label(self) -> str:
        """`suffix k=16`, `draft_model SmolLM2-135M k=5`: one name everywhere."""
        draft = f" {short_name(self.model)}" if self.model else ""
        return f"{self.method}{draft} k={self.k}"

    def with_changes(self, **changes) -> Speculation:
        """A copy with typed fields or vLLM options changed (bench sweeps, tests)."""
        typed = {k: v for k, v in changes.items() if k in _TYPED}
        options = {**self.options, **{k: v for k, v in changes.items() if k not in _TYPED}}
        return replace(self, **typed, options=options)

    def vllm_config(self, resolve=None) -> dict[str, Any]:
        """vLLM's `--speculative-config` mapping; `resolve` maps the draft
        model's name to the folder vLLM loads."""
        config: dict[str, Any] = {"method": self.method}
        if self.model:
            config["model"] = resolve(self.model) if resolve else self.model
        config["num_speculative_tokens"] = self.k
        for key in ("prompt_lookup_min", "prompt_lookup_max"):
            if getattr(self, key) is not None:
                config[key] = getattr(self, key)
        return {**config, **self.options}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Speculation:
        """From an already validated mapping (see `parse`)."""
        return cls(**{k: config[k] for k in _TYPED if k in config}, options={k: v for k, v in config.items() if k not in _TYPED})


def is_toml_type(value: Any, types: tuple[type, ...]) -> bool:
    return isinstance(value, types) and not (isinstance(value, bool) and bool not in types)


def parse(table: dict, legacy: dict, bad, suggest) -> Speculation | None:
    """A profile's speculation from its [speculative] table or the vLLM 0.8
    keys; `bad(key, message)` reports each problem (None is returned then)."""
    spec = dict(table)
    if legacy and spec:
        bad(next(iter(legacy)), "give either the [speculative] table or the vLLM 0.8 keys, not both", None)
        return None
    if legacy:
        model = legacy.get("speculative_model")
        if model is None:
            bad(next(iter(legacy)), "vLLM 0.8 style speculation needs `speculative_model`", None)
            return None
        if model == "[ngram]":
            spec = {"method": "ngram"}
            for old, new in (("ngram_prompt_lookup_min", "prompt_lookup_min"), ("ngram_prompt_lookup_max", "prompt_lookup_max")):
                if old in legacy:
                    spec[new] = legacy[old]
        else:
            spec = {"method": "draft_model", "model": model}
        spec["num_speculative_tokens"] = legacy.get("num_speculative_tokens", 5)
    if not spec:
        return None
    for key, value in spec.items():
        if key in KEY_TYPES and not is_toml_type(value, KEY_TYPES[key]):
            bad(key, f"must be {'an integer' if KEY_TYPES[key] == (int,) else 'a string'}, not {value!r}", "speculative")
            return None
    problems = []

    def fail(key: str, message: str) -> None:
        problems.append(key)
        bad(key, message, "speculative")

    method = spec.get("method")
    if method is None and "model" in spec:
        spec["method"] = method = "draft_model"
    if method is None:
        fail("method", f"is missing; one of: {', '.join(METHODS)}")
    elif method not in METHODS:
        fail("method", f"unknown method '{method}'{suggest(method, METHODS)}; one of: {', '.join(METHODS)}")
    elif method in METHODS_NEEDING_MODEL and not spec.get("model"):
        fail("model", f"method '{method}' needs a draft `model` (a smaller model of the same family)")
    k = spec.get("num_speculative_tokens")
    if k is None:
        fail("num_speculative_tokens", "is missing; 3 to 7 is usual")
    elif k < 1 or k > MAX_TOKENS:
        fail("num_speculative_tokens", f"{k} is out of range: 1 to {MAX_TOKENS} (3 to 7 is usual for a draft model, up to 32 for suffix)")
    lo, hi = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
    if lo is not None and lo < 1:
        fail("prompt_lookup_min", "must be at least 1")
    elif lo is not None and hi is not None and hi < lo:
        fail("prompt_lookup_max", f"{hi} is below prompt_lookup_min {lo}")
    return None if problems else Speculation.from_config(spec)


NGRAM = Speculation("ngram", 5, prompt_lookup_min=2, prompt_lookup_max=5)
# suffix decoding (Arctic Inference): drafts only where its suffix trees are
# confident, up to num_speculative_tokens per step, and remembers earlier replies
SUFFIX = Speculation("suffix", 16)
