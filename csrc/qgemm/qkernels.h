// Quantized linear kernels: y[m, n] = sum_k w[n, k] * x[m, k] with w in a block format
// (GGUF's values, repacked) and x quantized per row to int8 blocks of 32.
//
// Weight layout of one segment (written by kernels/qlinear.py): output rows in groups
// of 16 (the last group padded with zero rows), sub-blocks of SB = 32 or 16 along K.
//   qs    [G][K/SB][SB/4][16][4] bytes (u8 storage): element (row 16g+r, k = b*SB+4c+j)
//         at qs[g][b][c][r][j], so one 64-byte vector holds 4 consecutive k of each of
//         the 16 rows in its 32-bit lane r (the vpdpbusd operand order);
//         u4 storage (SB = 32 only): [G][K/32][4][16][4] bytes, byte [g][b][v][r][j]
//         holding chunk v (k = 4v+j) in its low nibble and chunk v+4 in its high nibble;
//         6-bit storage (u < 64: Q5_*, Q6_K, MXFP4, where the Python side asks): per
//         (g, b) SB/8 pairs of chunks (2p, 2p+1), 96 bytes each, three 32-byte
//         vectors A, B, C whose byte t = 4*(r%8)+j (row 16g+8h+r%8, h = r/8) holds in
//         its bits 0-5 the u of (h 0, chunk 2p) in A, (h 0, chunk 2p+1) in B and (h 1,
//         chunk 2p) in C; the u of (h 1, chunk 2p+1) is spread over their bits 6-7
//         (bits 0-1 of it in A, 2-3 in B, 4-5 in C).
//         MXFP4 codes (QW::lut; u4 storage as above, 4-bit codes c in place of u): the
//         kernels read u = kE2M1U[c] right after unpacking the nibbles (a 16-byte table,
//         vpshufb on the SIMD paths), then multiply as for any u4 storage.
//   scale [G][K/SB][16] fp16 or fp32 (s; fp32 for MXFP4's 2^(e-128) in u8 or 6-bit
//         storage, which fp16 cannot hold), or with MXFP4's codes its E8M0 bytes e (kE8:
//         s = 2^(e-128), decoded exactly to those fp32 bits, e8m0_half_bits), mins the
//         same (never kE8) or absent (m),
//   zero  [G*16] int32 per row (z) or absent (all zero).
// An element is w = s * (u - z) + m. MXFP4 in codes and E8M0 bytes and MXFP4 in u and
// fp32 scales are the same u, z and s, so the same integer sums and float steps: the
// same bits (tests/kernels/test_qlinear.py compares them), at the file's 17 bytes per
// 32 weights of a row instead of 28 (6 bits) or 36 (u8).
// K-quant scales (SFmt kKS) keep GGUF's own factors instead of their fp32 products: per
// group and super-block of 256 along K, a tile of 16 fp16 d (32 bytes) then int8 sc
// [256/SB][16]; s of (row lane r, sub-block b) = float(d[r]) * float(sc[b % (256/SB)][r]).
// Mins the same, with d = -dmin and sc = the 6-bit min. An fp16 times an 8-bit integer
// has at most 19 significant bits, so that product is exact in fp32: the same s and m as
// the fp32 form, at 1.25 instead of 8 bytes per 16 lanes and sub-block (Q4_K 148 bytes
// per 256 weights of a row against GGUF's 144; the fp32 form took 192).
//
// Activation format (row-local, so the product is batch-invariant): per row and block
// of 32 along K, amax = max|x|, d = amax / 127, id = d ? 1/d : 0, q = nearbyint(x*id)
// (round half to even) as int8, xs = sum q over each weight sub-block, dxs = d * xs.
//
// Canonical arithmetic of every output (identical on every path, any M, any thread):
//   acc = 0; for each sub-block b in increasing order:
//     isum = sum u*q over the sub-block - z * xs   (exact in int32)
//     acc  = fmaf(s, (float)isum * d, acc)         (the product rounded, then one fma)
//     acc  = fmaf(m, dxs, acc)                      (only when the segment has mins)
// Integer sums are exact, so each path may add them in any order; the float sequence
// is fixed and runs one output per vector lane.
#pragma once

#include <cstdint>
#include <cstring>

namespace qk {

// How scales and mins are stored (the Python side's Segment.sfmt).
enum SFmt : int { kF32 = 0, kF16 = 1, kKS = 2, kE8 = 3 };

// u of each MXFP4 code (ggml-common.h's kvalues_mxfp4, the e2m1 values doubled, + 12;
// kernels/qformats.py's MXFP4_KVALUES and MXFP4_ZERO): all <= 24, code 8 (-0) is 12.
alignas(16) inline constexpr uint8_t kE2M1U[16] = {12, 13, 14, 15, 16, 18, 20, 24,
                                                   12, 11, 10, 9, 8, 6, 4, 0};

// The nibble forms of u4 storage, a template argument of the SIMD kernels: none (u8 or
// 6-bit values), values u, or MXFP4 codes read through kE2M1U (QW::lut).
enum Nib : int { kNoNib = 0, kNibU = 1, kNibCodes = 2 };
// The VNNI kernels' one more storage form in that argument: 6-bit storage (QW::p6),
// unpacked into the u8 layout's vectors a pair of chunks at a time.
constexpr int kSix = 3;
static constexpr bool is_nib(int storage) { return storage == kNibU || storage == kNibCodes; }

// fp32 bits of 2^(e - 128) for an E8M0 byte, ggml's GGML_E8M0_TO_FP32_HALF: exponent
// field e - 1, or for e < 2 the subnormals 2^-128, 2^-127 (mantissa bit 21 or 22);
// e = 255 is 2^127, not NaN. (static: each translation unit keeps its own copy.)
static inline uint32_t e8m0_half_bits(uint32_t e) { return e < 2 ? 0x00200000u << e : (e - 1) << 23; }
static inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e8m0_half_bits(e);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Bytes of one kKS tile (16 fp16 d, then int8 sc [256/sb][16]); qformats.ks_tile_bytes.
constexpr int64_t ks_tile_bytes(int sb) { return 32 + 16 * (256 / sb); }

struct QW {
  const uint8_t* qs;
  const void* scale;
  const void* mins;      // nullptr: no mins
  const int32_t* zero;   // nullptr: z = 0 for every row
  int64_t n, k, groups;  // real output rows, K, G = ceil(n / 16)
  int sb;                // 32 or 16
  bool u4;               // nibble storage
  bool lut = false;      // u4 storage of MXFP4 codes: u = kE2M1U[nibble]
  bool p6 = false;       // 6-bit storage (every u < 64, so u6 too)
  bool u6 = false;       // every u < 64 (6-bit storage, or u8 where QSeg finds it): byte products fit vpmaddubsw
  int sfmt;              // SFmt of scale and mins
  int64_t nsb() const { return k / sb; }
  int64_t sb_bytes() const { return u4 ? 8 * sb : p6 ? 12 * sb : 16 * sb; }  // qs bytes per (group, b)
  // Bytes of the scale (or mins) array of a segment.
  int64_t scale_bytes() const {
    if (sfmt == kKS) return groups * (k / 256) * ks_tile_bytes(sb);
    return groups * nsb() * 16 * (sfmt == kF16 ? 2 : sfmt == kE8 ? 1 : 4);
  }
};

// kKS offsets for sub-block length SB (a template argument, so that the kernels' inner
// loops divide by constants): the bytes of one (group, super-block) tile, and where the
// 16 lanes' d and sc of (group g, sub-block b) start in the array.
template <int SB>
struct KS {
  static constexpr int64_t kSpb = 256 / SB, kTile = ks_tile_bytes(SB);
  static int64_t d(const QW& w, int64_t g, int64_t b) { return (g * (w.k / 256) + b / kSpb) * kTile; }
  static int64_t sc(const QW& w, int64_t g, int64_t b) { return d(w, g, b) + 32 + 16 * (b % kSpb); }
};

// Quantized activations of M rows; xs and dxs are per weight sub-block (sb of the QW).
struct QX {
  const int8_t* q;     // [M][K]
  const int16_t* qw;   // [M][K]: per 4 values (q0, q2, q1, q3) as int16 (vpmaddwd paths)
  const float* d;      // [M][K/32]
  const int32_t* xs;   // [M][K/sb]
  const float* dxs;    // [M][K/sb]
  int64_t m, k;
  int sb;
};

struct QXBuf {
  int8_t* q;
  int16_t* qw;  // nullptr: not needed by the path
  float* d;
  int32_t* xs;
  float* dxs;
};

// The per-block outputs of the activation quantizer: d, and xs and dxs per weight
// sub-block from the sums of the two 16-value halves (added when SB = 32). static: each
// translation unit (compiled for its own instruction set) keeps its own copy.
static inline void store_block(const QXBuf& buf, int64_t m, int64_t k, int sb, int64_t b,
                               float d, const int32_t half[2]) {
  buf.d[m * (k / 32) + b] = d;
  const int64_t nsb = k / sb;
  if (sb == 32) {
    const int32_t s = half[0] + half[1];
    buf.xs[m * nsb + b] = s;
    buf.dxs[m * nsb + b] = d * float(s);
  } else {
    for (int h = 0; h < 2; ++h) {
      buf.xs[m * nsb + 2 * b + h] = half[h];
      buf.dxs[m * nsb + 2 * b + h] = d * float(half[h]);
    }
  }
}

// Rows [m0, m1) of x ([M][K], row stride ldx) into buf; all three give the same values.
void quantize_scalar(const float* x, int64_t ldx, int64_t k, int sb, int64_t m0, int64_t m1,
                     const QXBuf& buf);
void quantize_avx2(const float* x, int64_t ldx, int64_t k, int sb, int64_t m0, int64_t m1,
                   const QXBuf& buf);
void quantize_avx512(const float* x, int64_t ldx, int64_t k, int sb, int64_t m0, int64_t m1,
                     const QXBuf& buf);
// Fill qw from q for rows [m0, m1) (portable code: a reordering, no arithmetic).
void widen_pairs(const QXBuf& buf, int64_t k, int64_t m0, int64_t m1);

// out[m * ldo + n] for every input row m and output rows n of groups [g0, g1), n < w.n.
void gemm_scalar(const QW& w, const QX& x, float* out, int64_t ldo, int64_t g0, int64_t g1);
void gemm_avx2(const QW& w, const QX& x, float* out, int64_t ldo, int64_t g0, int64_t g1);
void gemm_avx512(const QW& w, const QX& x, float* out, int64_t ldo, int64_t g0, int64_t g1);
void gemm_avx512vnni(const QW& w, const QX& x, float* out, int64_t ldo, int64_t g0, int64_t g1);
void gemm_avxvnni(const QW& w, const QX& x, float* out, int64_t ldo, int64_t g0, int64_t g1);
void gemm_avx2vnni_evex(const QW& w, const QX& x, float* out, int64_t ldo, int64_t g0, int64_t g1);
// AMX-INT8 tiles for 10-32 rows, the VNNI product for other row counts (qgemm_amx.cpp).
void gemm_avx512amx(const QW& w, const QX& x, float* out, int64_t ldo, int64_t g0, int64_t g1);

// The two above for instruction-set path isa (kernel_common.h's rs::Isa codes, checked
// by the caller): quantize_isa includes widen_pairs where buf.qw is set (qdispatch.cpp).
void quantize_isa(int isa, const float* x, int64_t ldx, int64_t k, int sb, int64_t m0, int64_t m1,
                  const QXBuf& buf);
// 6-bit storage runs the VNNI product of the path on the VNNI paths (AMX: the AVX-512
// VNNI product, its tiles read u8 and u4 only) and the AVX2 product without VNNI on the
// others (each such CPU has AVX2): the same integer sums and float steps everywhere, so
// the same bits.
void gemm_isa(int isa, const QW& w, const QX& x, float* out, int64_t ldo, int64_t g0, int64_t g1);

// Dequantized rows ids[i] -> out[i][0..K): s * (float)(u - z) + m, rounded after the
// product and after the sum (no fma), as gguf.quants.dequantize computes them.
void dequant_rows(const QW& w, const int64_t* ids, int64_t n_ids, float* out);

// fp16 bits -> fp32, exact (the scalar path's F16C).
float half_to_float(uint16_t h);

}  // namespace qk
