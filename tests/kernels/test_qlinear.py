"""Quantized weights and kernels: exact formats, batch/thread/ISA invariance, accuracy."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from fractions import Fraction

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from helpers.qweight import FP16_BYTES, STORAGE_IDS, STORAGES, TYPES, random_raw
from safetensors.torch import load_file, save_file

from recallspec import _kernels
from recallspec.kernels import isa
from recallspec.kernels import qformats as qf
from recallspec.kernels.qlinear import QuantizedWeight, Segment, qlinear
from recallspec.models.gguf.header import read_header

VARIANTS = isa.variants()  # every path this CPU runs, incl. AVX-512 without VNNI
N, K = 37, 512  # 37: a partial last group of 16; 512: two K-quant super-blocks
U = 2.0**-24  # unit roundoff of fp32
# MXFP4 beside the types of helpers.qweight, in its own storage (its codes and E8M0
# bytes) and as its values in u8 and in 6 bits (fp32 scales).
ALL_TYPES = [*TYPES, T.MXFP4]
ALL_STORAGES = [*STORAGES, (T.MXFP4, 4), (T.MXFP4, 8), (T.MXFP4, 6)]
ALL_STORAGE_IDS = [*STORAGE_IDS, "MXFP4", "MXFP4-8bit", "MXFP4-6bit"]
SCALE_BYTES = {**FP16_BYTES, T.MXFP4: slice(0, 1)}  # a block's scale fields: kept by tests


def raw_of(qtype: T, n: int, k: int, seed: int = 0) -> np.ndarray:
    """GGUF block bytes of ``qtype``: helpers.qweight's, or for MXFP4 ggml's own quantizer
    (gguf-py) on blocks whose magnitudes span 2^-40..2^40."""
    if qtype != T.MXFP4:
        return random_raw(qtype, n, k, seed=seed)
    rng = np.random.default_rng(seed)
    mag = np.repeat(2.0 ** rng.integers(-40, 41, (n, k // 32)), 32, axis=1)
    return gguf.quants.quantize((rng.standard_normal((n, k)) * mag).astype(np.float32), T.MXFP4)


def bits(t: torch.Tensor) -> np.ndarray:
    """Bit patterns (tells -0.0 from 0.0 and compares NaN payloads)."""
    return t.contiguous().numpy().view(np.uint32)


def activations(m: int, k: int, seed: int = 1) -> torch.Tensor:
    """Rows of very different scales, a zero row and a row with one large outlier."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-3, 2, m).unsqueeze(1)
    x[min(3, m - 1)] = 0.0
    x[m // 2, 5] = 1e4
    return x


@pytest.fixture(scope="module")
def weights() -> dict[tuple[T, int], tuple[np.ndarray, QuantizedWeight]]:
    """Per (type, storage bits) of ``STORAGES``: the GGUF bytes and the weight."""
    out = {}
    for t, b in ALL_STORAGES:
        raw = raw_of(t, N, K, seed=ALL_TYPES.index(t))
        out[t, b] = (raw, QuantizedWeight.from_gguf_rows(t, N, K, [(0, raw)], bits=b))
    return out


def test_isa_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    # (ISA is a path, or avx512-amx where auto takes the AMX tiles.)
    assert isa.ISA in isa.variants() and isa.available_isas()[-1] == "scalar"
    assert f"kernels {isa.ISA} (" in isa.describe()
    for v in VARIANTS:
        assert isa.code(v) in range(7)
        assert isa._choose(v) == v  # a variant may be forced, for measurements
    with pytest.raises(isa.KernelIsaError, match=r"expected one of .* variant"):
        isa._choose("neon")
    monkeypatch.setattr(isa, "available_isas", lambda: ["scalar"])
    with pytest.raises(isa.KernelIsaError, match="cannot run it"):
        isa._choose("avx2")
    assert isa._choose("auto") == "scalar"


def test_forced_isa_at_import() -> None:
    code = "from recallspec.kernels import isa; print(isa.ISA)"
    env = {**os.environ, "RECALLSPEC_KERNELS": "scalar"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "scalar"
    env["RECALLSPEC_KERNELS"] = "sse9"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "KernelIsaError" in r.stderr


def test_mxfp4_loads_its_codes_on_every_path() -> None:
    """MXFP4 keeps its 4-bit codes whatever the path (6 bits would be 0.875 bytes a
    weight, u8 1.125, against the file's 0.53); Q8_0 and Q4_K keep their own storage."""
    code = ("from gguf import GGMLQuantizationType as T; "
            "from recallspec.kernels.qlinear import default_bits; "
            "print(default_bits(T.MXFP4), default_bits(T.Q8_0), default_bits(T.Q4_K))")
    for variant in isa.available_isas():
        env = {**os.environ, "RECALLSPEC_KERNELS": variant}
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, check=True)
        assert r.stdout.split() == ["4", "8", "4"], (variant, r.stdout)


def test_kernel_checks_its_arguments() -> None:
    x, out = torch.zeros(1, 32), torch.zeros(1, 16)
    e8, e32 = torch.zeros(0, dtype=torch.uint8), torch.zeros(0, dtype=torch.int32)
    qs, sc = torch.zeros(16 * 32, dtype=torch.uint8), torch.zeros(16 * 4, dtype=torch.uint8)
    seg = _kernels.QSeg(qs, sc, e8, e32, 16, 32, 32, 8, 0)
    with pytest.raises(ValueError, match="isa"):
        _kernels.qgemm(seg, x.data_ptr(), 1, out.data_ptr(), 16, 0, 1, 7)
    with pytest.raises(ValueError, match="n_off"):
        _kernels.qgemm(seg, x.data_ptr(), 1, out.data_ptr(), 16, 1, 1, 0)
    with pytest.raises(ValueError, match="do not match"):
        _kernels.QSeg(qs[:-1], sc, e8, e32, 16, 32, 32, 8, 0)
    with pytest.raises(ValueError, match="do not match"):  # 6-bit storage: 3/4 of the bytes
        _kernels.QSeg(qs, sc, e8, e32, 16, 32, 32, 6, 0)
    with pytest.raises(ValueError, match="4-bit storage needs sb = 32"):
        _kernels.QSeg(qs, sc, e8, e32, 16, 32, 16, 4, 0)
    with pytest.raises(ValueError, match="bits must be 4, 6 or 8"):
        _kernels.QSeg(qs, sc, e8, e32, 16, 32, 32, 5, 0)
    with pytest.raises(ValueError, match="scale format"):
        _kernels.QSeg(qs, sc, e8, e32, 16, 32, 32, 8, 4)
    with pytest.raises(ValueError, match="K-quant scales"):
        _kernels.QSeg(qs, sc, e8, e32, 16, 32, 32, 8, 2)
    # MXFP4's codes: u4 storage with one E8M0 byte per (row, sub-block), no mins.
    q4, s8 = qs[: 16 * 16], sc[:16]
    _kernels.QSeg(q4, s8, e8, e32, 16, 32, 32, 4, qf.SFMT_E8, True)
    with pytest.raises(ValueError, match="need 4-bit storage"):
        _kernels.QSeg(qs, s8, e8, e32, 16, 32, 32, 8, qf.SFMT_E8, True)
    with pytest.raises(ValueError, match="E8M0 scales take no mins"):
        _kernels.QSeg(q4, s8, s8, e32, 16, 32, 32, 4, qf.SFMT_E8, True)
    with pytest.raises(ValueError, match="do not match"):  # fp32-sized scales
        _kernels.QSeg(q4, sc, e8, e32, 16, 32, 32, 4, qf.SFMT_E8, True)


@pytest.mark.parametrize(("qtype", "nbits"), ALL_STORAGES, ids=ALL_STORAGE_IDS)
def test_dequantize_matches_gguf(weights: dict, qtype: T, nbits: int) -> None:
    raw, w = weights[qtype, nbits]
    # Exact, bit for bit: s and m are gguf's own factors (fp16 fields, or d*sc which is
    # exact in fp32), and w = s*(u-z) (+ m) rounds after the product and after the sum
    # exactly as gguf.quants computes d*q (+ m) / d*q - dm.
    ref = gguf.quants.dequantize(raw, qtype)
    assert np.array_equal(bits(w.dequantize()), ref.view(np.uint32))
    ids = torch.tensor([36, 0, 17, 17, 5])
    assert np.array_equal(bits(w.rows(ids)), ref[ids.numpy()].view(np.uint32))
    with pytest.raises(IndexError):
        w.rows(torch.tensor([N]))


# Blocks of 32 per row: the AVX-512 quantizer takes 16 blocks at a time while 6 or more
# are left and single blocks after: 3 (single blocks only), 18 (16 + 2 single), 22 (16 +
# a group of 6), 23 (an odd group of 7), 48 (three full groups).
@pytest.mark.parametrize("blocks", [3, 18, 22, 23, 48])
def test_activation_quantizer_is_exact_and_isa_free(blocks: int) -> None:
    k = 32 * blocks
    x = activations(9, k)
    x[1, 32:64] = 0.0  # a zero block inside a row (d = 0, no division)
    xn = x.numpy()
    blocks3 = xn.reshape(9, blocks, 32)
    d = (np.abs(blocks3).max(axis=2) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q_ref = np.rint(blocks3 * inv[..., None]).astype(np.int8).reshape(9, k)  # half to even
    for sb in (32, 16):
        for v in VARIANTS:
            q = torch.empty(9, k, dtype=torch.int8)
            dd, dxs = torch.empty(9, blocks), torch.empty(9, k // sb)
            xs = torch.empty(9, k // sb, dtype=torch.int32)
            _kernels.qquantize(x, q, dd, xs, dxs, sb, isa.code(v))
            assert np.array_equal(q.numpy(), q_ref) and np.array_equal(dd.numpy(), d), (v, sb)
            sums = q_ref.reshape(9, k // sb, sb).astype(np.int32).sum(axis=2)
            assert np.array_equal(xs.numpy(), sums), (v, sb)
            dsub = np.repeat(d, 32 // sb, axis=1)
            assert np.array_equal(dxs.numpy(), (dsub * sums.astype(np.float32)).astype(np.float32))


@pytest.mark.parametrize(("qtype", "nbits"), ALL_STORAGES, ids=ALL_STORAGE_IDS)
def test_batch_thread_and_isa_invariance(weights: dict, qtype: T, nbits: int) -> None:
    _, w = weights[qtype, nbits]
    x = activations(256, K)
    ref = qlinear(x, w, threads=1, isa=VARIANTS[0])
    for v in VARIANTS:
        full = qlinear(x, w, threads=2, isa=v)
        assert np.array_equal(bits(full), bits(ref)), f"{v} differs from {VARIANTS[0]}"
        # Every row count a kernel has its own code for (1 row; 2-32 rows in even passes
        # of at most 9 on VNNI; tiles of 64; AMX: 10-16 rows in one tile, 17-32 in two
        # of equal height whose last one repeats a row where the count is odd) and
        # counts that end in a partial tile.
        for bs in (*range(2, 18), 24, 31, 33, 64, 70):
            got = torch.cat([qlinear(x[i:i + bs], w, threads=1, isa=v) for i in range(0, 256, bs)])
            assert np.array_equal(bits(got), bits(ref)), f"{v}, batches of {bs}"
        rows = [0, 1, 3, 100, 128, 255] if v == "scalar" else range(256)
        for i in rows:
            assert np.array_equal(bits(qlinear(x[i:i + 1], w, isa=v)), bits(ref[i:i + 1]))


def test_six_bit_segments_take_the_byte_product(weights: dict) -> None:
    """QSeg finds u8 storage whose every u < 64 (Q5_*, Q6_K, MXFP4: the AVX2 path without VNNI
    multiplies it by vpmaddubsw, which the invariance tests above then run), as 6-bit
    storage is; Q8_0's q + 128 is not, and u4 storage (MXFP4's codes too) has its own
    product."""
    for (qtype, nbits), (_, w) in weights.items():
        (seg,) = w.segments
        six_bit = qtype in (T.Q5_0, T.Q5_1, T.Q5_K, T.Q6_K, T.MXFP4) and nbits != 4
        assert seg.handle.u6 == six_bit and seg.bits == nbits, qtype.name
    with pytest.raises(ValueError, match="zero points must fit int16"):
        seg = weights[T.Q8_0, 8][1].segments[0]
        _kernels.QSeg(seg.qs, seg.scale.view(torch.uint8), torch.empty(0, dtype=torch.uint8),
                      torch.full_like(seg.zero, 1 << 15), seg.n, seg.k, seg.sb, seg.bits, seg.sfmt)


def test_six_bit_storage_is_the_same_weight(weights: dict) -> None:
    """A type stored in 6 bits holds 3/4 of its u8 bytes, the same canonical values,
    and every path's products have the u8 storage's bits."""
    x = activations(33, K)
    for qtype in qf.BELOW_64:
        (s8,), (s6,) = weights[qtype, 8][1].segments, weights[qtype, 6][1].segments
        assert s6.qs.numel() * 4 == s8.qs.numel() * 3, qtype.name
        assert np.array_equal(s6.canon().u, s8.canon().u), qtype.name
        ref = qlinear(x, weights[qtype, 8][1], threads=1, isa="scalar")
        for v in VARIANTS:
            for rows in (1, 4, 33):
                got = torch.cat([qlinear(x[i:i + rows], weights[qtype, 6][1], threads=2, isa=v)
                                 for i in range(0, 33, rows)])
                assert np.array_equal(bits(got), bits(ref)), f"{qtype.name}, {v}, {rows} rows"


# The paths whose own VNNI product reads 6-bit storage (qdispatch.cpp; AMX's loads keep
# u8, and 6-bit storage there takes its VNNI product): whether this CPU runs each, and
# what it needs.
SIX_BIT_VNNI = {"avx512": (isa.HAS_VNNI, "AVX-512 VNNI"),
                "avx2": (isa.HAS_AVX_VNNI, "AVX-VNNI (its avx2 path has no VNNI)"),
                "avx2-vnni-evex": ("avx2-vnni-evex" in VARIANTS, "AVX2 and AVX-512 VNNI"),
                "avx512-amx": (isa.HAS_AMX, "AMX-INT8 tiles granted by the OS")}
# Row counts of every kind of pass: 1 row, VNNI row passes of 2-32 (one pass up to 9,
# then 2, 3 and 4 of them), tiles past 32, a second tile of 64 rows (100).
SIX_BIT_ROWS = (1, 2, 3, 5, 8, 9, 16, 17, 32, 33, 64, 100)


def synthetic_six_bit(sb: int, zero: bool, mins: bool, seed: int) -> tuple[QuantizedWeight, ...]:
    """A weight of u < 64 (0 and 63 among them) with fp16 scales, sub-blocks of sb and
    zero points and mins or not (combinations no GGUF type has: sub-blocks of 16 without
    zero points, 32 with both), in u8 and in 6-bit storage; N rows (a partial group)."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, 64, (N, K), dtype=np.uint8)
    u[0], u[1, ::2] = 63, 0
    scale = (rng.standard_normal((N, K // sb)) / 64).astype(np.float16)
    m = (rng.standard_normal((N, K // sb)) / 8).astype(np.float16) if mins else None
    z = rng.integers(0, 64, N).astype(np.int32) if zero else None
    c8 = qf.Canon(u, scale, m, z, sb, 8)
    return tuple(QuantizedWeight(N, K, "synthetic", (Segment.build(c, 0, ("synthetic",)),))
                 for c in (c8, qf.with_bits(c8, 6)))


@pytest.mark.parametrize("path", list(SIX_BIT_VNNI))
def test_six_bit_storage_on_the_vnni_paths(weights: dict, path: str) -> None:
    """Each VNNI path's own product of 6-bit storage (pairs of chunks unpacked to the u8
    layout's vectors) has, for every row count of SIX_BIT_ROWS and both thread counts, the
    bits of that path's u8 product and of the scalar one: Q5_0 (sub-blocks of 32, zero
    points), Q5_1 (mins), Q5_K (K-quant tiles with mins), Q6_K (sub-blocks of 16, zero
    points 32, tiles), MXFP4's values (fp32 scales, neither) and synthetic weights of
    both sub-block lengths with and without zero points and mins; 37 rows, so the last
    group of 16 is partial."""
    runs, needs = SIX_BIT_VNNI[path]
    if not runs:
        pytest.skip(f"this CPU ({isa.cpu_model()}) lacks {needs}")
    cases = {t.name: (weights[t, 8 if t == T.MXFP4 else qf.LAYOUTS[t].bits][1], weights[t, 6][1])
             for t in (T.Q5_0, T.Q5_1, T.Q5_K, T.Q6_K, T.MXFP4)}
    for sb in (32, 16):
        for zero in (False, True):
            for mins in (False, True):
                cases[f"sb {sb}, zero {zero}, mins {mins}"] = synthetic_six_bit(
                    sb, zero, mins, seed=sb + 2 * zero + mins)
    x = activations(100, K, seed=17)
    for name, (w8, w6) in cases.items():
        assert w8.segments[0].bits == 8 and w6.segments[0].bits == 6, name
        ref = qlinear(x, w8, threads=1, isa="scalar")
        assert np.array_equal(bits(qlinear(x, w8, threads=2, isa=path)), bits(ref)), name
        for threads in (1, 2):
            for rows in SIX_BIT_ROWS:
                got = torch.cat([qlinear(x[i:i + rows], w6, threads=threads, isa=path)
                                 for i in range(0, 100, rows)])
                assert np.array_equal(bits(got), bits(ref)), f"{name}, {threads}t, {rows} rows"


def test_loads_store_six_bits_where_the_path_reads_them() -> None:
    """Q5_0, Q5_1, Q5_K and Q6_K load in 6 bits on every path with a 6-bit product of its
    own (scalar, AVX2 without VNNI, the VNNI ones), in u8 on AVX-512 without VNNI and AMX
    (qlinear._READS_SIX_BITS); each variant this CPU runs, named at import."""
    code = ("from gguf import GGMLQuantizationType as T; "
            "from recallspec.kernels.qlinear import default_bits; "
            "print(*(default_bits(t) for t in (T.Q5_0, T.Q5_1, T.Q5_K, T.Q6_K)))")
    for variant in VARIANTS:
        env = {**os.environ, "RECALLSPEC_KERNELS": variant}
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, check=True)
        want = "8" if isa.code(variant) in (2, 6) else "6"  # kAvx512, kAvx512Amx
        assert r.stdout.split() == [want] * 4, (variant, r.stdout)


@pytest.mark.parametrize(("qtype", "nbits"), ALL_STORAGES, ids=ALL_STORAGE_IDS)
@pytest.mark.parametrize("fill", [0xFF, 0x80, 0x7F, 0x77, 0x00])
def test_extreme_operands(qtype: T, nbits: int, fill: int) -> None:
    """Every value byte set to one pattern (nibbles all 15, bytes 128, 127, 119 or 0)
    times activations all at +-127 after quantization: the largest integer sums each
    path's narrow accumulators meet (without VNNI the AVX2 u4 product adds a sub-block's
    8 pair sums in int16: 8 * 2 * 15 * 127 = 30480, its u6 product two chunks' pair sums
    of 6-bit values: 2 * 2 * 63 * 127 = 32004, and Q6_K's sub-block of 16 with its zero
    points folded in, bytes 0: 8 * 32 * 127 = 32512, as close to 2^15 as they get;
    MXFP4's codes 7, bytes 0x77, are u = 24 everywhere, whose sub-block of 8 pair sums
    per int16 lane, 8 * 2 * 24 * 127 = 48768, would not fit: those products widen after
    4). Any overflow or saturation would differ from the scalar path, which sums in int32."""
    bs, ts = gguf.GGML_QUANT_SIZES[qtype]
    raw = raw_of(qtype, 16, K, seed=7).reshape(16, K // bs, ts).copy()
    keep = raw[..., SCALE_BYTES[qtype]].copy()
    raw[...] = fill  # MXFP4: codes 15 (-12, u = 0), 8 and 0 (both 0), 7 (12, u = 24)
    raw[..., SCALE_BYTES[qtype]] = keep
    w = QuantizedWeight.from_gguf_rows(qtype, 16, K, [(0, raw.reshape(16, -1))], bits=nbits)
    x = torch.ones(4, K)
    x[1] = -1.0
    x[2, ::2] = -1.0  # alternating signs: pair sums of opposite terms
    x[3, : K // 2] = -1.0
    x = x.repeat(4, 1)  # 16 rows: one AMX tile where the CPU has AMX
    ref = qlinear(x, w, threads=1, isa="scalar")
    for v in VARIANTS:
        for rows in (1, 4, 16):  # the 1-row kernels and the multi-row ones
            got = torch.cat([qlinear(x[i:i + rows], w, threads=1, isa=v)
                             for i in range(0, 16, rows)])
            assert np.array_equal(bits(got), bits(ref)), f"{v}, {rows} rows"
    # The value itself where it is easy to state: nibbles 15 of Q4_0 (u - z = 7), all
    # q = 127 with d = 1/127: each output is sum_b s_b * (7 * 127 * 32) / 127. rtol:
    # K/32 = 16 fp32 roundings of terms of one sign, far below 1e-5.
    if qtype == T.Q4_0 and fill == 0xFF:
        s = torch.from_numpy(keep.view(np.float16).astype(np.float32))[..., 0]
        assert torch.allclose(ref[0], (s * (7 * 32)).sum(dim=1), rtol=1e-5)


# (type, storage bits) -> resident bytes per 256 weights of a row.
K_QUANT_BYTES = {(T.Q4_K, 4): 148, (T.Q5_K, 8): 276, (T.Q5_K, 6): 212, (T.Q6_K, 8): 274,
                 (T.Q6_K, 6): 210}


@pytest.mark.parametrize(("qtype", "nbits"), list(K_QUANT_BYTES),
                         ids=[f"{t.name}-{b}bit" for t, b in K_QUANT_BYTES])
def test_k_quant_tiles_keep_the_fp32_scale_bits(qtype: T, nbits: int) -> None:
    """K-quants store GGUF's d and integer sc (qformats.KScales) and the kernels form
    s = d * sc themselves: every product, on every path and row count, and every
    dequantized row must keep the bits of the fp32 scales stored before (the same
    canonical form packed with fp32 scale and min arrays), and the resident bytes per
    256 weights of a row drop to Q4_K 148 (GGUF 144; fp32 scales 192), Q6_K 274 (GGUF 210;
    fp32 320: its values one byte each; in 6-bit storage 210, the GGUF's own size)."""
    n = 48
    raw = random_raw(qtype, n, K, seed=11)
    tiles = QuantizedWeight.from_gguf_rows(qtype, n, K, [(0, raw)], bits=nbits)
    canon = dataclasses.replace(qf.with_bits(qf.decode(raw, qtype, n, K), nbits), ks=None)
    fp32 = QuantizedWeight(n, K, qtype.name, (Segment.build(canon, 0, (qtype.name,)),))
    assert tiles.segments[0].sfmt == qf.SFMT_KS and fp32.segments[0].sfmt == qf.SFMT_F32
    assert np.array_equal(bits(tiles.dequantize()), bits(fp32.dequantize()))
    x = activations(64, K, seed=5)
    for v in VARIANTS:
        ref = qlinear(x, fp32, threads=2, isa=v)
        for bs in (1, 2, 5, 8, 9, 16, 17, 33, 64):
            got = torch.cat([qlinear(x[i:i + bs], tiles, threads=1, isa=v)
                             for i in range(0, 64, bs)])
            assert np.array_equal(bits(got), bits(ref)), f"{v}, batches of {bs}"
    per_row_block = K_QUANT_BYTES[qtype, nbits]
    zero_bytes = 0 if tiles.segments[0].zero is None else 4 * n
    assert tiles.nbytes == n * (K // 256) * per_row_block + zero_bytes


def round_f32(v: Fraction) -> float:
    """The fp32 nearest the exact value v, ties to even (subnormals down to 2^-149; inf
    from 2^128 on, where round to nearest overflows), as a Python float."""
    if v == 0:
        return 0.0
    a = abs(v)
    e = a.numerator.bit_length() - a.denominator.bit_length()  # 2^(e-1) <= a < 2^(e+1)
    if a < Fraction(2) ** e:
        e -= 1  # now 2^e <= a < 2^(e+1)
    quantum = Fraction(2) ** max(e - 23, -149)
    r = round(a / quantum) * quantum  # Fraction.__round__: half to even
    out = math.inf if r >= 2**128 else float(r)
    return out if v > 0 else -out


def fma32(a: float, b: float, c: float) -> float:
    """fmaf(a, b, c) of fp32 operands: their exact a * b + c rounded once. a and b are
    finite here (scales and products of sums), so an infinite c stays as it is."""
    if not math.isfinite(c):
        return c
    return round_f32(Fraction(a) * Fraction(b) + Fraction(c))


def kernel_formula(c: qf.Canon, x: torch.Tensor) -> np.ndarray:
    """y = x @ W^T by qkernels.h's canonical arithmetic, from the canonical form c (the
    numpy decode, not the packed arrays): per output and sub-block b in order, the exact
    integer isum = sum u*q - z*xs, f = fp32(isum) * d rounded once, acc = fmaf(s, f, acc)
    (and fmaf(m, dxs, acc) with mins), from acc = +0. The activations come from the
    quantizer, whose exactness test_activation_quantizer_is_exact_and_isa_free checks."""
    m, k = x.shape
    n, sb = c.u.shape[0], c.sb
    nsb = k // sb
    q = torch.empty(m, k, dtype=torch.int8)
    d, dxs = torch.empty(m, k // 32), torch.empty(m, nsb)
    xs = torch.empty(m, nsb, dtype=torch.int32)
    _kernels.qquantize(x, q, d, xs, dxs, sb, 0)
    u = c.u.astype(np.int64).reshape(n, nsb, sb)
    isum = np.einsum("nbs,mbs->mnb", u, q.numpy().astype(np.int64).reshape(m, nsb, sb))
    if c.zero is not None:
        isum -= c.zero.astype(np.int64)[None, :, None] * xs.numpy().astype(np.int64)[:, None, :]
    assert np.abs(isum).max() < 2**24  # exact in int32 and as an fp32
    dsub = np.repeat(d.numpy(), 32 // sb, axis=1)  # each sub-block's block d
    f = (isum.astype(np.float32) * dsub[:, None, :]).astype(np.float32)
    s = c.scale.astype(np.float32).tolist()  # fp16 fields and fp32 scales: exact
    mins = None if c.mins is None else c.mins.astype(np.float32).tolist()
    fl, dl = f.tolist(), dxs.numpy().tolist()
    out = np.empty((m, n), np.float32)
    for i in range(m):
        for j in range(n):
            acc = 0.0
            for b in range(nsb):
                acc = fma32(s[j][b], fl[i][j][b], acc)
                if mins is not None:
                    acc = fma32(mins[j][b], dl[i][b], acc)
            out[i, j] = acc
    return out


@pytest.mark.parametrize(("qtype", "nbits"), ALL_STORAGES, ids=ALL_STORAGE_IDS)
def test_products_equal_the_kernel_formula(weights: dict, qtype: T, nbits: int) -> None:
    """Every path's product, bit for bit, is the canonical arithmetic computed exactly
    (integer sums, then the fp32 steps with one rounding each, emulated with rationals)
    on the numpy decode of the GGUF bytes: the kernels, the repack and the packed layout
    against the format's definition."""
    raw, w = weights[qtype, nbits]
    x = activations(6, K, seed=9)
    ref = kernel_formula(qf.decode(raw, qtype, N, K), x)
    for v in VARIANTS:
        for threads in (1, 2):
            got = qlinear(x, w, threads=threads, isa=v)
            assert np.array_equal(bits(got), ref.view(np.uint32)), f"{v}, {threads} threads"


def mxfp4_edges(n: int, k: int) -> np.ndarray:
    """MXFP4 bytes from gguf's quantizer with the E8M0 bytes set per band of 8 rows: the
    subnormal scales (e = 0, 1) with a few e = 2, e = 127 (s = 1/2) and its neighbours,
    the top (e = 253..255: products past the fp32 range, inf outputs), and every byte
    0..255 in turn."""
    raw = raw_of(T.MXFP4, n, k, seed=21).reshape(n, k // 32, 17).copy()
    bands = [np.array([0, 1, 0, 1, 2]), np.array([126, 127, 128]), np.array([253, 254, 255]),
             np.arange(256)]
    for r in range(n):
        band = bands[(r // 8) % len(bands)]
        raw[r, :, 0] = band[(np.arange(k // 32) + 5 * r) % len(band)]
    return raw.reshape(n, -1)


@pytest.mark.parametrize("nbits", [4, 8, 6])
def test_mxfp4_edge_exponents(nbits: int) -> None:
    """MXFP4 at its edge exponents (``mxfp4_edges``; activations down to 1e-3, so the
    subnormal scales give subnormal products and sums, which every path rounds as IEEE
    fmaf does, no flush to zero): gguf's values, the exact kernel formula on every path
    and thread count, and the same bits for any number of rows."""
    n = 32
    raw = mxfp4_edges(n, K)
    w = QuantizedWeight.from_gguf_rows(T.MXFP4, n, K, [(0, raw)], bits=nbits)
    with np.errstate(over="ignore"):
        deq = gguf.quants.dequantize(raw, T.MXFP4)
    assert np.array_equal(bits(w.dequantize()), deq.view(np.uint32))
    x = activations(40, K, seed=4)
    ref = kernel_formula(qf.decode(raw, T.MXFP4, n, K), x)
    tiny = ref[:, :8][ref[:, :8] != 0]
    assert (np.abs(tiny) < 2.0**-126).any() and np.isinf(ref[:, 16:24]).any()
    for v in VARIANTS:
        assert np.array_equal(bits(qlinear(x, w, threads=2, isa=v)), ref.view(np.uint32)), v
        for bs in (*range(1, 18), 33):
            got = torch.cat([qlinear(x[i:i + bs], w, threads=1, isa=v) for i in range(0, 40, bs)])
            assert np.array_equal(bits(got), ref.view(np.uint32)), f"{v}, batches of {bs}"


def test_mxfp4_codes_are_the_same_weight(weights: dict) -> None:
    """MXFP4 in its own storage (its 4-bit codes read through the kernels' table, its
    E8M0 bytes decoded to fp32; qkernels.h) against its values u in u8 and in 6 bits with
    fp32 scales: the same canonical form, and every product bit for bit the same on every
    path, for every row count 1..33 (the 1-row kernels, the VNNI passes of up to 9 rows,
    the tiles of 4 and 6, AMX's 10-32) and both thread counts, and the scalar u8 product's
    bits; the dequantized rows are the same too."""
    codes, u8, u6 = (weights[T.MXFP4, b][1] for b in (4, 8, 6))
    (sc,) = codes.segments
    assert sc.lut and sc.bits == 4 and sc.sfmt == qf.SFMT_E8 and sc.scale.dtype == torch.uint8
    c4, c8 = sc.canon(), u8.segments[0].canon()
    assert np.array_equal(c4.u, c8.u) and np.array_equal(c4.scale.view(np.uint32),
                                                         c8.scale.view(np.uint32))
    assert np.array_equal(bits(codes.dequantize()), bits(u8.dequantize()))
    x = activations(33, K, seed=13)
    ref = qlinear(x, u8, threads=1, isa="scalar")
    for v in VARIANTS:
        for threads in (1, 2):
            assert np.array_equal(bits(qlinear(x, u6, threads=threads, isa=v)), bits(ref)), v
            for rows in range(1, 34):
                got = torch.cat([qlinear(x[i:i + rows], codes, threads=threads, isa=v)
                                 for i in range(0, 33, rows)])
                assert np.array_equal(bits(got), bits(ref)), f"{v}, {threads} threads, {rows} rows"


def quantized_x(x: torch.Tensor) -> torch.Tensor:
    """The activations the kernel multiplies: q * d per block of 32, in float64."""
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.int8)
    d, dxs = torch.empty(m, k // 32), torch.empty(m, k // 32)
    xs = torch.empty(m, k // 32, dtype=torch.int32)
    _kernels.qquantize(x, q, d, xs, dxs, 32, 0)
    return (q.double().reshape(m, -1, 32) * d.double().unsqueeze(2)).reshape(m, k)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_accuracy_against_float64(weights: dict, qtype: T) -> None:
    _, w = weights[qtype, qf.LAYOUTS[qtype].bits]
    x = activations(16, K)
    got = qlinear(x, w).double()
    xq = quantized_x(x)
    ref = xq @ w.dequantize().double().T
    c = w.segments[0].canon()
    s = np.repeat(c.scale.astype(np.float64), c.sb, axis=1)
    z = 0 if c.zero is None else c.zero[:, None]
    mag = np.abs(s * (c.u.astype(np.float64) - z))
    if c.mins is not None:
        mag += np.abs(np.repeat(c.mins.astype(np.float64), c.sb, axis=1))
    # Error bound (first order in u = 2^-24): per sub-block the kernel rounds f =
    # isum*d once and each fma once (two fmas with mins; dxs rounded once), and every
    # term is bounded by sum_k (|s(u-z)| + |m|) |xq_k|; the fp32 dequantized reference
    # weights carry 2u relative error each. So |err| <= (fmas + 3) u A with
    # A = sum_k (|s(u-z)| + |m|) |xq_k|; 1% slack covers the second-order terms.
    fmas = (K // c.sb) * (2 if c.mins is not None else 1)
    bound = (fmas + 3) * U * (np.abs(xq.numpy()) @ mag.T) * 1.01
    err = (got - ref).abs().numpy()
    assert (err <= bound).all(), float((err / np.maximum(bound, 1e-300)).max())
    assert (got - ref).abs().max() > 0 or qtype == T.Q8_0  # not comparing a thing with itself


def test_concat_mixed_types(weights: dict) -> None:
    order = [(T.Q4_1, 4), (T.Q4_0, 4), (T.Q5_0, 8), (T.Q8_0, 8), (T.Q6_K, 8), (T.Q6_K, 6),
             (T.Q4_K, 4), (T.Q5_K, 8), (T.Q5_1, 8), (T.MXFP4, 8), (T.MXFP4, 6), (T.MXFP4, 4)]
    parts = [weights[t][1] for t in order]
    cat = QuantizedWeight.concat(parts)
    assert cat.n == N * len(order) and cat.kind == "+".join(dict.fromkeys(t.name for t, _ in order))
    # Q4_1+Q4_0 (u4, fp16) merge; Q5_0+Q8_0 (u8, fp16) merge; the rest stand alone (Q6_K
    # and MXFP4 in 8 and in 6 bits too; MXFP4's fp32 scales apart from Q5_1's fp16, and
    # its codes apart from its 6-bit values).
    assert len(cat.segments) == 10
    x = activations(9, K)
    for v in VARIANTS:
        sep = torch.cat([qlinear(x, p, isa=v) for p in parts], dim=1)
        assert np.array_equal(bits(qlinear(x, cat, isa=v)), bits(sep))
    deq = torch.cat([p.dequantize() for p in parts])
    assert np.array_equal(bits(cat.dequantize()), bits(deq))
    ids = torch.tensor([0, 40, 290, 77, 100, cat.n - 1, 150, 9 * N + 3])
    assert np.array_equal(bits(cat.rows(ids)), bits(deq[ids]))


def test_state_dict_roundtrip(weights: dict, tmp_path) -> None:
    cat = QuantizedWeight.concat([weights[T.Q4_1, 4][1], weights[T.Q5_0, 8][1],
                                  weights[T.Q6_K, 6][1], weights[T.MXFP4, 6][1],
                                  weights[T.MXFP4, 4][1]])
    path = tmp_path / "w.safetensors"
    save_file(cat.state_dict("layer.w."), str(path))
    back = QuantizedWeight.from_state_dict(load_file(str(path)), "layer.w.")
    assert (back.n, back.k, back.kind, back.nbytes) == (cat.n, cat.k, cat.kind, cat.nbytes)
    assert [s.bits for s in back.segments] == [s.bits for s in cat.segments] == [4, 8, 6, 6, 4]
    assert back.segments[3].sfmt == qf.SFMT_F32  # MXFP4's values' scales come back as fp32
    assert back.segments[4].lut and back.segments[4].sfmt == qf.SFMT_E8  # and its codes
    x = activations(5, K)
    assert np.array_equal(bits(qlinear(x, back)), bits(qlinear(x, cat)))


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_1", "Q4_0", "Q5_0", "Q5_1"])
def test_from_float(kind: str) -> None:
    w = torch.randn(40, 96, generator=torch.Generator().manual_seed(3))
    qw = QuantizedWeight.from_float(w, kind)
    ref = gguf.quants.dequantize(gguf.quants.quantize(w.numpy(), T[kind]), T[kind])
    assert qw.kind == kind and np.array_equal(bits(qw.dequantize()), ref.view(np.uint32))
    f32 = QuantizedWeight.from_gguf(w.numpy().view(np.uint8), T.F32, 40, 96, float_kind=kind)
    assert np.array_equal(bits(f32.dequantize()), bits(qw.dequantize()))
    # Sanity of the values: within one quantization step of the block's range (half a
    # step of rounding, plus the fp16 rounding of d and m: at most 127 * 2^-11 < 0.07
    # of a step for these level counts).
    blocks = w.reshape(40, 3, 32)
    levels = {"Q8_0": 127, "Q4_0": 8, "Q5_0": 16, "Q4_1": 15, "Q5_1": 31}[kind]
    with_min = kind in ("Q4_1", "Q5_1")
    span = blocks.amax(2) - blocks.amin(2) if with_min else blocks.abs().amax(2)
    err = (qw.dequantize() - w).abs().reshape(40, 3, 32).amax(2)
    assert (err <= span / levels).all()


def test_bias_shapes_and_errors(weights: dict) -> None:
    _, w = weights[T.Q4_1, 4]
    x = activations(6, K)
    b = torch.randn(N)
    assert torch.equal(qlinear(x, w, b), qlinear(x, w) + b)
    assert torch.equal(qlinear(x.reshape(2, 3, K), w).reshape(6, N), qlinear(x, w))
    assert qlinear(x[:0], w).shape == (0, N)
    with pytest.raises(TypeError):
        qlinear(x.double(), w)
    with pytest.raises(ValueError):
        qlinear(x[:, :64], w)
    with pytest.raises(ValueError):
        QuantizedWeight.from_float(torch.randn(4, 40))


def real_tensors(path, names: list[str], rows: int) -> list[tuple[str, np.ndarray, T, int]]:
    """The first ``rows`` rows of block bytes of tensors ``names``: (name, raw, type, k)."""
    infos = {t.name: t for t in read_header(path).tensors}
    data = np.memmap(path, dtype=np.uint8, mode="r")
    out = []
    for name in names:
        t = infos[name]
        row_bytes = t.n_bytes // t.shape[0]
        raw = np.array(data[t.offset:t.offset + rows * row_bytes]).reshape(rows, row_bytes)
        out.append((name, raw, t.ggml_type, t.shape[1]))
    return out


def check_real(path, names: list[str]) -> None:
    for name, raw, qtype, k in real_tensors(path, names, rows=200):
        w = QuantizedWeight.from_gguf(raw, qtype, len(raw), k)
        ref = gguf.quants.dequantize(raw, qtype)
        assert np.array_equal(bits(w.dequantize()), ref.view(np.uint32)), name
        x = torch.randn(64, k, generator=torch.Generator().manual_seed(7))
        full = qlinear(x, w, isa=VARIANTS[0])
        for v in VARIANTS[:-1]:  # scalar checked on a slice: it is slow on 64 rows
            assert np.array_equal(bits(qlinear(x, w, isa=v)), bits(full)), (name, v)
        assert np.array_equal(bits(qlinear(x[:3], w, isa="scalar")), bits(full[:3])), name
        for bs in (1, 7, 16):
            got = torch.cat([qlinear(x[i:i + bs], w) for i in range(0, 64, bs)])
            assert np.array_equal(bits(got), bits(full)), (name, bs)


def test_real_smollm2() -> None:
    from recallspec.models.loader import default_model_path

    check_real(default_model_path(), ["blk.0.attn_q.weight", "blk.3.ffn_down.weight",
                                      "token_embd.weight"])


def test_real_gemma3() -> None:
    from recallspec.models.loader import ModelLoadError, gemma3_path

    try:
        path = gemma3_path()
    except ModelLoadError as e:
        pytest.skip(str(e))
    check_real(path, ["blk.0.attn_q.weight", "blk.0.attn_v.weight",
                      "blk.0.attn_output.weight", "blk.0.ffn_down.weight"])
