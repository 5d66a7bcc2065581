"""TOML config -> validated Profile objects.

A config file holds `[profiles.NAME]` tables (plus the top-level keys
`default_profile` and `theme`). Every problem found becomes one `Problem`
naming the file, the line and the key, so `termchat profiles check` can list
them all and every other command can refuse a bad file with the same words.

The vLLM 0.8 spelling (`speculative_model`, `num_speculative_tokens`,
`ngram_prompt_lookup_min/max` directly in the profile) is translated into the
`speculative_config` mapping that current vLLM takes.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import sys
import types
import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - pyproject pins >= 3.11; kept for the tomli fallback
    import tomli as tomllib

from termchat import limits, numbers, paths
from termchat.profiles import speculation
from termchat.profiles.config_file import ConfigError, LineIndex, Problem, read_config_text
from termchat.errors import UserError
from termchat.profiles.speculation import LEGACY_KEYS, NGRAM, SUFFIX, Speculation

BUILTIN_SOURCE = "<built-in>"
DEFAULT_MODEL = "termchat:smollm2-135m-instruct"

TOP_KEYS = {"profiles": dict, "default_profile": str, "theme": str}
# vLLM server flags that termchat sets itself: from a profile they could make the
# managed engine listen beyond this machine, or without its key
OWNED_FLAGS = ("host", "port", "api_key", "uds", "model", "served_model_name", "ssl_keyfile", "ssl_certfile", "ssl_ca_certs", "root_path", "headless")
KEEP_ALIVE_S = 300.0  # Ollama's default: five minutes
MAX_KEEP_ALIVE_S = 7 * 86400.0
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _key(default=None, says: str = "a string", *, low=None, high=None, above: bool = False, types: tuple[type, ...] | None = None, factory=None):
    """A profile key: its default, how a message describes it, its range
    (`above`: low itself is excluded) and, when the annotation does not say,
    the TOML types it accepts."""
    meta = {"says": says, "range": (low, high, above) if low is not None else None, "types": types}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Profile:
    """Everything needed to start (or reach) one engine and sample from it."""

    name: str
    model: str = _key(DEFAULT_MODEL, "a string (hub id or local folder)")
    source: str = BUILTIN_SOURCE
    description: str = _key("")
    tokenizer: str | None = _key()
    dtype: str | None = _key(None, "a string such as 'auto', 'float32', 'bfloat16'")
    max_model_len: int | None = _key(None, "an integer", low=1, high=1 << 30)
    tensor_parallel_size: int | None = _key(None, "an integer", low=1, high=1024)
    quantization: str | None = _key(None, "a string such as 'awq'")
    # a weight format (WEIGHT_FORMATS) in place of dtype/quantization, or "auto": this
    # machine's measured choice (engine/weights.py)
    weights: str | None = _key(None, "a string: 'auto', 'ggml', 'float32', 'bfloat16', 'int4', 'int4-f32head', 'int4-int4head' or 'int4-int8head'")
    gpu_memory_utilization: float | None = _key(None, "a number", low=0.0, high=1.0, above=True)
    temperature: float = _key(0.7, "a number", low=0.0, high=2.0)
    code_temperature: float = _key(0.2, "a number", low=0.0, high=2.0)
    top_p: float = _key(1.0, "a number", low=0.0, high=1.0, above=True)
    max_tokens: int = _key(1024, "an integer", low=1, high=1 << 30)
    # more sampling knobs (SAMPLING_KNOBS), sent to the server only when set: its defaults otherwise
    top_k: int | None = _key(None, "an integer", low=1, high=1 << 20)
    min_p: float | None = _key(None, "a number", low=0.0, high=1.0)
    repetition_penalty: float | None = _key(None, "a number (1.0: none; above 1 discourages repeating)", low=0.0, high=2.0, above=True)
    presence_penalty: float | None = _key(None, "a number", low=-2.0, high=2.0)
    frequency_penalty: float | None = _key(None, "a number", low=-2.0, high=2.0)
    # the guard against loops for prompts about text, not code (the detector decides): sent as
    # frequency_penalty when neither the profile's frequency_penalty nor `/set` gives one
    text_frequency_penalty: float | None = _key(None, "a number", low=-2.0, high=2.0)
    stop: tuple[str, ...] = _key((), "a list of strings", types=(list,))
    seed: int | None = _key(None, "an integer", low=0, high=(1 << 63) - 1)
    system_prompt: str = _key("")
    endpoint: str | None = _key(None, "a URL such as 'http://gpu-box:8000/v1'")
    api_key_env: str | None = _key(None, "the name of an environment variable")
    # seconds; a cold large engine can take minutes
    first_token_timeout: float = _key(300.0, "a number of seconds", low=0.0, high=86400.0, above=True)
    # seconds an engine started here stays warm after its last user left (Ollama's keep_alive);
    # None: TERMCHAT_KEEP_ALIVE, else KEEP_ALIVE_S; 0: it stops when termchat leaves it
    keep_alive: float | None = _key(None, "a number of seconds (0: stop the engine when termchat leaves it)", low=0.0, high=MAX_KEEP_ALIVE_S)
    trust_remote_code: bool = _key(False, "true or false")
    theme: str | None = _key(None, "a theme name")
    test_command: str | None = _key(None, "a shell command such as 'pytest -q'")  # what /test runs
    engine_args: dict[str, Any] = _key(says="a table", factory=dict)
    env: dict[str, str] = _key(says="a table of strings", factory=dict)
    speculative: Speculation | None = _key(None, "a table", types=(dict,))

    @property
    def method(self) -> str | None:
        return self.speculative.method if self.speculative else None

    @property
    def num_speculative_tokens(self) -> int | None:
        return self.speculative.k if self.speculative else None

    @property
    def keep_alive_s(self) -> float:
        """How long the engine stays warm (warm.py), from the profile, else the environment."""
        if self.keep_alive is not None:
            return float(self.keep_alive)
        raw = os.environ.get("TERMCHAT_KEEP_ALIVE")
        if raw is None:
            return KEEP_ALIVE_S
        seconds = numbers.parse_real(raw, 0.0, MAX_KEEP_ALIVE_S)
        if seconds is None:  # inf, NaN, 1e999, -5, words: not a time to wait
            raise UserError(f"TERMCHAT_KEEP_ALIVE={raw[:40]!r} is not a number of seconds from 0 to {MAX_KEEP_ALIVE_S:.0f} (7 days); unset it or give one")
        return seconds

    @property
    def is_remote(self) -> bool:
        return bool(self.endpoint)

    def seed_promise(self) -> str:
        """What a seed gives on this profile, in one line (the plugin's position-keyed
        sampling holds in the engines termchat runs, for drafts without probabilities)."""
        if self.is_remote:
            return "a server termchat does not run may draw its noise step by step: if it speculates, the same seed can give another reply"
        options = self.speculative.options if self.speculative else {}
        if options.get("draft_sample_method") == "probabilistic":
            return "this profile's drafts are sampled (draft_sample_method \"probabilistic\"): the same seed gives the same reply only when the drafts are the same"
        return "the same seed gives the same reply on every run, with or without speculation"

    def sampling(self, overrides: dict[str, Any] | None = None, guard: dict[str, float] | None = None) -> dict[str, Any]:
        """The sampling settings a request carries (engine.client.Sampling's
        fields), with a session's `/set` values over the profile's, and a loop
        guard (`guard(kind)`, or a reply's own) where nothing else sets that penalty."""
        knobs = {key: getattr(self, key) for key in SESSION_KEYS} | (overrides or {})
        for key, value in (guard or {}).items():
            if knobs.get(key) is None:
                knobs[key] = value
        return knobs

    def guard(self, kind: str) -> dict[str, float]:
        """The loop guard for a prompt of this kind ("text" or "code")."""
        if kind == "text" and self.text_frequency_penalty is not None and self.frequency_penalty is None:
            return {"frequency_penalty": self.text_frequency_penalty}
        return {}

    def without_speculation(self) -> Profile:
        """The same engine settings with speculation off (for bench baselines)."""
        return replace(self, name=f"{self.name}-nospec", speculative=None)


def _accepted(hint) -> tuple[type, ...]:
    """The TOML types a field's annotation accepts (an int is a float too)."""
    if isinstance(hint, types.UnionType):  # X | None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    kind = typing.get_origin(hint) or hint
    return (int, float) if kind is float else (kind,)


_HINTS = typing.get_type_hints(Profile, globalns={**globals(), "Speculation": Speculation})
# key -> (accepted types, description used in messages), for every key a profile table may hold
PROFILE_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    f.name: (f.metadata["types"] or _accepted(_HINTS[f.name]), f.metadata["says"]) for f in fields(Profile) if f.metadata
}
PROFILE_KEYS.update({key: ((str,), "a string") if key == "speculative_model" else ((int,), "an integer") for key in LEGACY_KEYS})  # vLLM 0.8 spelling
RANGES = {f.name: f.metadata["range"] for f in fields(Profile) if f.metadata and f.metadata["range"]}
SAMPLING_KNOBS = ("top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "stop", "seed")
SESSION_KEYS = ("top_p", "max_tokens", *SAMPLING_KNOBS)  # what `/set` may change for a session


def check_value(key: str, value: Any) -> tuple[Any, str | None]:
    """A profile key's value as the profile holds it, or the message saying
    why it cannot be (its type and range; the file's words and `/set`'s)."""
    accepted, described = PROFILE_KEYS[key]
    if not speculation.is_toml_type(value, accepted):
        return None, f"must be {described}, not {type(value).__name__} {value!r}"
    if key in RANGES:
        low, high, above = RANGES[key]
        if not ((low < value if above else low <= value) and value <= high):
            shown = lambda x: f"{x:g}" if isinstance(x, float) else str(x)  # noqa: E731
            return None, f"{value} is out of range {'(' if above else '['}{shown(low)}, {shown(high)}]"
    if key == "stop":
        if not all(isinstance(item, str) and item for item in value):
            return None, "must be a list of non-empty strings, such as [\"###\", \"\\nUser:\"]"
        return tuple(value), None
    return value, None


def check_session_key(key: str) -> None:
    """A UserError unless `/set` may change `key`."""
    if key not in SESSION_KEYS:
        raise UserError(f"/set cannot change '{key}'{_suggest(key, SESSION_KEYS)}; it can: {', '.join(SESSION_KEYS)}")


def parse_session_value(key: str, text: str) -> Any:
    """`/set KEY VALUE`: the value written as in a profile (1.1, \"###\",
    [\"a\", \"b\"]), checked as a profile's; a UserError otherwise."""
    check_session_key(key)
    try:
        value = limits.toml_loads(f"v = {text}", f"/set {key}'s value", 64 << 10)["v"]
    except limits.Refused as exc:
        raise UserError(str(exc)) from None
    except tomllib.TOMLDecodeError:
        if key != "stop":
            raise UserError(f"/set {key} takes {PROFILE_KEYS[key][1]}, as in a profile; not {text!r}") from None
        value = [text]  # a bare word: one stop string
    if key == "stop" and isinstance(value, str):
        value = [value]
    value, message = check_value(key, value)
    if message:
        raise UserError(f"/set {key}: {message}")
    return value


# 512 MiB of KV cache: 11,648 tokens of the default model, so a 4096-token
# conversation, its prefix cached, and a dozen replies at once. vLLM zero-fills
# it at start, and on these VMs a first touch of fresh memory is slow (the
# kernel's clear_page: 2.2 s per GiB on the AVX-512 Xeon), so 1 GiB cost 1.2 s
# more per start (bench README, "A compiled cold start").
KV_CACHE_BYTES = 512 * 1024 * 1024


# The CPU engine every built-in profile shares: float32 and both cores
# (bfloat16 drifts without AVX512-BF16: engine/weights.BF16_FLAGS), compiled (torch.compile: decodes
# 1.2-1.5x faster than eager; the first start of each profile on a machine
# compiles for 1-3 min, later ones load vLLM's cache in seconds, see
# vllm_plugin.load_cpu_compile_cache), 512 MiB of KV cache, and vLLM and torch imported
# once, not three times: the "uni" executor with VLLM_ENABLE_V1_MULTIPROCESSING=0
# runs the model in the engine core's process, and TERMCHAT_FORK_ENGINE_CORE=1
# forks that process instead of spawning it (guarded_server.py); with the
# plugin's short warm-up, ready in 11.6 s from vLLM's compile cache instead
# of 16.2 on the AVX-512 Xeon (`python -m termchat.bench.cold_start`, bench README).
def _cpu_engine() -> dict:
    return dict(
        model=DEFAULT_MODEL,
        dtype="float32",
        max_model_len=4096,
        temperature=0.7,
        code_temperature=0.0,  # a 135M model wanders at 0.2; greedy also accepts most drafts
        top_p=0.95,
        max_tokens=512,
        # loops: 2 of 30 bench replies without a guard, none with it; code prompts keep none
        # (bench README, "Penalties against loops")
        text_frequency_penalty=0.5,
        system_prompt="You are a helpful, concise assistant for programmers.",
        weights="auto",  # the fastest format that passes the quality guard here (engine/weights.py)
        # inductor's C++ wrapper: the compiled graph calls its kernels and ops from C++, not from a
        # generated Python function; plain steps 0.25-0.7 ms shorter, the same text (bench README,
        # "Inductor's C++ wrapper, on a quiet host"); a first start compiles ~25 s longer. It cannot call
        # vLLM's own attention ops: a model with a layer termchat_attn does not run compiles with the
        # Python wrapper instead (vllm_ext/attention.python_ops_keep_the_python_wrapper)
        engine_args={"distributed_executor_backend": "uni", "kv_cache_memory_bytes": KV_CACHE_BYTES,
                     "compilation_config": {"inductor_compile_config": {"cpp_wrapper": True}}},
        # VLLM_CPU_ATTN_SPLIT_KV=0: vLLM's CPU attention splits one decode query's KV cache over the
        # threads and merges the parts, summing in another order than a step of several queries (draft
        # verification) does: a last-bit difference, which ggml's 8-bit activations turn into another
        # greedy token at near-ties (with it split, 8 of 20 greedy replies were the same with and without
        # suffix decoding; unsplit, 20 of 20: bench README, "Speculation that never changes the answer, on ggml")
        env={"VLLM_CPU_OMP_THREADS_BIND": "auto", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TERMCHAT_FORK_ENGINE_CORE": "1",
             "VLLM_CPU_ATTN_SPLIT_KV": "0"},
    )


def cpu_build() -> bool:
    """Is the installed vLLM its CPU build (`vllm-cpu`)? Profiles of termchat
    models then take the built-ins' CPU settings."""
    from importlib import metadata

    try:
        metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        return False
    return True


def cpu_defaults() -> dict:
    """What a profile naming a termchat model (`model = "termchat:NAME"`) on
    the CPU build inherits from the built-ins, under its own keys: their CPU
    engine (_cpu_engine) with the fastest format here (`weights = "auto"`) and
    a KV cache sized from the model (`kv_cache_memory_bytes = "auto"`:
    engine/command.py reads its layers, KV heads and context)."""
    base = _cpu_engine()
    del base["model"], base["max_model_len"]  # the model's own context, up to 4,096 (engine/command.py)
    base["engine_args"] = {**base["engine_args"], "kv_cache_memory_bytes": "auto"}
    base["weights"] = "auto"
    return base


def with_cpu_defaults(values: dict) -> dict:
    """A profile table's values over cpu_defaults(): its own keys win, and in
    engine_args and env key by key."""
    base = cpu_defaults()
    merged = {**base, **values}
    for key in ("engine_args", "env"):
        merged[key] = {**base[key], **values.get(key, {})}
    by_hand = "dtype" in values or "quantization" in values or "quantization" in values.get("engine_args", {})
    if by_hand and "weights" not in values:  # a dtype or quantization written by hand stands
        del merged["weights"]
    return merged


def is_loopback(url: str) -> bool:
    """Is this URL on this machine (127.0.0.0/8, ::1, localhost)?"""
    host = urlsplit(url).hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# weight format -> what a local profile's engine is given for it (bench.formats measures them)
WEIGHT_FORMATS = {
    "float32": {"dtype": "float32"},
    "bfloat16": {"dtype": "bfloat16"},
    "int4": {"quantization": "termchat_int4"},  # vllm_ext/int4.py; output layer bfloat16
    "int4-f32head": {"quantization": "termchat_int4_f32head"},
    "int4-int4head": {"quantization": "termchat_int4_int4head"},  # the output layer in 4 bits too
    "int4-int8head": {"quantization": "termchat_int4_int8head"},  # the output layer in 8 bits, a scale per row
    # the GGUF file's own blocks on ggml's kernels (vllm_ext/ggml.py), read from the file by its loader
    "ggml": {"quantization": "termchat_ggml", "load_format": "termchat_gguf"},
}


def in_format(profile: Profile, weights: str) -> Profile:
    """The profile with its weights in one of WEIGHT_FORMATS (named format-NAME)."""
    if weights not in WEIGHT_FORMATS:
        raise UserError(f"unknown weight format {weights!r}; known: {', '.join(WEIGHT_FORMATS)}")
    change = WEIGHT_FORMATS[weights]
    args = {k: v for k, v in profile.engine_args.items() if k not in ("quantization", "load_format")}
    args |= {k: change[k] for k in ("quantization", "load_format") if k in change}
    return replace(profile, name=f"format-{weights}", dtype=change.get("dtype", "float32"), quantization=None, weights=None, engine_args=args)


def builtin_profiles() -> dict[str, Profile]:
    """Profiles that exist without any config file, so F2 can compare methods
    on a fresh install. `local` is the default: the method the bench measured
    best on our CPUs (README, "Speculation per prompt category")."""
    about = "SmolLM2-135M-Instruct on the CPU"
    return {
        "local": Profile(name="local", description=f"{about}, suffix decoding: the measured best (built in)", speculative=SUFFIX, **_cpu_engine()),
        "local-ngram": Profile(name="local-ngram", description=f"{about}, ngram prompt lookup k=5 (built in)", speculative=NGRAM, **_cpu_engine()),
        "local-suffix": Profile(name="local-suffix", description=f"{about}, suffix decoding up to 16 tokens (built in)", speculative=SUFFIX, **_cpu_engine()),
        "local-plain": Profile(name="local-plain", description=f"{about}, no speculation (built in)", **_cpu_engine()),
    }


@dataclass
class Config:
    """The profiles available to this run, built-in ones included."""

    profiles: dict[str, Profile]
    default_profile: str = "local"
    theme: str | None = None
    path: Path | None = None

    def get(self, name: str | None) -> Profile:
        name = name or self.default_profile
        if name in self.profiles:
            return self.profiles[name]
        where = str(self.path) if self.path else "the built-in profiles"
        hint = _suggest(name, self.profiles)
        raise UserError(
            f"unknown profile '{name}' in {where}{hint}. Known profiles: {', '.join(self.profiles)}. "
            "Run `termchat profiles list` to see them."
        )


def _suggest(word: str, known) -> str:
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def parse_config(text: str, file: str) -> tuple[Config, list[Problem]]:
    """Parse and validate a config text. Returns the usable profiles and every problem."""
    try:
        raw = limits.toml_loads(text, "the file")
    except limits.Refused as exc:
        return Config(builtin_profiles()), [Problem(file, None, "", str(exc).removeprefix("the file "))]
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        match = re.search(r"\(at line (\d+), column (\d+)\)", msg)
        line = int(match.group(1)) if match else getattr(exc, "lineno", None)
        if line is None and "end of document" in msg:
            line = max(1, len(text.splitlines()))
        msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", msg)
        col = f" (column {match.group(2)})" if match else ""
        return Config(builtin_profiles()), [Problem(file, line, "", f"TOML syntax error: {msg}{col}")]

    index = LineIndex(text)
    problems: list[Problem] = []

    def problem(table: str, key: str | None, message: str) -> None:
        full = ".".join(filter(None, [table, key or ""]))
        problems.append(Problem(file, index.line(table, key), full, message))

    for key, value in raw.items():
        if key not in TOP_KEYS:
            problem("", key, f"unknown top-level key{_suggest(key, TOP_KEYS)}; known: {', '.join(TOP_KEYS)}")
        elif not isinstance(value, TOP_KEYS[key]):
            problem("", key, f"must be a {'table' if TOP_KEYS[key] is dict else 'string'}")

    profiles = builtin_profiles()
    tables = raw.get("profiles", {})
    if isinstance(tables, dict):
        for name, table in tables.items():
            if not isinstance(table, dict):
                problem("profiles", name, "must be a table: write [profiles." + name + "]")
                continue
            if not NAME.fullmatch(name):
                problem("profiles", name, "a profile name may hold letters, digits, '-', '_' and '.' only (it names log and state files)")
                continue
            profile = _parse_profile(name, table, file, problem)
            if profile is not None:
                profiles[name] = profile

    default = raw.get("default_profile", "local")
    if isinstance(default, str) and default not in profiles:
        problem("", "default_profile", f"names no profile{_suggest(default, profiles)}; known: {', '.join(profiles)}")
        default = "local"
    theme = raw.get("theme") if isinstance(raw.get("theme"), str) else None
    return Config(profiles, default if isinstance(default, str) else "local", theme, Path(file)), problems


def _parse_profile(name: str, table: dict, file: str, problem) -> Profile | None:
    where = f"profiles.{name}"
    errors: list[str] = []

    def bad(key: str | None, message: str, table_name: str = where) -> None:
        errors.append(key or "")
        problem(table_name, key, message)

    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in PROFILE_KEYS:
            bad(key, f"unknown key{_suggest(key, PROFILE_KEYS)}")
            continue
        value, message = check_value(key, value)
        if message:
            bad(key, message)
            continue
        values[key] = value

    spec = speculation.parse(values.get("speculative") or {}, {k: values[k] for k in LEGACY_KEYS if k in values}, lambda key, message, sub: bad(key, message, f"{where}.{sub}" if sub else where), _suggest)

    if "weights" in values and values["weights"] not in ("auto", *WEIGHT_FORMATS):
        bad("weights", f"unknown weight format {values['weights']!r}; use 'auto' (this machine's measured choice) or one of {', '.join(WEIGHT_FORMATS)}")
    if "weights" in values and "endpoint" in values:
        bad("weights", "chooses the format of an engine termchat starts; a remote endpoint's server chooses its own. Remove it.")
    if "endpoint" in values and not re.match(r"^https?://", values["endpoint"]):
        bad("endpoint", "must start with http:// or https://")
    if "api_key_env" in values and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", values["api_key_env"]):
        bad("api_key_env", "must be the name of an environment variable, not the key itself")
    for flag in values.get("engine_args", {}):
        # a first, early check with the file's line (the engine checks the final arguments
        # with vLLM's own parser: guarded_server.py): "host=...", and abbreviations ("hos")
        given = flag.lstrip("-").split("=")[0].replace("-", "_")
        if any(owned == given or (len(given) >= 2 and owned.startswith(given)) for owned in OWNED_FLAGS):
            bad(flag, "termchat sets this flag itself (the engine listens on 127.0.0.1, a free port, with a random API key); remove it. For an engine elsewhere, use `endpoint`.", f"{where}.engine_args")
    if "env" in values:
        for env_key, env_value in values["env"].items():
            if not isinstance(env_value, (str, int, float, bool)):
                bad(env_key, "environment values must be strings", f"{where}.env")
        values["env"] = {k: str(v) for k, v in values["env"].items()}
    if not errors and "model" not in table and "endpoint" not in table and name != "local":
        bad(None, "has no `model`; add model = \"org/name\" or a local folder")

    if errors:
        return None
    if "endpoint" in values and "model" not in values:
        values["model"] = ""  # asked of the server at the first request
    if "endpoint" not in values and str(values.get("model", "")).startswith("termchat:") and cpu_build():
        values = with_cpu_defaults(values)
    for key in LEGACY_KEYS:
        values.pop(key, None)
    values["speculative"] = spec
    return Profile(name=name, source=file, **values)


def config_path(explicit: str | os.PathLike | None = None) -> Path | None:
    """Lookup order: --config FILE, $TERMCHAT_CONFIG, the user config folder, else none."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("TERMCHAT_CONFIG")
    if env:
        return Path(env)
    user = paths.config_dir() / "config.toml"
    return user if user.exists() else None


def load_config(explicit: str | os.PathLike | None = None) -> Config:
    """The config for this run; raises ConfigError listing every problem."""
    path = config_path(explicit)
    if path is None:
        return Config(builtin_profiles())
    config, problems = parse_config(read_config_text(path), str(path))
    if problems:
        raise ConfigError(problems)
    return config


def check_file(path: str | os.PathLike) -> list[Problem]:
    """Every problem in one file (for `termchat profiles check`)."""
    try:
        _, problems = parse_config(read_config_text(Path(path)), str(path))
    except ConfigError as exc:
        return exc.problems
    return problems
