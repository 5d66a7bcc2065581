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
import os
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - pyproject pins >= 3.11; kept for the tomli fallback
    import tomli as tomllib

from termchat import paths
from termchat.errors import UserError

BUILTIN_SOURCE = "<built-in>"
DEFAULT_MODEL = "termchat:smollm2-135m-instruct"

TOP_KEYS = {"profiles": dict, "default_profile": str, "theme": str}

# key -> (accepted types, description used in messages)
PROFILE_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "description": ((str,), "a string"),
    "model": ((str,), "a string (hub id or local folder)"),
    "tokenizer": ((str,), "a string"),
    "dtype": ((str,), "a string such as 'auto', 'float32', 'bfloat16'"),
    "max_model_len": ((int,), "an integer"),
    "tensor_parallel_size": ((int,), "an integer"),
    "quantization": ((str,), "a string such as 'awq'"),
    "gpu_memory_utilization": ((int, float), "a number"),
    "temperature": ((int, float), "a number"),
    "code_temperature": ((int, float), "a number"),
    "top_p": ((int, float), "a number"),
    "max_tokens": ((int,), "an integer"),
    "system_prompt": ((str,), "a string"),
    "endpoint": ((str,), "a URL such as 'http://gpu-box:8000/v1'"),
    "api_key_env": ((str,), "the name of an environment variable"),
    "first_token_timeout": ((int, float), "a number of seconds"),
    "trust_remote_code": ((bool,), "true or false"),
    "theme": ((str,), "a theme name"),
    "engine_args": ((dict,), "a table"),
    "env": ((dict,), "a table of strings"),
    "speculative": ((dict,), "a table"),
    # vLLM 0.8 spelling, translated into `speculative`
    "speculative_model": ((str,), "a string"),
    "num_speculative_tokens": ((int,), "an integer"),
    "ngram_prompt_lookup_min": ((int,), "an integer"),
    "ngram_prompt_lookup_max": ((int,), "an integer"),
}
LEGACY_KEYS = ("speculative_model", "num_speculative_tokens", "ngram_prompt_lookup_min", "ngram_prompt_lookup_max")

SPEC_METHODS = ("draft_model", "ngram", "suffix", "eagle", "eagle3", "mtp", "medusa", "mlp_speculator")
METHODS_NEEDING_MODEL = ("draft_model", "eagle", "eagle3", "medusa", "mlp_speculator")
SPEC_KEY_TYPES: dict[str, tuple[type, ...]] = {
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

# (low, high, inclusive-low) ranges
RANGES: dict[str, tuple[float, float, bool]] = {
    "temperature": (0.0, 2.0, True),
    "code_temperature": (0.0, 2.0, True),
    "top_p": (0.0, 1.0, False),
    "gpu_memory_utilization": (0.0, 1.0, False),
    "max_tokens": (1, 1 << 30, True),
    "max_model_len": (1, 1 << 30, True),
    "tensor_parallel_size": (1, 1024, True),
    "first_token_timeout": (0.0, 86400.0, False),
}
MAX_SPECULATIVE_TOKENS = 64  # vLLM's rejection sampler takes up to 128; past ~7 (32 for suffix) nothing is gained
# vLLM server flags that termchat sets itself: from a profile they could make the
# managed engine listen beyond this machine, or without its key
OWNED_FLAGS = ("host", "port", "api_key", "uds", "model", "served_model_name")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class Profile:
    """Everything needed to start (or reach) one engine and sample from it."""

    name: str
    model: str = DEFAULT_MODEL
    source: str = BUILTIN_SOURCE
    description: str = ""
    tokenizer: str | None = None
    dtype: str | None = None
    max_model_len: int | None = None
    tensor_parallel_size: int | None = None
    quantization: str | None = None
    gpu_memory_utilization: float | None = None
    temperature: float = 0.7
    code_temperature: float = 0.2
    top_p: float = 1.0
    max_tokens: int = 1024
    system_prompt: str = ""
    endpoint: str | None = None
    api_key_env: str | None = None
    first_token_timeout: float = 300.0  # seconds; a cold large engine can take minutes
    trust_remote_code: bool = False
    theme: str | None = None
    engine_args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    speculative: dict[str, Any] | None = None

    @property
    def method(self) -> str | None:
        return self.speculative.get("method") if self.speculative else None

    @property
    def draft(self) -> str | None:
        """The draft model, or the method when it needs none (ngram...)."""
        if not self.speculative:
            return None
        return self.speculative.get("model") or self.speculative.get("method")

    @property
    def num_speculative_tokens(self) -> int | None:
        return self.speculative.get("num_speculative_tokens") if self.speculative else None

    @property
    def is_remote(self) -> bool:
        return bool(self.endpoint)

    def without_speculation(self) -> Profile:
        """The same engine settings with speculation off (for bench baselines)."""
        return replace(self, name=f"{self.name}-nospec", speculative=None)


# The CPU engine every built-in profile shares: float32 and both cores
# (faster than bfloat16 on AVX2-only CPUs), eager mode (starts in ~30 s instead
# of ~200 s of torch.compile), 1 GiB of KV cache.
def _cpu_engine() -> dict:
    return dict(
        model=DEFAULT_MODEL,
        dtype="float32",
        max_model_len=4096,
        temperature=0.7,
        code_temperature=0.0,  # a 135M model wanders at 0.2; greedy also accepts most drafts
        top_p=0.95,
        max_tokens=512,
        system_prompt="You are a helpful, concise assistant for programmers.",
        engine_args={"enforce_eager": True},
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "auto", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"},
    )


NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
# suffix decoding (Arctic Inference): drafts only where its suffix trees are
# confident, up to num_speculative_tokens per step, and remembers earlier replies
SUFFIX = {"method": "suffix", "num_speculative_tokens": 16}


def builtin_profiles() -> dict[str, Profile]:
    """Profiles that exist without any config file, so F2 can compare methods
    on a fresh install. `local` is the default: the method the bench measured
    best on our CPUs (README, "Speculation per prompt category")."""
    about = "SmolLM2-135M-Instruct on the CPU"
    return {
        "local": Profile(name="local", description=f"{about}, suffix decoding: the measured best (built in)", speculative=dict(SUFFIX), **_cpu_engine()),
        "local-ngram": Profile(name="local-ngram", description=f"{about}, ngram prompt lookup k=5 (built in)", speculative=dict(NGRAM), **_cpu_engine()),
        "local-suffix": Profile(name="local-suffix", description=f"{about}, suffix decoding up to 16 tokens (built in)", speculative=dict(SUFFIX), **_cpu_engine()),
        "local-plain": Profile(name="local-plain", description=f"{about}, no speculation (built in)", **_cpu_engine()),
    }


@dataclass(frozen=True)
class Problem:
    file: str
    line: int | None
    key: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


class ConfigError(UserError):
    """A config file with problems; str() lists every one, one per line."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems) + "\nFix the file, then run `termchat profiles check` to confirm.")


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


class _LineIndex:
    """Finds the line of `[table]` headers and `key =` lines in a TOML text.

    tomllib gives no positions for values, so messages about a key use this.
    Dotted keys and inline tables fall back to the table's header line.
    """

    HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
    KEY = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_\-.]+)\s*=""")

    def __init__(self, text: str):
        self.tables: dict[str, int] = {}
        self.keys: dict[tuple[str, str], int] = {}
        table = ""
        for number, line in enumerate(text.splitlines(), start=1):
            header = self.HEADER.match(line)
            if header:
                table = self._norm(header.group(1))
                self.tables.setdefault(table, number)
                continue
            key = self.KEY.match(line)
            if key:
                parts = [p.strip().strip("\"'") for p in key.group(1).split(".")]
                full = ".".join(filter(None, [table, *parts[:-1]]))
                self.keys.setdefault((full, parts[-1]), number)

    @staticmethod
    def _norm(name: str) -> str:
        return ".".join(p.strip().strip("\"'") for p in name.split("."))

    def line(self, table: str, key: str | None = None) -> int | None:
        if key is not None and (table, key) in self.keys:
            return self.keys[(table, key)]
        if key is not None and table and f"{table}.{key}" in self.tables:
            return self.tables[f"{table}.{key}"]
        if table in self.tables:
            return self.tables[table]
        parent = table.rsplit(".", 1)[0] if "." in table else ""
        if parent and parent != table:
            return self.line(parent, table.rsplit(".", 1)[1])
        return None


def read_config_text(path: Path) -> str:
    """The file's text, or a ConfigError saying why it cannot be read as TOML text."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError([Problem(str(path), None, "", "file not found; check the path (or unset TERMCHAT_CONFIG)")]) from None
    except IsADirectoryError:
        raise ConfigError([Problem(str(path), None, "", "is a folder, not a TOML file")]) from None
    except OSError as exc:
        raise ConfigError([Problem(str(path), None, "", f"cannot be read: {exc.strerror}")]) from None
    data = data.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark, as some editors write
    if b"\x00" in data:
        raise ConfigError([Problem(str(path), 1, "", "not a text file (it contains NUL bytes); point --config at a TOML file")])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError([Problem(str(path), line, "", "not UTF-8 text; save the file as UTF-8 TOML")]) from None


def parse_config(text: str, file: str) -> tuple[Config, list[Problem]]:
    """Parse and validate a config text. Returns the usable profiles and every problem."""
    try:
        raw = tomllib.loads(text)
    except RecursionError:
        return Config(builtin_profiles()), [Problem(file, None, "", "tables or arrays are nested too deeply to be a termchat config")]
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        match = re.search(r"\(at line (\d+), column (\d+)\)", msg)
        line = int(match.group(1)) if match else getattr(exc, "lineno", None)
        if line is None and "end of document" in msg:
            line = max(1, len(text.splitlines()))
        msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", msg)
        col = f" (column {match.group(2)})" if match else ""
        return Config(builtin_profiles()), [Problem(file, line, "", f"TOML syntax error: {msg}{col}")]

    index = _LineIndex(text)
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


def _check_type(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


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
        types, described = PROFILE_KEYS[key]
        if not _check_type(value, types):
            bad(key, f"must be {described}, not {type(value).__name__} {value!r}")
            continue
        values[key] = value

    for key, (low, high, inclusive) in RANGES.items():
        if key in values:
            v = values[key]
            ok = (low <= v if inclusive else low < v) and v <= high
            if not ok:
                lo = "[" if inclusive else "("
                bad(key, f"{v} is out of range {lo}{low:g}, {high:g}]")
                values.pop(key)

    spec = _speculative(values, where, bad)

    if "endpoint" in values and not re.match(r"^https?://", values["endpoint"]):
        bad("endpoint", "must start with http:// or https://")
    if "api_key_env" in values and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", values["api_key_env"]):
        bad("api_key_env", "must be the name of an environment variable, not the key itself")
    for flag in values.get("engine_args", {}):
        if flag.lstrip("-").replace("-", "_") in OWNED_FLAGS:
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
    for key in LEGACY_KEYS:
        values.pop(key, None)
    values["speculative"] = spec
    return Profile(name=name, source=file, **values)


def _speculative(values: dict, where: str, bad) -> dict | None:
    """The speculative_config mapping, from [speculative] or the vLLM 0.8 keys."""
    legacy = {k: values[k] for k in LEGACY_KEYS if k in values}
    spec = dict(values.get("speculative") or {})
    table = f"{where}.speculative"
    if legacy and spec:
        bad(next(iter(legacy)), "give either the [speculative] table or the vLLM 0.8 keys, not both")
        return None
    if legacy:
        model = legacy.get("speculative_model")
        if model is None:
            bad(next(iter(legacy)), "vLLM 0.8 style speculation needs `speculative_model`")
            return None
        if model == "[ngram]":
            spec = {"method": "ngram"}
            if "ngram_prompt_lookup_min" in legacy:
                spec["prompt_lookup_min"] = legacy["ngram_prompt_lookup_min"]
            if "ngram_prompt_lookup_max" in legacy:
                spec["prompt_lookup_max"] = legacy["ngram_prompt_lookup_max"]
        else:
            spec = {"method": "draft_model", "model": model}
        spec["num_speculative_tokens"] = legacy.get("num_speculative_tokens", 5)
    if not spec:
        return None
    for key, value in spec.items():
        if key in SPEC_KEY_TYPES and not _check_type(value, SPEC_KEY_TYPES[key]):
            bad(key, f"must be {'an integer' if SPEC_KEY_TYPES[key] == (int,) else 'a string'}, not {value!r}", table)
            return None
    ok = True

    def fail(key: str, message: str) -> None:
        nonlocal ok
        ok = False
        bad(key, message, table)

    method = spec.get("method")
    if method is None and "model" in spec:
        spec["method"] = method = "draft_model"
    if method is None:
        fail("method", f"is missing; one of: {', '.join(SPEC_METHODS)}")
    elif method not in SPEC_METHODS:
        fail("method", f"unknown method '{method}'{_suggest(method, SPEC_METHODS)}; one of: {', '.join(SPEC_METHODS)}")
    elif method in METHODS_NEEDING_MODEL and not spec.get("model"):
        fail("model", f"method '{method}' needs a draft `model` (a smaller model of the same family)")
    k = spec.get("num_speculative_tokens")
    if k is None:
        fail("num_speculative_tokens", "is missing; 3 to 7 is usual")
    elif k < 1 or k > MAX_SPECULATIVE_TOKENS:
        fail("num_speculative_tokens", f"{k} is out of range: 1 to {MAX_SPECULATIVE_TOKENS} (3 to 7 is usual for a draft model, up to 32 for suffix)")
    lo, hi = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
    if lo is not None and lo < 1:
        fail("prompt_lookup_min", "must be at least 1")
    elif lo is not None and hi is not None and hi < lo:
        fail("prompt_lookup_max", f"{hi} is below prompt_lookup_min {lo}")
    return spec if ok else None


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
