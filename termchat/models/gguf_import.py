"""Bring your own model: a GGUF file a user already has (from Ollama, LM Studio,
the Hugging Face cache, anywhere) becomes `termchat:NAME`, offline.

vLLM does not serve GGUF files on the CPU, so the file is converted once, as
the packaged default is (models.convert): dequantized by transformers' GGUF
loader into a float32 safetensors folder. float32 keeps the dequantized
weights exact, so the int4 format can take Q4_1's codes back without loss and
every other format is one rounding from the file's own numbers.

Everything is checked before anything is written (magic, truncation,
architecture, tensor types, disk and memory); what fails gets one line
(`UserError`, exit 2). The work goes into a hidden temporary folder renamed at
the end, so a failure, a full disk or Ctrl+C leaves nothing behind.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from termchat import models, paths
from termchat.errors import UserError

# Decoder-only text architectures transformers' GGUF loader reads and vLLM
# serves (transformers.modeling_gguf_pytorch_utils.GGUF_SUPPORTED_ARCHITECTURES,
# less the encoders and state-space models).
ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "phi3", "gemma2", "gemma3", "starcoder2", "stablelm", "nemotron", "falcon", "gpt2")
# Tensor types the conversion dequantizes (gguf.quants, which transformers uses).
TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
MAGIC = b"GGUF"


@dataclass
class GgufFile:
    path: Path
    architecture: str
    name: str  # general.name, or ""
    parameters: int
    types: dict[str, int] = field(default_factory=dict)  # tensor type -> tensors
    bytes: int = 0

    @property
    def float32_bytes(self) -> int:
        return self.parameters * 4


def _field(reader, key: str):
    from gguf import GGUFValueType

    f = reader.fields.get(key)
    if f is None or not f.data:
        return None
    value = f.parts[f.data[0]]
    if f.types and f.types[0] == GGUFValueType.STRING:
        return bytes(value).decode("utf-8", errors="replace")
    return value.tolist()[0] if hasattr(value, "tolist") else value


def inspect(path: str | Path) -> GgufFile:
    """Read a GGUF file's header and tensor table, and check that termchat can
    convert it: one UserError naming the file and what to do otherwise."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    size = path.stat().st_size
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror})") from None
    if head != MAGIC:
        raise UserError(f"{path}: not a GGUF file (it starts with {head!r}, a GGUF file with b'GGUF')")
    try:
        from gguf import GGUFReader
    except ImportError:
        raise UserError("reading GGUF files needs `gguf`: pip install -e '.[cpu]'") from None
    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # the reader's errors on a cut file: ValueError, IndexError, struct errors
        raise UserError(f"{path}: truncated or damaged GGUF file ({type(exc).__name__}: {str(exc)[:120]}); copy it again") from None
    architecture = _field(reader, "general.architecture")
    if not isinstance(architecture, str):
        raise UserError(f"{path}: the GGUF header names no architecture (general.architecture); it is not a model file termchat can convert")
    if architecture not in ARCHITECTURES:
        raise UserError(f"{path}: architecture '{architecture}' is not one termchat can convert (it converts {', '.join(ARCHITECTURES)})")
    info = GgufFile(path, architecture, _field(reader, "general.name") or "", 0, bytes=size)
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        if kind not in TYPES:
            raise UserError(f"{path}: tensor {tensor.name} is of type {kind}, which termchat cannot convert (it converts {', '.join(TYPES)}); pick a file of another quantization")
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > size or tensor.data.size * tensor.data.itemsize < int(tensor.n_bytes):
            raise UserError(f"{path}: truncated: tensor {tensor.name} ends at byte {end:,}, the file has {size:,}; copy it again")
        info.types[kind] = info.types.get(kind, 0) + 1
        info.parameters += int(tensor.n_elements)
    parts = _field(reader, "split.count")
    if isinstance(parts, int) and parts > 1:
        raise UserError(f"{path}: one part of a model split in {parts} files; merge them first (llama.cpp's `llama-gguf-split --merge FIRST-PART OUT.gguf`)")
    if not reader.tensors:
        raise UserError(f"{path}: the GGUF file holds no tensors (a vocabulary-only file?)")
    return info


def _check_room(info: GgufFile, folder: Path) -> None:
    """Disk for the float32 folder, and memory for transformers to hold it
    while it writes (about twice the folder)."""
    need = info.float32_bytes + (64 << 20)
    free = shutil.disk_usage(folder).free
    if free < need:
        raise UserError(f"{info.path}: converting needs {need / 1e9:.1f} GB in {folder}, which has {free / 1e9:.1f} GB free; free some space")
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return
    if available < 2 * info.float32_bytes:
        raise UserError(f"{info.path}: converting {info.parameters / 1e9:.1f} B parameters needs about {2 * info.float32_bytes / 1e9:.0f} GB of memory, {available / 1e9:.0f} GB is free")


def _existing(folder: Path) -> Path:
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def add(file: str | Path, name: str | None = None, quiet: bool = False) -> str:
    """Convert `file` into termchat:NAME (its stem by default); returns the name."""
    with models.gguf_read_once():  # the header parsed once for the checks and the conversion
        return _add(file, name, quiet)


def _add(file: str | Path, name: str | None, quiet: bool) -> str:
    info = inspect(file)
    short = (name or _default_name(info)).lower()
    full = f"termchat:{short}"
    if full in models.BUILTIN or short in {m.folder for m in models.BUILTIN.values()}:
        raise UserError(f"'{short}' is the packaged model's name; pick another with --name")
    target = models.folder(full)  # checks the name
    if target.exists():
        raise UserError(f"{full} exists already ({target}); remove it with `termchat models remove {short}` or pick another --name")
    _check_room(info, _existing(target.parent))
    paths.private_dir(target.parent)
    source = {"file": str(info.path.resolve()), "bytes": info.bytes, "architecture": info.architecture, "gguf_name": info.name, "types": info.types}
    try:
        models.convert(info.path, target, source, quiet=quiet)
    except OSError as exc:
        if exc.errno == 28:  # ENOSPC: the check above raced with something else writing
            raise UserError(f"the disk under {target.parent} filled up while converting; nothing was kept. Free {info.float32_bytes / 1e9:.1f} GB and run it again") from None
        raise UserError(f"converting {info.path} failed: {exc}; nothing was kept") from None
    return full


def _default_name(info: GgufFile) -> str:
    stem = info.path.name.removesuffix(".gguf")
    candidate = models.slug(stem)
    if not models.NAME.fullmatch(candidate or "-"):
        raise UserError(f"{info.path}: name it with --name NAME (its file name '{stem}' is not a model name)")
    return candidate


def remove(name: str) -> Path:
    """Delete an added model's folder (never the packaged one)."""
    full = name if name.startswith("termchat:") else f"termchat:{name}"
    if full in models.BUILTIN:
        raise UserError(f"{full} is the packaged model; it is not removed (delete {models.folder(full)} by hand if you must)")
    target = models.folder(full)
    if target.is_symlink() or not target.is_dir():
        raise UserError(f"no added model {full}; `termchat models list` shows them")
    shutil.rmtree(target)
    return target
