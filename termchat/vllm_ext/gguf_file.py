"""A GGUF file's header, read within limits: the one reader of GGUF files for
the engine's loader (ggml.py), `models add` and `models found`.

Everything in a header is a claim until checked: every count and length is
compared with the bytes that are left in the file before anything is
allocated, and with a limit of its own (LIMITS), so a 98-byte file that
declares an array of 2^62 items, or a header nested deep, is refused in one
line at once instead of growing memory or recursing. Numbers of a numeric
array are read in one piece (numpy), so a 2-million-item array takes
milliseconds, not gguf's reader's 20 s. Strings must be UTF-8, as the format
says. Tensors must be whole blocks of a known type, lie inside the file,
start at the file's alignment and not overlap.

Standard library and numpy only; nothing here imports the rest of termchat.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

MAGIC = b"GGUF"

# What a header may hold. Real files: a few hundred keys, vocabularies up to
# 262,144 tokens (Gemma) and about 500,000 merges, templates of tens of KB,
# a few thousand tensors (MoE models); these limits are 10x past them.
LIMITS = {
    "keys": 100_000,
    "tensors": 100_000,
    "array_items": 4_000_000,  # one array
    "all_items": 16_000_000,  # every array of the header together
    "string_bytes": 4 << 20,  # one string
    "array_depth": 2,  # an array of arrays at most
    "dims": 4,
}

# ggml type -> (name, values per block, bytes per block): ggml.h's enum and type sizes
TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}  # Q8_1 (9) and Q8_K (15) are ggml's activation formats, never stored
TYPE_IDS = {name: number for number, (name, _, _) in TYPES.items()}

# metadata value types: id -> (struct format, size); 8 is a string, 9 an array
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4), 6: ("<f", 4), 7: ("<?", 1),
            10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8"}
STRING, ARRAY = 8, 9


class GgufError(ValueError):
    """The file is not a GGUF header termchat reads; str() is one line."""


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]  # ggml's order: shape[0] is the row length
    type: int
    offset: int  # from the start of the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return TYPES[self.type][0]

    @property
    def rows(self) -> int:
        n = 1
        for d in self.shape[1:]:
            n *= d
        return n

    @property
    def row_bytes(self) -> int:
        _, block, size = TYPES[self.type]
        return self.shape[0] // block * size

    @property
    def elements(self) -> int:
        return self.shape[0] * self.rows


@dataclass
class Header:
    path: Path
    version: int
    metadata: dict = field(default_factory=dict)
    tensors: dict[str, Tensor] = field(default_factory=dict)
    data_start: int = 0
    size: int = 0
    identity: tuple = ()  # (device, inode, size, mtime_ns): the file as it was read

    def get(self, key: str, kind: type | tuple | None = None):
        """A metadata value, or None when absent or not of `kind` (bool is not an int)."""
        value = self.metadata.get(key)
        if kind is None or value is None:
            return value
        if isinstance(value, bool) and kind in (int, float, (int, float)):
            return None
        return value if isinstance(value, kind) else None

    @property
    def architecture(self) -> str | None:
        return self.get("general.architecture", str)


class _Cursor:
    def __init__(self, buf, size: int):
        self.buf, self.size, self.at = buf, size, 0
        self.items = 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.at + n > self.size:
            raise GgufError(f"{what} at byte {self.at:,} needs {n:,} bytes; the file has {self.size - self.at:,} left (cut short or damaged)")

    def unpack(self, fmt: str, size: int, what: str):
        self.need(size, what)
        value = struct.unpack_from(fmt, self.buf, self.at)[0]
        self.at += size
        return value

    def count(self, what: str, limit: int, item_bytes: int) -> int:
        n = self.unpack("<Q", 8, what)
        if n > limit:
            raise GgufError(f"{what} at byte {self.at - 8:,} is {n:,}, over termchat's limit of {limit:,}")
        self.need(n * item_bytes, what)  # each item takes at least this much: more than is left is a lie
        return n

    def string(self, what: str) -> str:
        n = self.count(f"{what} (a string's length)", LIMITS["string_bytes"], 1)
        raw = bytes(self.buf[self.at : self.at + n])
        self.at += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GgufError(f"{what} at byte {self.at - n:,} is not UTF-8 text (GGUF strings are UTF-8)") from None

    def value(self, kind: int, what: str, depth: int = 0):
        if kind in _SCALARS:
            fmt, size = _SCALARS[kind]
            return self.unpack(fmt, size, what)
        if kind == STRING:
            return self.string(what)
        if kind != ARRAY:
            raise GgufError(f"{what} at byte {self.at - 4:,} has value type {kind}, which GGUF does not define")
        if depth >= LIMITS["array_depth"]:
            raise GgufError(f"{what} at byte {self.at:,}: arrays nested more than {LIMITS['array_depth']} deep")
        item = self.unpack("<I", 4, f"{what} (its item type)")
        smallest = _SCALARS[item][1] if item in _SCALARS else 8 if item == STRING else 12 if item == ARRAY else 1
        n = self.count(f"{what} (its number of items)", LIMITS["array_items"], smallest)
        self.items += n
        if self.items > LIMITS["all_items"]:
            raise GgufError(f"{what}: the header's arrays hold over {LIMITS['all_items']:,} items in all, termchat's limit")
        if item in _NUMPY:
            import numpy as np

            values = np.frombuffer(self.buf, dtype=_NUMPY[item], count=n, offset=self.at).copy()
            self.at += n * smallest
            return values.astype(bool) if item == 7 else values
        return [self.value(item, f"{what}[{i}]", depth + 1) for i in range(n)]


def open_regular(path: Path) -> int:
    """A descriptor of a regular file at `path` (symlinks to one are the user's
    own: followed), opened without blocking on a FIFO; GgufError otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise GgufError(f"{path}: no such file") from None
    except OSError as exc:
        raise GgufError(f"{path}: cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise GgufError(f"{path}: not a regular file")
    return fd


def read(path: str | os.PathLike) -> Header:
    """The header of the GGUF file at `path`, checked (GgufError otherwise)."""
    path = Path(path)
    fd = open_regular(path)
    try:
        info = os.fstat(fd)
        size = info.st_size
        if size < 24:
            head = os.pread(fd, 4, 0)
            if head != MAGIC:
                raise GgufError(f"not a GGUF file (it starts with {head!r}, a GGUF file with b'GGUF')")
            raise GgufError(f"cut short: {size} bytes, less than a GGUF header")
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as buf:
            header = _parse(buf, size, path)
    except GgufError as exc:
        raise GgufError(f"{path}: {exc}") if not str(exc).startswith(str(path)) else exc from None
    finally:
        os.close(fd)
    header.identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    return header


def _parse(buf, size: int, path: Path) -> Header:
    cursor = _Cursor(buf, size)
    if bytes(buf[:4]) != MAGIC:
        raise GgufError(f"not a GGUF file (it starts with {bytes(buf[:4])!r}, a GGUF file with b'GGUF')")
    cursor.at = 4
    version = cursor.unpack("<I", 4, "the version")
    if version not in (2, 3):
        raise GgufError(f"GGUF version {version}; termchat reads versions 2 and 3")
    tensors = cursor.count("the tensor count", LIMITS["tensors"], 8 + 4 + 8 + 4 + 8)
    keys = cursor.count("the key count", LIMITS["keys"], 8 + 4)
    header = Header(path, version, size=size)
    for i in range(keys):
        key = cursor.string(f"key {i}")
        kind = cursor.unpack("<I", 4, f"{key}'s type")
        if key in header.metadata:
            raise GgufError(f"the key {key} appears twice")
        header.metadata[key] = cursor.value(kind, key)
    alignment = header.get("general.alignment", int) or 32
    if alignment <= 0 or alignment & (alignment - 1) or alignment > 1 << 20:
        raise GgufError(f"general.alignment {alignment} is not a power of two up to 1 MiB")
    infos = []
    for i in range(tensors):
        name = cursor.string(f"tensor {i}'s name")
        dims = cursor.unpack("<I", 4, f"tensor {name}'s number of dimensions")
        if not 1 <= dims <= LIMITS["dims"]:
            raise GgufError(f"tensor {name} has {dims} dimensions; ggml tensors have 1 to {LIMITS['dims']}")
        shape = tuple(cursor.unpack("<Q", 8, f"tensor {name}'s shape") for _ in range(dims))
        kind = cursor.unpack("<I", 4, f"tensor {name}'s type")
        offset = cursor.unpack("<Q", 8, f"tensor {name}'s offset")
        if kind not in TYPES:
            raise GgufError(f"tensor {name} has ggml type {kind}, which termchat does not know")
        type_name, block, type_size = TYPES[kind]
        if any(d == 0 or d > 1 << 40 for d in shape):
            raise GgufError(f"tensor {name} has shape {list(shape)}")
        if shape[0] % block:
            raise GgufError(f"tensor {name}: rows of {shape[0]} values are not whole {type_name} blocks of {block}")
        count = 1
        for d in shape:
            count *= d
        if name in header.tensors or any(t.name == name for t in infos):
            raise GgufError(f"the tensor {name} appears twice")
        infos.append(Tensor(name, shape, kind, offset, count // block * type_size))
    start = -(-cursor.at // alignment) * alignment
    header.data_start = start
    spans = []
    for t in infos:
        if t.offset % alignment:
            raise GgufError(f"tensor {t.name} starts at {t.offset:,}, not a multiple of the file's alignment {alignment}")
        t.offset += start
        if t.offset + t.nbytes > size:
            raise GgufError(f"cut short: tensor {t.name} ends at byte {t.offset + t.nbytes:,}, the file has {size:,}; copy it again")
        spans.append((t.offset, t.offset + t.nbytes, t.name))
        header.tensors[t.name] = t
    spans.sort()
    for (_, end, a), (begin, _, b) in zip(spans, spans[1:]):
        if begin < end:
            raise GgufError(f"tensors {a} and {b} overlap in the file")
    return header
