"""Quantized dense layers: GGUF weights kept in their own bits, batch-invariant products.

``QuantizedWeight`` holds an [n, k] weight repacked once from GGUF block bytes (or
quantized from fp32 at load) into the layout of the C++ kernels (``kernels.qformats``
defines it, ``kernels.qrepack`` writes it);
``qlinear(x, w)`` computes ``x @ W^T``. Activations are quantized per row to int8 in
blocks of 32 (``d = max|x| / 127``, round half to even), integer block dot products
are exact, and the float steps per output are fixed (csrc/qgemm/qkernels.h): so row m of the
result is bit-identical whatever the number of rows, the thread count, and the
instruction-set path (AVX-512 VNNI, AVX-512, AVX2, scalar).

A weight is one or more *segments* (consecutive row ranges), each homogeneous in
storage (4, 6 or 8 bits; MXFP4's codes), sub-block length and scale dtype. ``concat`` of
parts that agree on those becomes one segment (e.g. Gemma's Q5_0 q/k with its Q8_0 v);
parts that do not stay separate segments, computed by their own kernel call into their
output columns, so every row keeps its own format's bits and bytes (no 4-bit part is
widened).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from recallspec import _kernels
from recallspec.kernels import isa as _isa
from recallspec.kernels import qformats as qf
from recallspec.kernels import qrepack
from recallspec.kernels.ggml_types import GGMLType as T
from recallspec.kernels.ggml_types import known, to_gguf, type_name
from recallspec.kernels.threads import kernel_threads

_FLOAT_TYPES = (T.F32, T.F16, T.BF16)
FLOAT_KINDS = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")  # quantizable at load
_EMPTY_U8 = torch.empty(0, dtype=torch.uint8)
_SFMT = {torch.float32: qf.SFMT_F32, torch.float16: qf.SFMT_F16, torch.uint8: qf.SFMT_KS}
_EMPTY_I32 = torch.empty(0, dtype=torch.int32)


@dataclass(frozen=True, eq=False)
class Segment:
    """Rows [n_off, n_off + n) of a weight in the kernel layout (tensors never mutated)."""

    n_off: int
    n: int
    k: int
    sb: int
    bits: int  # storage: 4, 6 or 8 (qformats)
    kinds: tuple[str, ...]
    qs: torch.Tensor  # uint8, flat
    # float16 or float32 [G * k/sb * 16], uint8 K-quant tiles, or (lut) uint8 E8M0 bytes
    scale: torch.Tensor
    mins: torch.Tensor | None
    zero: torch.Tensor | None  # int32 [G * 16]
    # MXFP4's own storage (bits 4): its codes, read as u through the kernels' table, with
    # its E8M0 scale bytes (qformats.Canon.lut).
    lut: bool = False
    # The C++ view of the tensors, built once (it holds references to them).
    handle: _kernels.QSeg = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.lut and (self.bits != 4 or self.scale.dtype != torch.uint8
                         or self.mins is not None):
            raise ValueError("Segment: MXFP4's codes (lut) take 4-bit storage and E8M0 scale "
                             "bytes (uint8), no mins")
        mins = _EMPTY_U8 if self.mins is None else self.mins.view(torch.uint8)
        zero = _EMPTY_I32 if self.zero is None else self.zero
        handle = _kernels.QSeg(self.qs, self.scale.view(torch.uint8), mins, zero, self.n, self.k,
                               self.sb, self.bits, self.sfmt, self.lut)
        object.__setattr__(self, "handle", handle)

    @property
    def sfmt(self) -> int:
        """How scale and mins are stored (``qformats.SFMT_*``), told by the scale's dtype
        (MXFP4's codes come with their E8M0 bytes)."""
        return qf.SFMT_E8 if self.lut else _SFMT[self.scale.dtype]

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.qs, self.scale, self.mins, self.zero) if t is not None]

    def canon(self) -> qf.Canon:
        def arr(t: torch.Tensor | None) -> np.ndarray | None:
            return None if t is None else t.numpy()

        return qf.unpack(self.qs.numpy(), self.scale.numpy(), arr(self.mins), arr(self.zero),
                         self.n, self.k, self.sb, self.bits, self.lut)

    @staticmethod
    def build(c: qf.Canon, n_off: int, kinds: tuple[str, ...]) -> Segment:
        qs, scale, mins, zero = qf.pack(c)

        def t(a: np.ndarray | None) -> torch.Tensor | None:
            return None if a is None else torch.from_numpy(a)

        n, k = c.u.shape
        return Segment(n_off, n, k, c.sb, c.bits, kinds, torch.from_numpy(qs),
                       torch.from_numpy(scale), t(mins), t(zero), c.lut)

    @staticmethod
    def unstackable(run: Sequence[Segment]) -> str | None:
        """Why ``stack`` cannot join these segments (None: it can): a part other than
        the last ends inside a group of 16 rows (rows would move between groups), or
        K-quant tiles with and without mins (a tile has no -0.0 fill)."""
        if any(s.n % 16 for s in run[:-1]):
            return "a part other than the last ends inside a group"
        if run[0].sfmt == qf.SFMT_KS and len({s.mins is None for s in run}) > 1:
            return "K-quant tiles with and without mins"
        return None

    @staticmethod
    def stack(run: Sequence[Segment], n_off: int, kinds: tuple[str, ...]) -> Segment:
        """Segments of one storage (``lut`` too), sub-block length and scale dtype as one,
        when every one but the last fills its groups of 16 rows: then the packed arrays are
        the parts' arrays one after the other, exactly ``qf.pack(qf.concat(canons))``, with
        ``qf.concat``'s fill for a part without mins (-0.0 on its real rows; padding rows
        keep pack's 0.0) or without zero points (0)."""
        first = run[0]
        why = Segment.unstackable(run)
        if why:
            raise ValueError(f"stack: {why}")

        def mins(s: Segment) -> torch.Tensor:
            if s.mins is not None:
                return s.mins
            g, nsb = (s.n + 15) // 16, s.k // s.sb
            m = torch.full((g * 16, nsb), -0.0, dtype=s.scale.dtype)
            m[s.n:] = 0.0  # padding rows
            return m.reshape(g, 16, nsb).transpose(1, 2).reshape(-1)

        def zero(s: Segment) -> torch.Tensor:
            return s.zero if s.zero is not None else torch.zeros((s.n + 15) // 16 * 16,
                                                                 dtype=torch.int32)

        def cat(parts: list[torch.Tensor]) -> torch.Tensor:
            joined = _adjacent(parts)
            if joined is not None:  # parts written in place (``qrepack.repack(into=)``)
                return joined
            out = qrepack.zeros(sum(p.numel() for p in parts), parts[0].dtype)
            return torch.cat(parts, out=out)

        has_mins = any(s.mins is not None for s in run)
        has_zero = any(s.zero is not None for s in run)
        return Segment(
            n_off, sum(s.n for s in run), first.k, first.sb, first.bits, kinds,
            cat([s.qs for s in run]), cat([s.scale for s in run]),
            cat([mins(s) for s in run]) if has_mins else None,
            cat([zero(s) for s in run]) if has_zero else None, first.lut)


def _adjacent(parts: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """One view of flat contiguous tensors that lie one after another in one storage, in
    order (the concatenation, with no copy); None when they do not."""
    first = parts[0]
    base, at = first.untyped_storage().data_ptr(), first.data_ptr()
    for p in parts:
        if (p.dtype != first.dtype or p.dim() != 1 or not p.is_contiguous()
                or p.untyped_storage().data_ptr() != base or p.data_ptr() != at):
            return None
        at += p.numel() * p.element_size()
    return first.as_strided((sum(p.numel() for p in parts),), (1,))


# Loads store these in 6 bits where the kernel path reads 6-bit storage itself: scalar,
# AVX2 without VNNI (its byte products unpack a pair of chunks once for all the rows) and
# the VNNI paths (AVX-512 VNNI, AVX-VNNI and its EVEX form: each pair of chunks unpacked
# into the u8 layout's vectors once per block of rows, then their u8 product). Q6_K then
# takes its GGUF's 210 bytes per 256 weights of a row, not 274 (fewer bytes to stream
# where a product reads its weights from memory: decode and verification), and Q5_K 212,
# not 276. AMX keeps u8: its tiles read u8 and u4 only (6-bit storage there would take the
# VNNI product, not the tiles); AVX-512 without VNNI too, whose u8 product is its own
# (6-bit storage there would take AVX2's). Q5_0/Q5_1 (a K-quant file's fallback where a
# row length is no multiple of 256, as SmolLM2-360M's 960) too: in Gemma's QKV their q/k
# then form a 6-bit segment beside the Q8_0 v (QuantizedWeight.concat keeps segments of
# different storage apart). MXFP4 keeps its own storage on every path (its 4-bit codes
# and E8M0 bytes, the file's 17 bytes per 32 weights; every kernel reads the codes
# through its table).
_SIX_BIT = frozenset({T.Q5_0, T.Q5_1, T.Q5_K, T.Q6_K})
# The C++ codes (kernel_common.h): scalar, AVX2 without VNNI, AVX-512 VNNI, AVX-VNNI and
# AVX-VNNI as EVEX.
_READS_SIX_BITS = (0, 1, 3, 4, 5)


def default_bits(qtype: T) -> int:
    """The storage a load gives ``qtype`` on this path (``_SIX_BIT``), else its own."""
    if qtype in _SIX_BIT and _isa.code() in _READS_SIX_BITS:
        return 6
    return qf.LAYOUTS[qtype].bits


def storage_policy() -> dict[str, int]:
    """The storage (``default_bits``) a load on this path gives each type whose storage
    depends on the path: what a repack cache written here holds, so that a cache written
    under another policy (another path, or an older release's) is rebuilt rather than
    loaded at another path's storage (its bits would be the same, its bytes not)."""
    return {qt.name: default_bits(qt) for qt in sorted(_SIX_BIT)}


def _ggml_type(t: int) -> T:
    if not known(t):
        raise ValueError(f"GGUF type {type_name(t)} is not supported by the quantized kernels")
    return T(int(t))


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """An [n, k] weight in the quantized kernels' layout. Immutable after construction;
    holds torch uint8 / float16 / float32 / int32 tensors (no fp32 copy of W)."""

    n: int
    k: int
    kind: str  # GGUF type name, e.g. "Q4_1"; "Q5_0+Q8_0" for a mixed concat
    segments: tuple[Segment, ...]

    @classmethod
    def from_gguf(cls, raw: np.ndarray, ggml_type: int | T, n: int, k: int, *,
                  float_kind: str = "Q8_0") -> QuantizedWeight:
        """From a GGUF tensor's block bytes (``GGUFReader.tensors[i].data``: uint8 or the
        reader's typed view) of logical shape [n, k]. F32/F16/BF16 tensors are quantized
        to ``float_kind``; k must be a multiple of 32 (256 for K-quants)."""
        qtype = _ggml_type(ggml_type)
        if qtype in _FLOAT_TYPES:
            data = np.ascontiguousarray(raw).view(np.uint8).reshape(n, -1)
            from gguf import quants  # (the float path: a load that converts, not the cached one)

            w = np.ascontiguousarray(quants.dequantize(data, to_gguf(qtype))).reshape(n, k)
            return cls.from_float(torch.from_numpy(w), float_kind)
        rows = np.ascontiguousarray(raw).view(np.uint8).reshape(n, -1)
        return cls.from_gguf_rows(qtype, n, k, [(0, rows)])

    @classmethod
    def from_gguf_rows(cls, ggml_type: int | T, n: int, k: int,
                       chunks: Iterable[tuple[int, np.ndarray]], *,
                       bits: int | None = None,
                       into: tuple[qrepack.Packed, int, int] | None = None) -> QuantizedWeight:
        """From a quantized GGUF tensor's block bytes given as (first row, rows) chunks
        that cover its n rows (a loader reads a large tensor a piece at a time). Packed
        in C++ (``kernels.qrepack``), byte for byte ``qformats.pack(qformats.decode())``
        (``with_bits`` applied), in ``bits`` storage (default: ``default_bits``);
        ``into``: written into a fused matrix's arrays (``qrepack.repack``)."""
        qtype = _ggml_type(ggml_type)
        if qtype not in qf.BLOCKS:
            raise ValueError(f"GGUF type {qtype.name} is not supported by the quantized kernels")
        if k % qf.BLOCKS[qtype][0]:
            raise ValueError(f"{qtype.name}: row length {k} is not a multiple of "
                             f"{qf.BLOCKS[qtype][0]}")
        bits = default_bits(qtype) if bits is None else bits
        p = qrepack.repack(qtype, n, k, chunks, bits, into)
        _, lut = qf.storage_format(qtype, bits)
        seg = Segment(0, n, k, qf.LAYOUTS[qtype].sb, bits, (qtype.name,), p.qs, p.scale,
                      p.mins, p.zero, lut)
        return cls(n, k, qtype.name, (seg,))

    @classmethod
    def from_float(cls, w: torch.Tensor, kind: str = "Q8_0") -> QuantizedWeight:
        """Quantize an fp32 [n, k] weight (k a multiple of 32) to ``kind`` with
        ``gguf.quants`` (ggml's reference rounding), e.g. for safetensors models."""
        if kind not in FLOAT_KINDS:
            raise ValueError(f"from_float: kind must be one of {FLOAT_KINDS}, not {kind!r}")
        if w.ndim != 2 or w.shape[1] % 32:
            raise ValueError(f"from_float: need [n, k] with k % 32 == 0, got {tuple(w.shape)}")
        n, k = w.shape
        qtype = T[kind]
        from gguf import quants

        raw = quants.quantize(w.detach().to(torch.float32).contiguous().numpy(), to_gguf(qtype))
        return cls.from_gguf(raw, qtype, n, k)

    @staticmethod
    def concat(parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
        """Stack along n (fused QKV, gate-up). Consecutive segments with the same storage
        (``lut`` too), sub-block length and scale dtype merge into one; each row keeps its
        exact values, and its products are bit-identical to those of its own part."""
        if not parts:
            raise ValueError("concat: no parts")
        k = parts[0].k
        if any(p.k != k for p in parts):
            raise ValueError("concat: parts differ in k")
        segs = [s for p in parts for s in p.segments]
        runs: list[list[Segment]] = [[segs[0]]]
        for s in segs[1:]:
            last = runs[-1][-1]
            if (s.bits, s.lut, s.sb, s.scale.dtype) == (last.bits, last.lut, last.sb,
                                                        last.scale.dtype):
                runs[-1].append(s)
            else:
                runs.append([s])
        out: list[Segment] = []
        off = 0
        for run in runs:
            kinds = tuple(dict.fromkeys(kd for s in run for kd in s.kinds))
            if len(run) == 1:
                c = run[0]
                seg = Segment(off, c.n, k, c.sb, c.bits, kinds, c.qs, c.scale, c.mins, c.zero,
                              c.lut)
            elif Segment.unstackable(run) is None:
                seg = Segment.stack(run, off, kinds)
            else:  # through the canonical form (e.g. rows move between groups of 16)
                seg = Segment.build(qf.concat([s.canon() for s in run]), off, kinds)
            out.append(seg)
            off += seg.n
        kind = "+".join(dict.fromkeys(kd for s in out for kd in s.kinds))
        return QuantizedWeight(off, k, kind, tuple(out))

    def dequantize(self) -> torch.Tensor:
        """fp32 [n, k]; equal to ``gguf.quants.dequantize`` of the source bytes."""
        return self.rows(torch.arange(self.n))

    def rows(self, ids: torch.Tensor, *, threads: int | None = None) -> torch.Tensor:
        """fp32 [len(ids), k]: the dequantized rows ``ids`` (an embedding lookup)."""
        ids = ids.reshape(-1).to(torch.int64).contiguous()
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.n):
            raise IndexError(f"rows: ids out of range for a weight of {self.n} rows")
        out = torch.empty(len(ids), self.k, dtype=torch.float32)
        nthreads = kernel_threads() if threads is None else threads

        def fill(s: Segment, local: torch.Tensor, dst: torch.Tensor) -> None:
            _kernels.qrows(s.handle, local, dst, nthreads)

        if len(self.segments) == 1:
            fill(self.segments[0], ids, out)
            return out
        for s in self.segments:
            sel = (ids >= s.n_off) & (ids < s.n_off + s.n)
            dst = torch.empty(int(sel.sum()), self.k, dtype=torch.float32)
            fill(s, (ids[sel] - s.n_off).contiguous(), dst)
            out[sel] = dst
        return out

    def __repr__(self) -> str:
        return (f"QuantizedWeight({self.n}x{self.k}, {self.kind}, {len(self.segments)} "
                f"segment(s), {self.nbytes / 1e6:.2f} MB)")

    @property
    def nbytes(self) -> int:
        """Resident bytes of the packed tensors."""
        return sum(t.numel() * t.element_size() for s in self.segments for t in s.tensors())

    def state_dict(self, prefix: str) -> dict[str, torch.Tensor]:
        """Tensors to store (e.g. in one safetensors file) and ``from_state_dict`` back;
        they share memory with this weight."""
        d = {f"{prefix}meta": torch.tensor([self.n, self.k, len(self.segments)])}
        for i, s in enumerate(self.segments):
            p = f"{prefix}{i}."
            d[p + "meta"] = torch.tensor([s.n_off, s.n, s.sb, s.bits, int(s.lut)])
            d[p + "kinds"] = torch.tensor([int(T[kd]) for kd in s.kinds])
            d[p + "qs"], d[p + "scale"] = s.qs, s.scale
            if s.mins is not None:
                d[p + "mins"] = s.mins
            if s.zero is not None:
                d[p + "zero"] = s.zero
        return d

    @classmethod
    def from_state_dict(cls, tensors: Mapping[str, torch.Tensor], prefix: str) -> QuantizedWeight:
        n, k, count = (int(v) for v in tensors[f"{prefix}meta"].tolist())
        segs = []
        for i in range(count):
            p = f"{prefix}{i}."
            n_off, sn, sb, bits, lut = (int(v) for v in tensors[p + "meta"].tolist())
            kinds = tuple(T(int(v)).name for v in tensors[p + "kinds"].tolist())
            segs.append(Segment(n_off, sn, k, sb, bits, kinds, tensors[p + "qs"],
                                tensors[p + "scale"], tensors.get(p + "mins"),
                                tensors.get(p + "zero"), bool(lut)))
        kind = "+".join(dict.fromkeys(kd for s in segs for kd in s.kinds))
        return cls(n, k, kind, tuple(segs))


def qlinear(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None = None, *,
            threads: int | None = None, isa: str | None = None) -> torch.Tensor:
    """x fp32 [..., k] (CPU) -> fp32 [..., n] = x @ W^T (+ bias). Row-wise bit-identical
    for any number of rows, threads (default ``kernel_threads()``) and path (default
    ``kernels.isa.ISA``; tests may name any of ``kernels.isa.variants()``)."""
    if x.dtype != torch.float32 or not x.is_cpu:
        raise TypeError(f"qlinear: x must be a float32 CPU tensor, not {x.dtype} on {x.device}")
    if x.shape[-1] != w.k:
        raise ValueError(f"qlinear: x {tuple(x.shape)} does not match k = {w.k}")
    x2 = x if x.ndim == 2 and x.is_contiguous() else x.reshape(-1, w.k).contiguous()
    m = x2.shape[0]
    out = torch.empty(m, w.n, dtype=torch.float32)
    nthreads = kernel_threads() if threads is None else threads
    code = _isa.code(isa)
    # The kernel reads x and writes out through their addresses (C++ checks the sizes
    # against m, w.n, w.k; both are float32, contiguous and alive for the call).
    x_addr, out_addr = x2.data_ptr(), out.data_ptr()
    for s in w.segments:
        _kernels.qgemm(s.handle, x_addr, m, out_addr, w.n, s.n_off, nthreads, code)
    if bias is not None:
        out += bias
    return out if x.ndim == 2 else out.reshape(*x.shape[:-1], w.n)
