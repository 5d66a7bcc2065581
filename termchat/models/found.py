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

import os
import re
from dataclasses import dataclass
from pathlib import Path

from termchat import limits
from termchat.errors import UserError

OLLAMA_MODEL = "application/vnd.ollama.image.model"
DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")


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
    for manifest in limits.walk(manifests):
        try:
            data = limits.json_loads(limits.read_file(manifest, limits.MANIFEST_FILE, str(manifest), follow=False), str(manifest))
        except (OSError, ValueError):  # a link, a FIFO, too big, too deep, not JSON: not a manifest
            continue
        layers = data.get("layers", []) if isinstance(data, dict) else []
        parts = manifest.relative_to(manifests).parts  # HOST, NAMESPACE, MODEL, TAG
        if len(parts) < 3:
            continue
        host, *middle, model, tag = parts
        prefix = "" if (host, *middle) == ("registry.ollama.ai", "library") else "/".join((host, *middle)) + "/"
        for layer in layers[:64] if isinstance(layers, list) else []:
            if not isinstance(layer, dict) or layer.get("mediaType") != OLLAMA_MODEL:
                continue
            match = DIGEST.fullmatch(str(layer.get("digest", ""))[:80])
            blob = root / "blobs" / f"sha256-{match.group(1)}" if match else None
            if blob is not None and blob.is_file():
                found.append(Found("ollama", f"{prefix}{model}:{tag}", blob, blob.stat().st_size))
    return found


def _files(store: str, root: Path, name_of) -> list[Found]:
    if not root.is_dir():
        return []
    return [Found(store, name_of(p), p, p.stat().st_size) for p in limits.walk(root) if p.name.endswith(".gguf") and p.is_file()]


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


def _distinct(items: list[Found]) -> list[Found]:
    """One entry per file (device and inode): a blob named by ten manifests,
    or linked from two snapshots, is read and listed once, under its first name."""
    seen, kept = set(), []
    for item in items:
        try:
            info = item.path.stat()
        except OSError:
            continue
        if (info.st_dev, info.st_ino) in seen:
            continue
        seen.add((info.st_dev, info.st_ino))
        kept.append(item)
    return kept


def found() -> list[Found]:
    """Every GGUF file in the three stores, once each, described by its header."""
    from termchat.models.gguf_import import config_of, inspect

    results = _distinct(_ollama() + _lmstudio() + _huggingface())
    for item in results:
        try:
            info = inspect(item.path)
            config_of(info)  # the header-level checks of `models add` (not its read of every block)
        except UserError as exc:
            item.summary = str(exc).removeprefix(f"{item.path}: ")
            continue
        types = ", ".join(f"{k} x{n}" for k, n in sorted(info.types.items(), key=lambda kv: -kv[1]))
        count = f"{info.parameters / 1e9:.2f} B" if info.parameters >= 1e9 else f"{info.parameters / 1e6:.2g} M"
        item.summary = f"{info.architecture}, {count} parameters, {types}"
        item.convertible = True
    return results
