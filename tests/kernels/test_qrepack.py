"""The C++ repack (kernels/qrepack.py) against the numpy reference (kernels/qformats.py):
the same packed arrays, byte for byte, for every GGUF type in each of its storages,
chunked or whole, and fused."""

from __future__ import annotations

import itertools

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from helpers.qweight import FP16_BYTES, STORAGE_IDS, STORAGES, TYPES, random_raw

from recallspec import _kernels
from recallspec.kernels import qformats as qf
from recallspec.kernels import qrepack
from recallspec.kernels.qlinear import QuantizedWeight, Segment, default_bits

# MXFP4 beside the types of helpers.qweight, in its own storage (its codes and E8M0
# bytes) and as its values in u8 and in 6 bits (fp32 scales).
ALL_TYPES = [*TYPES, T.MXFP4]
ALL_STORAGES = [*STORAGES, (T.MXFP4, 4), (T.MXFP4, 8), (T.MXFP4, 6)]
ALL_STORAGE_IDS = [*STORAGE_IDS, "MXFP4", "MXFP4-8bit", "MXFP4-6bit"]


def mxfp4_raw(n: int, k: int, seed: int = 0) -> np.ndarray:
    """MXFP4 block bytes from ggml's own quantizer (gguf-py), of blocks whose magnitudes
    span 2^-40..2^40 (exponent bytes about 85..167)."""
    rng = np.random.default_rng(seed)
    mag = np.repeat(2.0 ** rng.integers(-40, 41, (n, k // 32)), 32, axis=1)
    return gguf.quants.quantize((rng.standard_normal((n, k)) * mag).astype(np.float32), T.MXFP4)


def raw_of(qtype: T, n: int, k: int, seed: int = 0) -> np.ndarray:
    return mxfp4_raw(n, k, seed) if qtype == T.MXFP4 else random_raw(qtype, n, k, seed=seed)


def edge_exponents(raw: np.ndarray) -> np.ndarray:
    """MXFP4 bytes with every block's E8M0 byte replaced, block i of the tensor getting
    (i * 37) % 256 (the 512 blocks of 32 rows of 512 take every byte twice: 0 and 1, the
    subnormal scales, 127, 254 and 255, whose products leave the fp32 range)."""
    out = raw.reshape(len(raw), -1, 17).copy()
    count = out.shape[0] * out.shape[1]
    out[..., 0] = ((np.arange(count) * 37) % 256).astype(np.uint8).reshape(out.shape[:2])
    return out.reshape(len(raw), -1)


def reference(raw: np.ndarray, qtype: T, n: int, k: int, bits: int) -> Segment:
    """The packed segment of the numpy path: pack(with_bits(decode(raw)))."""
    with np.errstate(invalid="ignore"):  # inf * 0 in special_fields' scales
        return Segment.build(qf.with_bits(qf.decode(raw, qtype, n, k), bits), 0, (qtype.name,))


def as_bytes(t: torch.Tensor | None) -> bytes | None:
    return None if t is None else t.contiguous().view(torch.uint8).numpy().tobytes()


def assert_same(got: Segment, ref: Segment) -> None:
    fields = ("n", "k", "sb", "bits", "kinds", "lut")
    assert [getattr(got, f) for f in fields] == [getattr(ref, f) for f in fields]
    for name in ("qs", "scale", "mins", "zero"):
        a, b = getattr(got, name), getattr(ref, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.dtype == b.dtype and a.shape == b.shape, name
            assert as_bytes(a) == as_bytes(b), name


def special_fields(raw: np.ndarray, qtype: T) -> np.ndarray:
    """raw with its fp16 fields set to edge values in turn: +-0, subnormals, the largest
    finite, inf, quiet and signalling NaNs with payloads (the conversion to fp32 of
    K-quants' d and dmin must be exact; inf * 0 makes NaN scales too)."""
    ts = gguf.GGML_QUANT_SIZES[qtype][1]
    out = raw.reshape(len(raw), -1, ts).copy()
    edge = np.array([0x0000, 0x8000, 0x0001, 0x83FF, 0x0200, 0x7BFF, 0xFBFF, 0x7C00, 0x3C00,
                     0x7E01, 0xFC05],
                    dtype=np.uint16).view(np.uint8).reshape(-1, 2)
    at = FP16_BYTES[qtype]
    for i in range(0, at.stop - at.start, 2):
        field = slice(at.start + i, at.start + i + 2)
        blocks = out[..., field].reshape(-1, 2)
        blocks[:] = edge[(np.arange(len(blocks)) + i) % len(edge)]
        out[..., field] = blocks.reshape(out[..., field].shape)
    return out.reshape(len(raw), -1)


@pytest.mark.parametrize(("qtype", "bits"), ALL_STORAGES, ids=ALL_STORAGE_IDS)
@pytest.mark.parametrize("n", [1, 16, 37, 64])
def test_repack_equals_reference(qtype: T, bits: int, n: int) -> None:
    k = 512  # two K-quant super-blocks, 16 legacy blocks
    for seed, edges in ((n, False), (n + 100, True)):
        raw = raw_of(qtype, n, k, seed=seed)
        if edges:
            raw = edge_exponents(raw) if qtype == T.MXFP4 else special_fields(raw, qtype)
        w = QuantizedWeight.from_gguf_rows(qtype, n, k, [(0, raw)], bits=bits)
        assert w.kind == qtype.name and len(w.segments) == 1
        assert_same(w.segments[0], reference(raw, qtype, n, k, bits))


@pytest.mark.parametrize(("qtype", "bits"), ALL_STORAGES, ids=ALL_STORAGE_IDS)
def test_chunks_at_any_row_offset(qtype: T, bits: int) -> None:
    n, k = 45, 256
    raw = raw_of(qtype, n, k, seed=5)
    bounds = [0, 5, 21, 32, 33, 45]  # chunks inside groups, across them, of one row
    chunks = [(a, raw[a:b]) for a, b in itertools.pairwise(bounds)]
    w = QuantizedWeight.from_gguf_rows(qtype, n, k, reversed(chunks), bits=bits)
    assert_same(w.segments[0], reference(raw, qtype, n, k, bits))
    typed = raw.view(np.uint16) if raw.shape[1] % 2 == 0 else raw  # a reader's typed view
    assert_same(QuantizedWeight.from_gguf(typed, qtype, n, k).segments[0],
                reference(raw, qtype, n, k, default_bits(qtype)))


def test_layout_table_matches_decode() -> None:
    """``decode`` takes sb, storage and z from ``qformats.LAYOUTS`` (their values are
    checked by the dequantization tests); the table's scale format and mins must match
    what its branches produce."""
    for qtype in ALL_TYPES:
        c = qf.decode(raw_of(qtype, 3, 256), qtype, 3, 256)
        lay = qf.LAYOUTS[qtype]
        assert lay.mins == (c.mins is not None), qtype
        # K-quants: fp32 products of the KScales factors the tiles keep; MXFP4: its fp32
        # powers of two, stored as their E8M0 bytes with its codes (lut); else the dtype
        # the segment stores (fp16 fields)
        want = qf.SFMT_KS if c.ks is not None else qf.SFMT_E8 if c.lut else {
            np.float16: qf.SFMT_F16, np.float32: qf.SFMT_F32}[c.scale.dtype.type]
        assert c.scale.dtype == (np.float32 if c.ks is not None or c.lut else c.scale.dtype)
        assert lay.sfmt == want and lay.lut == c.lut == (qtype == T.MXFP4), qtype
        assert (qtype in qf.BELOW_64) == ((lay.bits == 8 or lay.lut) and int(c.u.max()) < 64)
        assert set(qf.storages(qtype)) == {b for t, b in ALL_STORAGES if t == qtype}, qtype
    assert set(qf.LAYOUTS) == set(qf.BLOCKS) == set(ALL_TYPES)


def reference_concat(parts: list[tuple[np.ndarray, T, int]], k: int) -> list[Segment]:
    """The fused segments of the numpy path: runs of one storage, sub-block and scale
    dtype, each qf.concat of the parts' canonical forms (in the storage a load gives
    them), packed."""
    canons = [(qf.with_bits(qf.decode(raw, t, n, k), default_bits(t)), t) for raw, t, n in parts]
    out: list[Segment] = []
    off = 0
    for _key, run in itertools.groupby(
            canons, key=lambda ct: (ct[0].bits, ct[0].lut, ct[0].sb, ct[0].scale.dtype)):
        items = list(run)
        kinds = tuple(dict.fromkeys(t.name for _, t in items))
        seg = Segment.build(qf.concat([c for c, _ in items]), off, kinds)
        out.append(seg)
        off += seg.n
    return out


# (types, rows): Llama's QKV (Q4_K, Q4_K, Q6_K) and gate-up, Gemma's Q5_0 q/k with Q8_0 v
# (zero points 16 and 128 in one segment), mins present in some parts only (Q4_0 with
# Q4_1, both orders), and parts ending inside a group of 16 (the fallback, and a last
# part's padding rows next to a mins-less part's -0.0 fill).
FUSED = [
    ([T.Q4_K, T.Q4_K, T.Q6_K], [64, 32, 32]),
    ([T.Q4_K, T.Q4_K], [48, 48]),
    ([T.Q5_0, T.Q5_0, T.Q8_0], [32, 16, 16]),
    ([T.Q4_0, T.Q4_1], [16, 21]),
    ([T.Q4_1, T.Q4_0], [32, 7]),
    ([T.Q4_1, T.Q4_0, T.Q4_1], [5, 16, 9]),
    ([T.Q6_K, T.Q6_K], [37, 40]),
    ([T.Q8_0, T.Q5_1, T.Q5_0], [16, 32, 3]),
    # gpt-oss's gate-up experts, and MXFP4 (its codes and E8M0 bytes) beside fp16-scale
    # parts: separate segments
    ([T.MXFP4, T.MXFP4], [48, 48]),
    ([T.MXFP4, T.MXFP4], [21, 16]),
    ([T.Q5_0, T.MXFP4, T.Q8_0], [16, 32, 5]),
]


@pytest.mark.parametrize(("types", "rows"), FUSED)
def test_concat_equals_reference(types: list[T], rows: list[int]) -> None:
    k = 256
    parts = [(raw_of(t, n, k, seed=i), t, n)
             for i, (t, n) in enumerate(zip(types, rows, strict=True))]
    cat = QuantizedWeight.concat([QuantizedWeight.from_gguf(r, t, n, k) for r, t, n in parts])
    ref = reference_concat(parts, k)
    assert len(cat.segments) == len(ref)
    for got, want in zip(cat.segments, ref, strict=True):
        assert got.n_off == want.n_off
        assert_same(got, want)


@pytest.mark.parametrize(("qtype", "bits"), ALL_STORAGES, ids=ALL_STORAGE_IDS)
def test_parts_written_in_place_equal_the_copy(qtype: T, bits: int) -> None:
    """Parts repacked into one weight's arrays (``repack(into=)``, as a load writes QKV
    and gate-up): each part is a view of its groups there, equal to the part repacked on
    its own; ``concat`` joins them with no copy, into the arrays of the whole, which
    equal the stacked copy byte for byte."""
    k, rows = 256, [32, 16, 21]  # the last ends inside a group
    raws = [raw_of(qtype, n, k, seed=i) for i, n in enumerate(rows)]
    total = sum(rows)
    arrays = qrepack.allocate(qtype, total, k, bits)
    parts, first = [], 0
    for raw, n in zip(raws, rows, strict=True):
        parts.append(QuantizedWeight.from_gguf_rows(qtype, n, k, [(0, raw)], bits=bits,
                                                    into=(arrays, total, first)))
        first += n
    alone = [QuantizedWeight.from_gguf_rows(qtype, n, k, [(0, raw)], bits=bits)
             for raw, n in zip(raws, rows, strict=True)]
    for got, want in zip(parts, alone, strict=True):
        assert_same(got.segments[0], want.segments[0])
    joined, copied = QuantizedWeight.concat(parts), QuantizedWeight.concat(alone)
    assert len(joined.segments) == len(copied.segments) == 1
    assert_same(joined.segments[0], copied.segments[0])
    for name in ("qs", "scale", "mins", "zero"):
        got, whole = getattr(joined.segments[0], name), getattr(arrays, name)
        assert (got is None) == (whole is None)
        if got is not None:  # the very arrays written: no copy
            assert got.data_ptr() == whole.data_ptr() and got.numel() == whole.numel()
    with pytest.raises(ValueError, match=r"rows \[8, 24\) do not start a group"):
        qrepack.repack(qtype, 16, k, [(0, raws[1])], bits, into=(arrays, total, 8))
    with pytest.raises(ValueError, match=r"rows \[64, 80\) do not start a group"):
        qrepack.repack(qtype, 16, k, [(0, raws[1])], bits, into=(arrays, total, 64))


def test_concat_copies_parts_not_side_by_side() -> None:
    """Views of one storage that are not one after another in order are copied."""
    k = 256
    arrays = qrepack.allocate(T.Q8_0, 32, k, 8)
    raws = [random_raw(T.Q8_0, 16, k, seed=i) for i in range(2)]
    a, b = (QuantizedWeight.from_gguf_rows(T.Q8_0, 16, k, [(0, r)], into=(arrays, 32, at))
            for r, at in zip(raws, (0, 16), strict=True))
    swapped = QuantizedWeight.concat([b, a])
    assert swapped.segments[0].qs.data_ptr() != arrays.qs.data_ptr()
    assert as_bytes(swapped.segments[0].qs) == as_bytes(torch.cat(
        [b.segments[0].qs, a.segments[0].qs]))


def test_errors() -> None:
    raw = random_raw(T.Q4_K, 4, 256)
    with pytest.raises(ValueError, match="not supported"):
        QuantizedWeight.from_gguf_rows(T.IQ2_XXS, 4, 256, [])
    with pytest.raises(ValueError, match="multiple of 256"):
        QuantizedWeight.from_gguf(raw, T.Q4_K, 4, 288)
    with pytest.raises(ValueError, match="chunks hold 3 rows"):
        QuantizedWeight.from_gguf_rows(T.Q4_K, 4, 256, [(0, raw[:3])])
    out = qrepack.allocate(T.Q4_K, 4, 256, 4)
    with pytest.raises(ValueError, match="row range"):
        qrepack.write_rows(out, T.Q4_K, 4, 256, 2, raw[:3], 4)
    with pytest.raises(ValueError, match="do not match"):
        qrepack.write_rows(out, T.Q6_K, 4, 256, 0, random_raw(T.Q6_K, 4, 256), 8)
    with pytest.raises(ValueError, match="do not match"):  # 6-bit arrays are smaller
        qrepack.write_rows(qrepack.allocate(T.Q6_K, 4, 256, 8), T.Q6_K, 4, 256, 0,
                           random_raw(T.Q6_K, 4, 256), 6)
    mins = out.mins.view(torch.uint8) if out.mins is not None else out.qs
    with pytest.raises(ValueError, match="unsupported"):
        _kernels.qrepack(raw, int(T.F16), 4, 256, 0, out.qs, out.scale.view(torch.uint8),
                         mins, torch.empty(0, dtype=torch.int32), 8)
    # 6 bits only for values below 64 (Q8_0's q + 128 and 4-bit storage are not); MXFP4
    # in its codes (4) or its values (8, 6), nothing else.
    for qtype, bits in ((T.Q4_K, 6), (T.Q4_K, 8), (T.Q8_0, 6), (T.Q6_K, 4), (T.MXFP4, 5)):
        with pytest.raises(ValueError, match=f"cannot be stored in {bits} bits"):
            QuantizedWeight.from_gguf_rows(qtype, 4, 256, [(0, raw_of(qtype, 4, 256))],
                                           bits=bits)
        with pytest.raises(ValueError, match="cannot be stored in that many bits"):
            _kernels.qrepack(raw_of(qtype, 4, 256), int(qtype), 4, 256, 0, out.qs,
                             out.scale.view(torch.uint8), mins,
                             torch.empty(0, dtype=torch.int32), bits)
    with pytest.raises(ValueError, match="cannot become 6-bit"):
        qf.with_bits(qf.decode(random_raw(T.Q8_0, 4, 256), T.Q8_0, 4, 256), 6)
    mx = qrepack.allocate(T.MXFP4, 4, 256, 6)
    assert mx.scale.dtype == torch.float32 and mx.mins is None and mx.zero is not None
    with pytest.raises(ValueError, match="do not match"):  # fp32 scales: 4 bytes each
        _kernels.qrepack(raw_of(T.MXFP4, 4, 256), int(T.MXFP4), 4, 256, 0, mx.qs,
                         mx.scale.view(torch.uint8)[: mx.scale.numel() * 2],
                         torch.empty(0, dtype=torch.uint8), mx.zero, 6)
    codes = qrepack.allocate(T.MXFP4, 4, 256, 4)
    assert codes.scale.dtype == torch.uint8 and codes.scale.numel() == 16 * 256 // 32
    with pytest.raises(ValueError, match="do not match"):  # its codes: one byte per scale
        _kernels.qrepack(raw_of(T.MXFP4, 4, 256), int(T.MXFP4), 4, 256, 0, codes.qs,
                         mx.scale.view(torch.uint8), torch.empty(0, dtype=torch.uint8),
                         codes.zero, 4)
    with pytest.raises(ValueError, match="not a power of two"):
        qf.e8m0_byte(np.array([1.0, 3.0], np.float32))
    with pytest.raises(ValueError, match="multiple of 32"):
        QuantizedWeight.from_gguf_rows(T.MXFP4, 4, 48, [])


def test_mxfp4_decodes_to_gguf_s_values() -> None:
    """Every MXFP4 code under every E8M0 byte: the canonical form's s * (u - z) (the
    numpy reference), the repacked weight's dequantized rows in both storages, and gguf's
    dequantize agree bit for bit (the infinities where e >= 254 included), with
    u - z = kvalues[code] and s = 2^(e - 128) exactly; and random data from gguf's own
    quantizer decodes to its dequantized values."""
    n, k = 32, 512  # 512 blocks: e = block index % 256, codes in all 16 x 16 nibble pairs
    blocks = np.zeros((n * k // 32, 17), np.uint8)
    blocks[:, 0] = np.arange(len(blocks)) % 256
    pairs = np.arange(256, dtype=np.uint8)  # byte value = (high code, low code)
    blocks[:, 1:] = pairs[(np.arange(len(blocks))[:, None] * 16 + np.arange(16)) % 256]
    kv = np.array(qf.MXFP4_KVALUES)
    for raw in (blocks.reshape(n, -1), mxfp4_raw(n, k, seed=3), edge_exponents(mxfp4_raw(n, k))):
        with np.errstate(over="ignore"):  # 12 * 2^127 and the like are inf in both
            ref = gguf.quants.dequantize(raw, T.MXFP4)
            c = qf.decode(raw, T.MXFP4, n, k)
            canon = np.repeat(c.scale, 32, axis=1) * (c.u.astype(np.float32) - qf.MXFP4_ZERO)
        assert c.scale.dtype == np.float32 and c.mins is None and c.sb == 32
        assert c.zero is not None and (c.zero == qf.MXFP4_ZERO).all() and int(c.u.max()) <= 24
        b = raw.reshape(n, k // 32, 17)
        assert np.array_equal(c.u.astype(int) - qf.MXFP4_ZERO,
                              kv[qf._nibbles(b[..., 1:]).reshape(n, k)])
        e = b[..., 0].astype(np.int64)
        assert np.array_equal(c.scale, np.ldexp(1.0, e - 128).astype(np.float32))
        assert np.array_equal(canon.view(np.uint32), ref.view(np.uint32))
        for bits in (4, 8, 6):
            w = QuantizedWeight.from_gguf_rows(T.MXFP4, n, k, [(0, raw)], bits=bits)
            assert w.kind == "MXFP4" and w.segments[0].sfmt == (
                qf.SFMT_E8 if bits == 4 else qf.SFMT_F32)
            assert np.array_equal(w.dequantize().numpy().view(np.uint32), ref.view(np.uint32))
        # The E8M0 bytes back from their fp32 powers of two, every byte.
        assert np.array_equal(qf.e8m0_byte(qf.e8m0_half(np.arange(256))), np.arange(256))


def test_mxfp4_resident_bytes() -> None:
    """Per 32 weights of a row: in its own storage (a load's, on every path) the 16 bytes
    of its codes and the E8M0 byte, GGUF's 17 (0.53 bytes per weight); as values, 24
    bytes in 6 bits (u8: 32) and a 4-byte fp32 scale (0.875, 1.125); plus the int32 zero
    point of each row: its own storage within 1.05x the file's bytes, 1.015x for rows of
    512, 1.003x for gpt-oss-20b's expert rows of 2880."""
    for n, k in ((48, 512), (32, 2880)):
        raw = mxfp4_raw(n, k)
        w = QuantizedWeight.from_gguf(raw, T.MXFP4, n, k)
        assert w.segments[0].bits == 4 and w.segments[0].lut
        assert w.nbytes == n * (k // 32) * 17 + 4 * n == raw.nbytes + 4 * n
        assert w.nbytes <= 1.05 * raw.nbytes
        if k == 512:
            for bits, per_block in ((6, 28), (8, 36)):
                w = QuantizedWeight.from_gguf_rows(T.MXFP4, n, k, [(0, raw)], bits=bits)
                assert w.nbytes == n * (k // 32) * per_block + 4 * n
