"""GGUF block formats decoded to one canonical form, and the kernel's packed layout.

Canonical form of an [n, k] weight (``Canon``): every element is an unsigned integer u
(< 16 for 4-bit storage, < 64 for 6-bit, < 256 for 8-bit), with a scale s and optionally a min m per
(row, sub-block of ``sb`` = 32 or 16 along k) and an integer zero point z per row:
``w = s * (u - z) + m``. The GGUF formats map onto it exactly:

========  =======  ====  ==================  =====================  =====  ===========
type      storage  sb    s                   m                      z      s, m dtype
========  =======  ====  ==================  =====================  =====  ===========
Q4_0      u4       32    d                   -                      8      fp16
Q4_1      u4       32    d                   m                      0      fp16
Q5_0      u8       32    d                   -                      16     fp16
Q5_1      u8       32    d                   m                      0      fp16
Q8_0      u8       32    d                   -                      128    fp16
Q4_K      u4       32    d * sc              -(dmin * mn)           0      fp32
Q5_K      u8       32    d * sc              -(dmin * mn)           0      fp32
Q6_K      u8       16    d * sc              -                      32     fp32
MXFP4     codes    32    2^(e - 128)         -                      12     fp32 (E8M0)
========  =======  ====  ==================  =====================  =====  ===========

(Q8_0 stores q + 128.) d, dmin, m are the blocks' fp16 fields, kept as fp16 (exact).
MXFP4 (gpt-oss) stores per block of 32 an E8M0 byte e and 4-bit codes c; its value is
``kvalues[c] * 2^(e - 128)`` (ggml's ``GGML_E8M0_TO_FP32_HALF``: the e2m1 values doubled
to the integers ``MXFP4_KVALUES``, the scale halved to match). So u = kvalues[c] + 12 in
[0, 24] with z = 12 gives ``u - z = kvalues[c]`` exactly, and s is that power of two as
an fp32 (fp16 cannot hold 2^-128..2^127; e = 0, 1 are the fp32 subnormals 2^-128,
2^-127, and e = 255 is 2^127, not NaN, as ggml has it). The kvalues are not evenly
spaced, so u needs 5 bits; MXFP4's own storage (``lut``) keeps the file's 4-bit codes in
u4 storage, which the kernels read as u through a 16-entry table (``MXFP4_U``; code 8,
-0, is stored as 0: both u = 12), and its E8M0 bytes (``SFMT_E8``): 17 bytes per 32
weights of a row, the file's. In u8 or 6-bit storage (``with_bits``) it holds u itself
with s as fp32: the same u, z and s, so the same products, bit for bit. A power of two
times an integer of at most 4 bits is exact in fp32 down to 2^-149, so ``s * (u - z)`` is
gguf's ``d * kvalue`` bit for bit (both the same inf where it leaves the fp32 range, e >= 254).
For K-quants d * sc is a fp16 times a 6- or 8-bit integer, exact in fp32 (at most 19
significant bits), and is what ``gguf.quants`` multiplies by; the kernels keep the
factors (``KScales``: d and sc, and -dmin and mn) and form that product themselves. So
dequantizing
``s * (u - z) (+ m)`` with one rounding after the product and one after the sum gives
exactly ``gguf.quants.dequantize``'s floats (Q4_K's ``d*q - dm`` is ``d*q + (-dm)``).

Packed layout (``pack``; the C++ side documents it in csrc/qgemm/qkernels.h): rows in groups
of 16 (zero rows pad the last group), for each group and sub-block the 16 rows' u in
64-byte vectors of 4 consecutive k per row; u4 vectors carry chunk v in the low nibbles
and chunk v+4 in the high nibbles; 6-bit storage (``with_bits``: the types whose u are
below 64, Q5_*, Q6_K and MXFP4) keeps each pair of chunks (both halves of 8 rows: 4 vectors of
32 bytes) in 3 vectors, three of them in bits 0-5 and the fourth spread over their bits
6-7; MXFP4's codes in u4 storage in place of u; scales and mins [G][k/sb][16] (fp16,
MXFP4's E8M0 bytes, or fp32 with its values), or for K-quants tiles per (group,
super-block of 256) of the 16 rows' fp16 d and then their int8 sc [256/sb][16] (bytes,
``SFMT_KS``); z [G*16] int32.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from recallspec.kernels.ggml_types import BLOCK_SIZES
from recallspec.kernels.ggml_types import GGMLType as T

# block size in elements, bytes per block
BLOCKS: dict[T, tuple[int, int]] = {
    t: BLOCK_SIZES[t]
    for t in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4)
}


# How a segment stores scales and mins (csrc/qgemm/qkernels.h's SFmt): fp32 or fp16 per
# (row, sub-block), K-quant tiles of fp16 d and int8 sc (uint8 arrays), or MXFP4's E8M0
# bytes per (row, sub-block), s = 2^(e - 128) (uint8 arrays, with its codes only).
SFMT_F32, SFMT_F16, SFMT_KS, SFMT_E8 = 0, 1, 2, 3


@dataclass(frozen=True)
class Layout:
    """A GGUF type's row of the module docstring's table: sub-block, its own storage bits
    (4 or 8), how the packed segment stores its scales (``SFMT_F16``, for K-quants
    ``SFMT_KS``, for MXFP4 ``SFMT_E8``), whether it has mins, its zero point (0: none),
    and whether its own storage holds MXFP4's codes (``lut``)."""

    sb: int
    bits: int
    sfmt: int
    mins: bool
    zero: int
    lut: bool = False


# The table, once: ``decode`` takes sb, storage and z from it, ``qrepack`` sizes the
# packed arrays by it, ``qlinear`` names the kernel segment's formats from it.
LAYOUTS: dict[T, Layout] = {
    T.Q4_0: Layout(32, 4, SFMT_F16, False, 8), T.Q4_1: Layout(32, 4, SFMT_F16, True, 0),
    T.Q5_0: Layout(32, 8, SFMT_F16, False, 16),
    T.Q5_1: Layout(32, 8, SFMT_F16, True, 0),
    T.Q8_0: Layout(32, 8, SFMT_F16, False, 128),
    T.Q4_K: Layout(32, 4, SFMT_KS, True, 0), T.Q5_K: Layout(32, 8, SFMT_KS, True, 0),
    T.Q6_K: Layout(16, 8, SFMT_KS, False, 32),
    T.MXFP4: Layout(32, 4, SFMT_E8, False, 12, lut=True),
}
# The types whose u are all below 64: 6-bit storage holds them (``with_bits``).
BELOW_64 = frozenset({T.Q5_0, T.Q5_1, T.Q5_K, T.Q6_K, T.MXFP4})

# MXFP4's code table (ggml-common.h ``kvalues_mxfp4``: the e2m1 values doubled; bit 3 is
# the sign, code 8 is -0 and so 0), and u = kvalue + 12 per code (csrc/qgemm/qkernels.h's
# kE2M1U, the kernels' table); the code packed for each u (the first: 12 is code 0).
MXFP4_KVALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
MXFP4_ZERO = 12
MXFP4_U = (np.array(MXFP4_KVALUES, dtype=np.int16) + MXFP4_ZERO).astype(np.uint8)


def _code_of_u() -> np.ndarray:
    """u -> the lowest code with that u (255: none has it), uint8 [256]."""
    out = np.full(256, 255, np.uint8)
    for c in range(15, -1, -1):
        out[MXFP4_U[c]] = c
    return out


_MXFP4_CODE = _code_of_u()


def storages(qtype: T) -> tuple[int, ...]:
    """The storage bits ``qtype`` can be packed in: its own, 6 for ``BELOW_64``, and for
    MXFP4 also its values in u8 (``with_bits``)."""
    own = LAYOUTS[qtype].bits
    return (own, *((6,) if qtype in BELOW_64 else ()), *((8,) if qtype == T.MXFP4 else ()))


def storage_format(qtype: T, bits: int) -> tuple[int, bool]:
    """(scale format, lut) of ``qtype`` packed in ``bits`` (one of ``storages``): its own
    storage's, or for MXFP4's values in u8 or 6 bits fp32 scales without the table."""
    lay = LAYOUTS[qtype]
    if lay.lut and bits != lay.bits:
        return SFMT_F32, False
    return lay.sfmt, lay.lut


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """E8M0 bytes -> 2^(e - 128) as float32, bit for bit ggml's
    ``GGML_E8M0_TO_FP32_HALF``: exponent field e - 1 for e >= 2, the subnormals 2^-128
    (bits 0x00200000) and 2^-127 (0x00400000) for e = 0, 1; e = 255 is 2^127."""
    e32 = np.asarray(e, dtype=np.uint8).astype(np.uint32)
    bits = np.where(e32 < 2, np.uint32(0x00200000) << e32, (e32 - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(np.float32)


def e8m0_byte(s: np.ndarray) -> np.ndarray:
    """The inverse of ``e8m0_half``: float32 powers of two 2^-128..2^127 -> E8M0 bytes
    (ValueError for any other value)."""
    b = np.ascontiguousarray(s, dtype=np.float32).view(np.uint32)
    e = np.where(b == 0x00200000, 0, np.where(b == 0x00400000, 1, (b >> 23) + 1))
    e = np.clip(e, 0, 255).astype(np.uint8)
    if not np.array_equal(e8m0_half(e).view(np.uint32), b):
        raise ValueError("e8m0_byte: a scale is not a power of two 2^(e - 128)")
    return e


def storage_bytes(bits: int, sb: int) -> int:
    """Packed bytes of one (group of 16 rows, sub-block) in ``bits`` storage."""
    return {4: 8, 6: 12, 8: 16}[bits] * sb


def ks_tile_bytes(sb: int) -> int:
    """Bytes of one K-quant tile: 16 rows' fp16 d, then their int8 sc [256/sb][16]."""
    return 32 + 16 * (256 // sb)


@dataclass(frozen=True)
class KScales:
    """A K-quant weight's scales as GGUF stores them: s = float(d) * float(sc) per (row,
    sub-block), exactly ``Canon.scale``; with mins, m = float(dm) * float(mn), dm = -dmin."""

    d: np.ndarray  # float16 [n, k // 256]
    sc: np.ndarray  # int8 [n, k // sb]
    dm: np.ndarray | None  # float16 [n, k // 256]
    mn: np.ndarray | None  # int8 [n, k // sb]


@dataclass(frozen=True)
class Canon:
    """A weight in canonical form (see the module docstring). ``mins``/``zero`` are
    None when absent (m = 0 / z = 0 for every element). ``ks``: the factors of a
    K-quant's fp32 scale and mins, which ``pack`` stores instead of their products;
    ``lut``: MXFP4's codes and E8M0 bytes, which ``pack`` stores instead of u and s."""

    u: np.ndarray  # uint8 [n, k]
    scale: np.ndarray  # float16 or float32 [n, k // sb]
    mins: np.ndarray | None  # same dtype and shape as scale
    zero: np.ndarray | None  # int32 [n]
    sb: int
    bits: int  # storage: 4, 6 or 8
    ks: KScales | None = None
    # MXFP4's own storage (bits 4): u packed as their codes (MXFP4_U), s as E8M0 bytes.
    lut: bool = False


def _f16(b: np.ndarray) -> np.ndarray:
    """The fp16 field in the last axis (2 bytes) of b, as float16 [..]."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., L] bytes -> [..., 2L]: the L low nibbles, then the L high nibbles."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray, count: int) -> np.ndarray:
    """[..., 4] bytes holding a little-endian uint32 -> bit i for i < count, as uint8."""
    word = np.ascontiguousarray(qh).view("<u4")  # [..., 1]
    return ((word >> np.arange(count, dtype=np.uint32)) & 1).astype(np.uint8)


def _k_scales(sc12: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit scales and mins packed in a K-quant block's 12 bytes."""
    d, m, md = sc12[..., 0:4], sc12[..., 4:8], sc12[..., 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def decode(raw: np.ndarray, qtype: T, n: int, k: int) -> Canon:
    """GGUF block bytes of an [n, k] tensor (row-major, as a GGUFReader gives them) ->
    canonical form."""
    if qtype not in LAYOUTS:
        raise ValueError(f"no canonical form for GGUF type {qtype.name}")
    bs, ts = BLOCKS[qtype]
    if k % bs:
        raise ValueError(f"{qtype.name}: row length {k} is not a multiple of {bs}")
    b = np.ascontiguousarray(raw).view(np.uint8).reshape(n, k // bs, ts)
    lay = LAYOUTS[qtype]
    mins: np.ndarray | None = None
    ks: KScales | None = None
    if qtype in (T.Q4_0, T.Q4_1):
        off = 2 if qtype == T.Q4_0 else 4
        u = _nibbles(b[..., off:off + 16])
        scale = _f16(b[..., 0:2])
        if qtype == T.Q4_1:
            mins = _f16(b[..., 2:4])
    elif qtype in (T.Q5_0, T.Q5_1):
        off = 2 if qtype == T.Q5_0 else 4
        u = _nibbles(b[..., off + 4:off + 20]) | (_high_bits(b[..., off:off + 4], 32) << 4)
        scale = _f16(b[..., 0:2])
        if qtype == T.Q5_1:
            mins = _f16(b[..., 2:4])
    elif qtype == T.Q8_0:
        u, scale = b[..., 2:34] ^ np.uint8(0x80), _f16(b[..., 0:2])
    elif qtype in (T.Q4_K, T.Q5_K):
        d = _f16(b[..., 0:2]).astype(np.float32)[..., None]
        dmin = _f16(b[..., 2:4]).astype(np.float32)[..., None]
        sc, mn = _k_scales(b[..., 4:16])
        scale = d * sc.astype(np.float32)  # [n, nbk, 8]
        mins = -(dmin * mn.astype(np.float32))
        ks = KScales(_f16(b[..., 0:2]), sc.astype(np.int8).reshape(n, -1),
                     -_f16(b[..., 2:4]), mn.astype(np.int8).reshape(n, -1))
        off = 16 if qtype == T.Q4_K else 48
        # 4 runs of 32 bytes: low nibbles are sub-block 2c, high nibbles 2c+1
        ql = b[..., off:off + 128].reshape(n, k // bs, 4, 1, 32)
        u = np.concatenate([ql & 0x0F, ql >> 4], axis=-2).reshape(n, k // bs, 8, 32)
        if qtype == T.Q5_K:  # bit i of qh[l] is the 5th bit of sub-block i, element l
            qh = b[..., 16:48][..., None, :]
            u = u | (((qh >> np.arange(8, dtype=np.uint8)[:, None]) & 1) << 4)
    elif qtype == T.Q6_K:
        # two halves of 128: ql (64 bytes) low nibbles -> t < 64, high -> t >= 64;
        # qh (32 bytes) bits 2i..2i+1 -> t in [32i, 32i+32)
        ql = b[..., 0:128].reshape(n, k // bs, 2, 1, 64)
        low = np.concatenate([ql & 0x0F, ql >> 4], axis=-2).reshape(n, k // bs, 2, 128)
        qh = b[..., 128:192].reshape(n, k // bs, 2, 1, 32)
        shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
        high = ((qh >> shifts) & 3).reshape(n, k // bs, 2, 128)
        u = low | (high << 4)
        sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8)
        scale = _f16(b[..., 208:210]).astype(np.float32)[..., None] * sc.astype(np.float32)
        ks = KScales(_f16(b[..., 208:210]), sc.reshape(n, -1), None, None)
    elif qtype == T.MXFP4:  # e, then 16 bytes: byte j holds element j (low), j + 16 (high)
        u = MXFP4_U[_nibbles(b[..., 1:17])]
        scale = e8m0_half(b[..., 0])
    else:
        raise ValueError(f"no canonical form for GGUF type {qtype.name}")
    sb = lay.sb
    assert (mins is not None) == lay.mins  # the branch above and the table agree
    return Canon(
        u=np.ascontiguousarray(u, dtype=np.uint8).reshape(n, k),
        scale=np.ascontiguousarray(scale).reshape(n, k // sb),
        mins=None if mins is None else np.ascontiguousarray(mins).reshape(n, k // sb),
        zero=np.full(n, lay.zero, dtype=np.int32) if lay.zero else None,
        sb=sb,
        bits=lay.bits,
        ks=ks,
        lut=lay.lut,
    )


def with_bits(c: Canon, bits: int) -> Canon:
    """The same weight in ``bits`` storage: 6 for u8 storage whose every u is below 64,
    8 or 6 for MXFP4's codes (``lut``: u <= 24, s fp32), or its own storage (the
    products and values are the same numbers)."""
    if bits == c.bits:
        return c
    if c.lut and bits in (8, 6):
        return replace(c, bits=bits, lut=False)
    if bits != 6 or c.bits != 8 or (c.u.size and int(c.u.max()) >= 64):
        raise ValueError(f"with_bits: {c.bits}-bit storage cannot become {bits}-bit")
    return replace(c, bits=6)


def concat(parts: list[Canon]) -> Canon:
    """Stack canonical forms of the same storage (``lut`` too), sub-block and scale
    dtype along n.
    Absent mins become -0.0 and absent zero points 0: ``x + (-0.0) == x`` for every x
    and the kernel's accumulator is never -0.0, so both change no result bit."""
    first = parts[0]
    for p in parts:
        if (p.bits, p.lut, p.sb, p.scale.dtype) != (first.bits, first.lut, first.sb,
                                                    first.scale.dtype):
            raise ValueError("concat: parts differ in storage, sub-block or scale dtype")
    mins = None
    if any(p.mins is not None for p in parts):
        mins = np.concatenate([
            p.mins if p.mins is not None else np.full_like(p.scale, -0.0) for p in parts])
    zero = None
    if any(p.zero is not None for p in parts):
        zero = np.concatenate([
            p.zero if p.zero is not None else np.zeros(len(p.u), np.int32) for p in parts])
    ks = None
    if all(p.ks is not None for p in parts):
        kss = [p.ks for p in parts if p.ks is not None]

        def kcat(a: list[np.ndarray | None], fill: list[np.ndarray]) -> np.ndarray:
            return np.concatenate([x if x is not None else f for x, f in zip(a, fill, strict=True)])

        dm = mn = None
        if mins is not None:  # a part without mins: -0.0 = (-0.0) * 1, as concat's fill
            dm = kcat([q.dm for q in kss], [np.full_like(q.d, -0.0) for q in kss])
            mn = kcat([q.mn for q in kss], [np.ones_like(q.sc) for q in kss])
        ks = KScales(np.concatenate([q.d for q in kss]), np.concatenate([q.sc for q in kss]),
                     dm, mn)
    return Canon(np.concatenate([p.u for p in parts]), np.concatenate([p.scale for p in parts]),
                 mins, zero, first.sb, first.bits, ks, first.lut)


def _pad_rows(a: np.ndarray, rows: int) -> np.ndarray:
    if len(a) == rows:
        return a
    return np.concatenate([a, np.zeros((rows - len(a), *a.shape[1:]), a.dtype)])


def pack(c: Canon) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Canonical form -> (qs, scale, mins, zero) flat arrays in the kernel layout."""
    n, k = c.u.shape
    g, nsb = (n + 15) // 16, k // c.sb
    vals = c.u
    if c.lut:  # MXFP4's codes (padding rows: code 0, as the C++ repack leaves them)
        vals = _MXFP4_CODE[c.u]
        if (vals == 255).any():
            raise ValueError("pack: an MXFP4 u that no code has")
    u = _pad_rows(vals, 16 * g).reshape(g, 16, nsb, c.sb // 4, 4).transpose(0, 2, 3, 1, 4)
    if c.bits == 4:  # chunk v in the low nibble, chunk v+4 in the high one
        u = u[:, :, :4] | (u[:, :, 4:] << 4)
    elif c.bits == 6:  # [g, nsb, pair, e, half, 8 rows x 4]: (half, e) = (1, 1) spread
        u = u.reshape(g, nsb, c.sb // 8, 2, 2, 32)
        last = u[:, :, :, 1, 1]
        u = np.stack([u[:, :, :, 0, 0] | (last << 6), u[:, :, :, 1, 0] | ((last >> 2) << 6),
                      u[:, :, :, 0, 1] | ((last >> 4) << 6)], axis=3)

    def per_group(s: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(
            _pad_rows(s, 16 * g).reshape(g, 16, nsb).transpose(0, 2, 1)).reshape(-1)

    def tiles(d: np.ndarray, sc: np.ndarray) -> np.ndarray:
        ns, spb = k // 256, 256 // c.sb
        dt = _pad_rows(d, 16 * g).reshape(g, 16, ns).transpose(0, 2, 1)  # [g, ns, 16]
        st = _pad_rows(sc, 16 * g).reshape(g, 16, ns, spb).transpose(0, 2, 3, 1)
        return np.concatenate([
            np.ascontiguousarray(dt).view(np.uint8).reshape(g, ns, 32),
            np.ascontiguousarray(st).view(np.uint8).reshape(g, ns, 16 * spb)], axis=2).reshape(-1)

    if c.ks is not None:
        scale = tiles(c.ks.d, c.ks.sc)
        mins = None
        if c.mins is not None:
            assert c.ks.dm is not None and c.ks.mn is not None
            mins = tiles(c.ks.dm, c.ks.mn)
    else:
        scale = per_group(e8m0_byte(c.scale) if c.lut else c.scale)
        mins = None if c.mins is None else per_group(c.mins)
    return (
        np.ascontiguousarray(u).reshape(-1),
        scale,
        mins,
        None if c.zero is None else _pad_rows(c.zero, 16 * g),
    )


def unpack(qs: np.ndarray, scale: np.ndarray, mins: np.ndarray | None,
           zero: np.ndarray | None, n: int, k: int, sb: int, bits: int,
           lut: bool = False) -> Canon:
    """The inverse of ``pack`` (``lut``: MXFP4's codes and E8M0 bytes)."""
    g, nsb = (n + 15) // 16, k // sb
    if bits == 6:
        a, b, c = np.moveaxis(qs.reshape(g, nsb, sb // 8, 3, 32), 3, 0)
        last = (a >> 6) | ((b >> 6) << 2) | ((c >> 6) << 4)
        v = np.stack([np.stack([a & 0x3F, c & 0x3F], axis=3),  # e = 0: halves 0, 1
                      np.stack([b & 0x3F, last], axis=3)], axis=3)  # e = 1
        v = v.reshape(g, nsb, sb // 4, 16, 4)  # [.., pair, e] = chunk; [half, 8 x 4] = rows
    else:
        v = qs.reshape(g, nsb, -1, 16, 4)
    if bits == 4:
        v = np.concatenate([v & 0x0F, v >> 4], axis=2)

    u = np.ascontiguousarray(v.transpose(0, 3, 1, 2, 4)).reshape(16 * g, k)[:n]
    if lut:
        u = MXFP4_U[u]

    def rows(s: np.ndarray) -> np.ndarray:
        per_row = np.ascontiguousarray(s.reshape(g, nsb, 16).transpose(0, 2, 1))
        return per_row.reshape(16 * g, nsb)[:n]

    def factors(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ns, spb = k // 256, 256 // sb
        t = t.reshape(g, ns, ks_tile_bytes(sb))
        d = np.ascontiguousarray(t[..., :32]).view(np.float16)  # [g, ns, 16]
        f = np.ascontiguousarray(t[..., 32:]).view(np.int8).reshape(g, ns, spb, 16)
        return (np.ascontiguousarray(d.transpose(0, 2, 1)).reshape(16 * g, ns)[:n],
                np.ascontiguousarray(f.transpose(0, 3, 1, 2)).reshape(16 * g, nsb)[:n])

    z = None if zero is None else zero[:n].copy()
    if lut:
        return Canon(u, e8m0_half(rows(scale)), None, z, sb, bits, lut=True)
    if scale.dtype != np.uint8:
        return Canon(u, rows(scale), None if mins is None else rows(mins), z, sb, bits)
    d, sc = factors(scale)
    spb = 256 // sb

    def product(f16: np.ndarray, i8: np.ndarray) -> np.ndarray:
        return np.repeat(f16.astype(np.float32), spb, axis=1) * i8.astype(np.float32)

    dm = mn = None
    if mins is not None:
        dm, mn = factors(mins)
    return Canon(u, product(d, sc), None if dm is None or mn is None else product(dm, mn), z,
                 sb, bits, KScales(d, sc, dm, mn))
