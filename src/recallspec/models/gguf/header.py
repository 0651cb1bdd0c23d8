"""A GGUF file's header as a weights load needs it: scalar metadata and the tensor directory.

``gguf.GGUFReader`` turns every metadata value into numpy views, one per string of the
tokenizer's vocabulary and merges: seconds for a 49k-token vocabulary, more for 128k-262k
ones, while loading the weights reads none of them. This reads the header with ``struct``
and steps over arrays by their lengths (a small fraction of that), decoding only the
arrays a caller names (the tokenizer's, when a GGUF is first converted).
The layout (GGUF versions 2 and 3, either byte order, as GGUFReader takes them):
magic, u32 version, u64 tensor count, u64 metadata count; each metadata entry a string
key, a u32 value type and the value (strings: u64 length + bytes; arrays: u32 element
type, u64 count, the elements); each tensor a string name, u32 dimension count, u64
dimensions (innermost first), u32 GGML type, u64 offset from the data start, which is
the end of the header rounded up to ``general.alignment`` (default 32).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recallspec.errors import ModelLoadError
from recallspec.kernels.ggml_types import GGMLType, block_size, known

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    name: str
    # A type a load reads, or the bare id of one it does not (named by
    # ``ggml_types.type_name``; its size came from gguf).
    ggml_type: GGMLType | int
    shape: tuple[int, ...]  # numpy order: rows first (GGUF lists the innermost first)
    offset: int  # of its first byte in the file
    n_bytes: int


@dataclass(frozen=True)
class Header:
    metadata: dict[str, int | float | bool | str]  # scalars and strings
    tensors: list[TensorInfo]
    # Arrays: the element count of each, and the values of those asked for (read_header's
    # ``arrays``: a vocabulary, its merges) as lists of str, int, float or bool.
    array_counts: dict[str, int] = field(default_factory=dict)
    arrays: dict[str, list[Any]] = field(default_factory=dict)


class _Cursor:
    """Reads values at a position of the header; any read past the end is a truncation."""

    def __init__(self, buf: mmap.mmap, order: str) -> None:
        self.buf, self.order, self.pos = buf, order, 0

    def take(self, fmt: str) -> Any:
        (v,) = struct.unpack_from(self.order + fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        return self.strings(1)[0]

    def array(self) -> list[Any]:
        """An array value, decoded (strings by ``strings``: a 128k vocabulary and its
        merges in well under a second, where numpy-memmap readers take seconds)."""
        etype, count = int(self.take("I")), int(self.take("Q"))
        if etype in _SCALARS:
            fmt = f"{self.order}{count}{_SCALARS[etype]}"
            values = list(struct.unpack_from(fmt, self.buf, self.pos))
            self.pos += struct.calcsize(fmt)
            return values
        if etype == _STRING:
            return self.strings(count)
        if etype == _ARRAY:
            return [self.array() for _ in range(count)]
        raise struct.error(f"unknown array element type {etype}")

    def strings(self, count: int) -> list[str]:
        """``count`` strings (each a u64 length and UTF-8 bytes, invalid ones replaced),
        in one loop over local names: a 128k vocabulary and its merges are ~400k strings."""
        u64 = struct.Struct(self.order + "Q").unpack_from
        buf, pos, end = self.buf, self.pos, len(self.buf)
        out: list[str] = []
        for _ in range(count):
            n = u64(buf, pos)[0]
            pos += 8
            if pos + n > end:
                raise struct.error("string past the end of the file")
            out.append(buf[pos:pos + n].decode("utf-8", errors="replace"))
            pos += n
        self.pos = pos
        return out

    def skip_array(self) -> int:
        """Step over an array value; its element count."""
        etype, count = int(self.take("I")), int(self.take("Q"))
        if etype in _SCALARS:
            self.pos += struct.calcsize(_SCALARS[etype]) * count
        elif etype == _STRING:  # step over each string by its length, never decoding it
            u64, pos = struct.Struct(self.order + "Q").unpack_from, self.pos
            for _ in range(count):
                pos += 8 + u64(self.buf, pos)[0]
            self.pos = pos
        elif etype == _ARRAY:
            for _ in range(count):
                self.skip_array()
        else:
            raise struct.error(f"unknown array element type {etype}")
        return count


def read_header(path: Path, arrays: Collection[str] = ()) -> Header:
    """The header of a GGUF file, with the values of the metadata arrays named in
    ``arrays`` (others are stepped over); ``ModelLoadError`` for anything that is not a
    complete, well-formed one (bad magic, an unknown version or value type, a truncated
    file)."""
    with path.open("rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            raise ModelLoadError(f"{path} is not a GGUF file (empty)") from None
    with buf:
        try:
            return _parse(buf, arrays)
        except (struct.error, ValueError, KeyError) as e:
            raise ModelLoadError(f"{path}: corrupt or truncated GGUF file ({e})") from None


def _parse(buf: mmap.mmap, arrays: Collection[str]) -> Header:
    if buf[:4] != b"GGUF":
        raise ValueError("bad magic")
    (version,) = struct.unpack_from("<I", buf, 4)
    order = "<" if version & 0xFFFF else ">"  # a file written on a big-endian machine
    c = _Cursor(buf, order)
    c.pos = 4
    version = int(c.take("I"))
    if version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {version}")
    n_tensors, n_kv = int(c.take("Q")), int(c.take("Q"))
    meta: dict[str, int | float | bool | str] = {}
    counts: dict[str, int] = {}
    values: dict[str, list[Any]] = {}
    for _ in range(n_kv):
        key, vtype = c.string(), int(c.take("I"))
        if vtype in _SCALARS:
            meta[key] = c.take(_SCALARS[vtype])
        elif vtype == _STRING:
            meta[key] = c.string()
        elif vtype == _ARRAY and key in arrays:
            values[key] = c.array()
            counts[key] = len(values[key])
        elif vtype == _ARRAY:
            counts[key] = c.skip_array()
        else:
            raise ValueError(f"unknown metadata value type {vtype} for {key!r}")
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        dims = [int(c.take("Q")) for _ in range(int(c.take("I")))]
        qtype = int(c.take("I"))
        infos.append((name, GGMLType(qtype) if known(qtype) else qtype, dims, int(c.take("Q"))))
    align = int(meta.get("general.alignment", 32))
    if align <= 0 or align & (align - 1):
        raise ValueError(f"alignment {align} is not a power of two")
    start = (c.pos + align - 1) // align * align
    tensors = []
    for name, qtype, dims, offset in infos:
        count = 1
        for d in dims:
            count *= d
        size = block_size(qtype)
        if size is None:
            raise ValueError(f"tensor {name} has unknown GGML type {qtype}")
        bs, ts = size
        n_bytes = count // bs * ts
        if start + offset + n_bytes > len(buf):
            raise ValueError(f"tensor {name} ends past the end of the file")
        tensors.append(TensorInfo(name, qtype, tuple(reversed(dims)), start + offset, n_bytes))
    return Header(meta, tensors, counts, values)
