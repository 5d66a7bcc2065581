"""GGUF files already on this machine, for `termchat models found`: read-only.

Three stores are looked at, where their own programs put them:
- Ollama: `$OLLAMA_MODELS` or ~/.ollama/models. Weights are blobs named by
  digest (blobs/sha256-HEX); the names are in manifests/HOST/NAMESPACE/MODEL/TAG,
  whose layer of media type `application/vnd.ollama.image.model` is the GGUF.
- LM Studio: ~/.lmstudio/models and the older ~/.cache/lm-studio/models.
- Hugging Face's cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
  ~/.cache/huggingface/hub (models--OWNER--NAME/snapshots/REV/...).

Nothing is written and nothing is followed out of a store but its own blob
links. A manifest is data: a digest that is not 64 hex digits is skipped.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from termchat.errors import UserError

OLLAMA_MODEL = "application/vnd.ollama.image.model"
DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")
MANIFEST_LIMIT = 1 << 20


@dataclass
class Found:
    store: str  # ollama | lm-studio | huggingface
    name: str  # the store's own name for it
    path: Path
    bytes: int
    summary: str = ""  # architecture and types, or why it cannot be converted
    convertible: bool = False

    @property
    def suggested_name(self) -> str:
        from termchat.models import slug

        return slug(self.name.rsplit("/", 1)[-1].removesuffix(".gguf")) or "model"


def _home() -> Path:
    return Path(os.environ.get("HOME") or Path.home())


def ollama_root() -> Path:
    return Path(os.environ["OLLAMA_MODELS"]) if os.environ.get("OLLAMA_MODELS") else _home() / ".ollama" / "models"


def lmstudio_roots() -> list[Path]:
    return [_home() / ".lmstudio" / "models", _home() / ".cache" / "lm-studio" / "models"]


def huggingface_root() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return _home() / ".cache" / "huggingface" / "hub"


def _ollama() -> list[Found]:
    root = ollama_root()
    manifests = root / "manifests"
    found = []
    if not manifests.is_dir():
        return found
    for manifest in sorted(manifests.rglob("*")):
        if not manifest.is_file() or manifest.is_symlink() or manifest.stat().st_size > MANIFEST_LIMIT:
            continue
        try:
            layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers", [])
        except (OSError, ValueError, AttributeError):
            continue
        parts = manifest.relative_to(manifests).parts  # HOST, NAMESPACE, MODEL, TAG
        if len(parts) < 3:
            continue
        host, *middle, model, tag = parts
        prefix = "" if (host, *middle) == ("registry.ollama.ai", "library") else "/".join((host, *middle)) + "/"
        for layer in layers if isinstance(layers, list) else []:
            if not isinstance(layer, dict) or layer.get("mediaType") != OLLAMA_MODEL:
                continue
            match = DIGEST.fullmatch(str(layer.get("digest", "")))
            blob = root / "blobs" / f"sha256-{match.group(1)}" if match else None
            if blob is not None and blob.is_file():
                found.append(Found("ollama", f"{prefix}{model}:{tag}", blob, blob.stat().st_size))
    return found


def _files(store: str, root: Path, name_of) -> list[Found]:
    if not root.is_dir():
        return []
    return [Found(store, name_of(p), p, p.stat().st_size) for p in sorted(root.rglob("*.gguf")) if p.is_file()]


def _lmstudio() -> list[Found]:
    found = []
    for root in lmstudio_roots():
        found += _files("lm-studio", root, lambda p, root=root: str(p.relative_to(root)))
    return found


def _huggingface() -> list[Found]:
    root = huggingface_root()

    def name_of(path: Path) -> str:
        parts = path.relative_to(root).parts  # models--OWNER--NAME, snapshots, REV, ...
        repo = parts[0].removeprefix("models--").replace("--", "/")
        return f"{repo}/{'/'.join(parts[3:])}"

    return [f for f in _files("huggingface", root, name_of) if f.path.relative_to(root).parts[0].startswith("models--")]


def found() -> list[Found]:
    """Every GGUF file in the three stores, each described by its header."""
    from termchat.models.gguf_import import inspect

    results = _ollama() + _lmstudio() + _huggingface()
    for item in results:
        try:
            info = inspect(item.path)
        except UserError as exc:
            item.summary = str(exc).removeprefix(f"{item.path}: ")
            continue
        types = ", ".join(f"{k} x{n}" for k, n in sorted(info.types.items(), key=lambda kv: -kv[1]))
        count = f"{info.parameters / 1e9:.2f} B" if info.parameters >= 1e9 else f"{info.parameters / 1e6:.2g} M"
        item.summary = f"{info.architecture}, {count} parameters, {types}"
        item.convertible = True
    return results
