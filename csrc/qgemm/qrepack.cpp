// GGUF block bytes -> the quantized kernels' packed layout (qkernels.h), in one pass
// per row: the decode of kernels/qformats.py (GGUF blocks -> canonical u, s, m, z) and
// its pack (canonical -> kernel layout) fused, with no canonical array in between.
// kernels/qformats.py is the reference: every byte written here equals what
// qformats.pack(qformats.decode(...)) gives (tests/kernels/test_qrepack.py checks it on
// every type). The Python side (kernels/qrepack.py) allocates zeroed arrays for a whole
// segment and calls this once per chunk of rows; padding rows are never written, so
// they stay zero as pack's padding does.
//
// Values (qformats.py's table): legacy types keep their fp16 d (and m) bits as they are;
// K-quants keep GGUF's factors in the kKS tiles of qkernels.h: d's fp16 bits and the
// integer sc, and for mins dmin's bits with the sign flipped (-dmin, exact) and the 6-bit
// min, whose products the kernels form exactly. MXFP4 in its own storage keeps its
// blocks: the 4-bit codes in u4 storage (the kernels read u = kvalue + 12 through
// qk::kE2M1U; code 8, -0, is written as 0, both u = 12, as qformats.pack writes it) and
// its E8M0 bytes (kE8); in u8 or 6-bit storage it writes u = kvalue + 12 through that
// table and the E8M0 byte as the fp32 bits of 2^(e - 128) (qk::e8m0_half_bits), one
// kF32 scale per sub-block of 32: the same u and s, so the same products.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "common/kernel_common.h"
#include "qgemm/qkernels.h"

namespace nb = nanobind;

namespace {

// GGML type ids (ggml.h's enum ggml_type; gguf.GGMLQuantizationType).
enum Type : int {
  Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14, MXFP4 = 39
};

// A type's block and its canonical layout (qformats.py's table).
struct Format {
  int block, bytes;  // elements and bytes per GGUF block
  int sb;            // canonical sub-block length (32, or 16 for Q6_K)
  bool u4;           // its own storage is u4 (MXFP4: its codes)
  int sfmt;          // qk::SFmt: kF16 (legacy types), kKS tiles (K-quants), kE8 (MXFP4)
  bool mins;
  int32_t zero;      // z; 0 means no zero-point array
};

bool format_of(int t, Format& f) {
  switch (t) {
    case Q4_0: f = {32, 18, 32, true, qk::kF16, false, 8}; return true;
    case Q4_1: f = {32, 20, 32, true, qk::kF16, true, 0}; return true;
    case Q5_0: f = {32, 22, 32, false, qk::kF16, false, 16}; return true;
    case Q5_1: f = {32, 24, 32, false, qk::kF16, true, 0}; return true;
    case Q8_0: f = {32, 34, 32, false, qk::kF16, false, 128}; return true;
    case Q4_K: f = {256, 144, 32, true, qk::kKS, true, 0}; return true;
    case Q5_K: f = {256, 176, 32, false, qk::kKS, true, 0}; return true;
    case Q6_K: f = {256, 210, 16, false, qk::kKS, false, 32}; return true;
    case MXFP4: f = {32, 17, 32, true, qk::kE8, false, 12}; return true;
    default: return false;
  }
}

uint16_t le16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }

// Where one row's data goes in a segment of the packed layout: row r is lane r % 16 of
// group r / 16; sub-block b of that group starts at qs + (g * nsb + b) * sb_bytes.
struct Out {
  uint8_t* qs;
  uint8_t* scale;  // fp16, fp32 or E8M0 elements [G][nsb][16], or kKS tiles [G][K/256][tile]
  uint8_t* mins;   // same, or nullptr
  int32_t* zero;   // [G * 16] or nullptr
  int64_t nsb, sb_bytes;
  int64_t nsup, tile;  // kKS: super-blocks per row, tile bytes
  bool p6;             // 6-bit storage of u8 values (all < 64)
  bool codes;          // MXFP4 in its own storage: codes and E8M0 bytes (else u, fp32 s)
};

// One row's writer: sub-block b of this row.
struct RowOut {
  const Out& o;
  int64_t g, lane;
  uint8_t* vec(int64_t b) const { return o.qs + (g * o.nsb + b) * o.sb_bytes + lane * 4; }
  int64_t at(int64_t b) const { return (g * o.nsb + b) * 16 + lane; }
  void scale16(int64_t b, const uint8_t* src) const { std::memcpy(o.scale + at(b) * 2, src, 2); }
  void mins16(int64_t b, const uint8_t* src) const { std::memcpy(o.mins + at(b) * 2, src, 2); }
  void scale32(int64_t b, uint32_t bits) const { std::memcpy(o.scale + at(b) * 4, &bits, 4); }
  void scale8(int64_t b, uint8_t e) const { o.scale[at(b)] = e; }
  // kKS: this lane's fp16 d (bits) of super-block s, and its integer factor of sub-block
  // b, in the tiles at base (scale or mins).
  uint8_t* tile(uint8_t* base, int64_t s) const { return base + (g * o.nsup + s) * o.tile; }
  void ks_d(uint8_t* base, int64_t s, uint16_t bits) const { std::memcpy(tile(base, s) + 2 * lane, &bits, 2); }
  // (Super-block s's own sub-block j: no division by the runtime sub-blocks per
  // super-block, which cost more than the rest of a row's repack.)
  void ks_sc(uint8_t* base, int64_t s, int j, int8_t v) const {
    tile(base, s)[32 + 16 * j + lane] = uint8_t(v);
  }
  // u8 values u[0..sb) of sub-block b: 4 consecutive k per 64-byte vector, or in 6-bit
  // storage (qkernels.h) ORed into the pairs' bytes (zeroed; lanes r and r + 8 share
  // bytes, and a group is one thread's).
  void u8(int64_t b, const uint8_t* u, int sb) const {
    if (o.p6) {
      uint8_t* blk = o.qs + (g * o.nsb + b) * o.sb_bytes;
      const int64_t h = lane / 8, t = 4 * (lane % 8);
      // Four values at once, as one 32-bit word (bytes stay apart: every value < 64, so
      // the shifts and masks below never carry into a neighbour's byte).
      auto or32 = [](uint8_t* dst, uint32_t bits) {
        uint32_t w;
        std::memcpy(&w, dst, 4);
        w |= bits;
        std::memcpy(dst, &w, 4);
      };
      for (int c = 0; c < sb / 4; ++c) {
        uint8_t* pair = blk + 96 * (c / 2) + t;
        const int64_t v = 2 * h + c % 2;  // 0 A, 1 B, 2 C, 3 spread over their bits 6-7
        uint32_t x;
        std::memcpy(&x, u + 4 * c, 4);
        if (v < 3) {
          or32(pair + 32 * v, x);
        } else {
          constexpr uint32_t kLow2 = 0x03030303u;
          or32(pair, (x & kLow2) << 6);
          or32(pair + 32, ((x >> 2) & kLow2) << 6);
          or32(pair + 64, ((x >> 4) & kLow2) << 6);
        }
      }
      return;
    }
    uint8_t* p = vec(b);
    for (int c = 0; c < sb / 4; ++c) std::memcpy(p + c * 64, u + 4 * c, 4);
  }
  // u4 storage: byte (v, j) = u[4v + j] | u[4v + 16 + j] << 4, given as the 16 bytes
  // (v, j) in order.
  void u4(int64_t b, const uint8_t* bytes16) const {
    uint8_t* p = vec(b);
    for (int v = 0; v < 4; ++v) std::memcpy(p + v * 64, bytes16 + 4 * v, 4);
  }
};

// The 8 six-bit scales and mins of a K-quant block's 12 bytes (qformats._k_scales).
void k_scales(const uint8_t* s, uint8_t sc[8], uint8_t mn[8]) {
  for (int i = 0; i < 4; ++i) {
    sc[i] = s[i] & 0x3f;
    mn[i] = s[i + 4] & 0x3f;
    sc[i + 4] = uint8_t((s[i + 8] & 0x0f) | ((s[i] >> 2) & 0x30));
    mn[i + 4] = uint8_t((s[i + 8] >> 4) | ((s[i + 4] >> 2) & 0x30));
  }
}

// One GGUF block at block index `blk` of a row (its sub-blocks start at blk * block / sb).
void legacy_block(int t, const uint8_t* p, int64_t blk, const RowOut& r) {
  uint8_t u[32];
  switch (t) {
    case Q4_0: r.scale16(blk, p); r.u4(blk, p + 2); return;  // the bytes are (v, j) already
    case Q4_1: r.scale16(blk, p); r.mins16(blk, p + 2); r.u4(blk, p + 4); return;
    case Q5_0:
    case Q5_1: {
      const int off = t == Q5_0 ? 2 : 4;
      const uint32_t qh = uint32_t(p[off]) | uint32_t(p[off + 1]) << 8 |
                          uint32_t(p[off + 2]) << 16 | uint32_t(p[off + 3]) << 24;
      const uint8_t* qs = p + off + 4;
      for (int l = 0; l < 16; ++l) {
        u[l] = uint8_t((qs[l] & 0x0f) | ((qh >> l) & 1u) << 4);
        u[l + 16] = uint8_t((qs[l] >> 4) | ((qh >> (l + 16)) & 1u) << 4);
      }
      r.scale16(blk, p);
      if (t == Q5_1) r.mins16(blk, p + 2);
      r.u8(blk, u, 32);
      return;
    }
    case Q8_0:
      for (int l = 0; l < 32; ++l) u[l] = uint8_t(p[2 + l] ^ 0x80);
      r.scale16(blk, p);
      r.u8(blk, u, 32);
      return;
    case MXFP4: {
      const uint8_t* qs = p + 1;  // byte l: element l in the low nibble, l + 16 in the high
      if (r.o.codes) {  // the bytes are (v, j) already, as Q4_0's; -0 (code 8) becomes 0
        uint8_t b16[16];
        for (int l = 0; l < 16; ++l) {
          const uint8_t lo = qs[l] & 0x0f, hi = qs[l] >> 4;
          b16[l] = uint8_t((lo == 8 ? 0 : lo) | (hi == 8 ? 0 : hi) << 4);
        }
        r.scale8(blk, p[0]);
        r.u4(blk, b16);
        return;
      }
      // u = kvalues_mxfp4[code] + 12 (ggml-common.h; qformats.MXFP4_KVALUES): all <= 24.
      for (int l = 0; l < 16; ++l) {
        u[l] = qk::kE2M1U[qs[l] & 0x0f];
        u[l + 16] = qk::kE2M1U[qs[l] >> 4];
      }
      r.scale32(blk, qk::e8m0_half_bits(p[0]));
      r.u8(blk, u, 32);
      return;
    }
    default: throw std::logic_error("qrepack: not a legacy type");
  }
}

void k_block(int t, const uint8_t* p, int64_t blk, const RowOut& r) {
  if (t == Q6_K) {  // ql 128, qh 64, int8 scales 16, d
    const uint8_t *ql = p, *qh = p + 128;
    uint8_t u[256];
    // Half h, element l of each quarter: the low nibbles of ql[l] and ql[l + 32], then
    // their high nibbles; the two high bits of each from qh[l], 2 bits per quarter (in
    // loops over 32 consecutive bytes, which the compiler vectorizes).
    for (int h = 0; h < 2; ++h) {
      const uint8_t *a = ql + 64 * h, *hb = qh + 32 * h;
      uint8_t* o = u + 128 * h;
      for (int l = 0; l < 32; ++l) {
        o[l] = uint8_t((a[l] & 0x0f) | (hb[l] & 3) << 4);
        o[l + 32] = uint8_t((a[l + 32] & 0x0f) | ((hb[l] >> 2) & 3) << 4);
        o[l + 64] = uint8_t((a[l] >> 4) | ((hb[l] >> 4) & 3) << 4);
        o[l + 96] = uint8_t((a[l + 32] >> 4) | ((hb[l] >> 6) & 3) << 4);
      }
    }
    r.ks_d(r.o.scale, blk, le16(p + 208));
    for (int b = 0; b < 16; ++b) {
      r.ks_sc(r.o.scale, blk, b, int8_t(p[192 + b]));
      r.u8(blk * 16 + b, u + 16 * b, 16);
    }
    return;
  }
  uint8_t sc[8], mn[8];
  k_scales(p + 4, sc, mn);
  r.ks_d(r.o.scale, blk, le16(p));
  r.ks_d(r.o.mins, blk, uint16_t(le16(p + 2) ^ 0x8000u));  // -dmin
  for (int b = 0; b < 8; ++b) {  // 6-bit values: int8 keeps them
    r.ks_sc(r.o.scale, blk, b, int8_t(sc[b]));
    r.ks_sc(r.o.mins, blk, b, int8_t(mn[b]));
  }
  // 4 runs c of 32 bytes: low nibbles are sub-block 2c, high nibbles 2c + 1.
  if (t == Q4_K) {
    const uint8_t* q = p + 16;
    uint8_t lo[16], hi[16];
    for (int c = 0; c < 4; ++c, q += 32) {
      for (int i = 0; i < 16; ++i) {
        lo[i] = uint8_t((q[i] & 0x0f) | (q[16 + i] << 4));
        hi[i] = uint8_t((q[i] >> 4) | (q[16 + i] & 0xf0));
      }
      r.u4(blk * 8 + 2 * c, lo);
      r.u4(blk * 8 + 2 * c + 1, hi);
    }
    return;
  }
  // Q5_K: bit i of qh[l] is the fifth bit of sub-block i, element l.
  const uint8_t *qh = p + 16, *q = p + 48;
  uint8_t u[64];
  for (int c = 0; c < 4; ++c, q += 32) {
    for (int l = 0; l < 32; ++l) {
      u[l] = uint8_t((q[l] & 0x0f) | ((qh[l] >> (2 * c)) & 1) << 4);
      u[32 + l] = uint8_t((q[l] >> 4) | ((qh[l] >> (2 * c + 1)) & 1) << 4);
    }
    r.u8(blk * 8 + 2 * c, u, 32);
    r.u8(blk * 8 + 2 * c + 1, u + 32, 32);
  }
}

template <class T>
using Vec = nb::ndarray<T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Raw = nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// Rows [row_off, row_off + len(raw)) of a segment of n rows and k columns, from their
// GGUF block bytes raw [rows, k / block * bytes], into the segment's arrays (sized for
// n rows: qs, scale and mins as bytes, zero as int32; mins and zero empty when the type
// has none). bits: the storage, the type's own (4 or 8; MXFP4's own, 4, its codes and
// E8M0 bytes) or 6 for the types whose values are below 64 (Q5_*, Q6_K, MXFP4), or
// MXFP4's values in 8 (both with fp32 scales).
void qrepack(Raw raw, int type, int64_t n, int64_t k, int64_t row_off, Vec<uint8_t> qs,
             Vec<uint8_t> scale, Vec<uint8_t> mins, Vec<int32_t> zero, int bits,
             unsigned threads) {
  Format f;
  if (!format_of(type, f)) throw std::invalid_argument("qrepack: unsupported GGML type");
  const bool below64 = (!f.u4 && type != Q8_0) || type == MXFP4;  // qformats.BELOW_64
  if (bits != (f.u4 ? 4 : 8) && !(bits == 6 && below64) && !(bits == 8 && type == MXFP4))
    throw std::invalid_argument("qrepack: this type cannot be stored in that many bits");
  const bool codes = type == MXFP4 && bits == 4;
  if (type == MXFP4 && !codes) f.sfmt = qk::kF32;  // its values, with fp32 scales
  const int64_t rows = int64_t(raw.shape(0));
  if (n <= 0 || k <= 0 || k % f.block != 0 || row_off < 0 || row_off + rows > n)
    throw std::invalid_argument("qrepack: bad n, k or row range");
  const int64_t nblk = k / f.block;
  if (rows && int64_t(raw.shape(1)) != nblk * f.bytes)
    throw std::invalid_argument("qrepack: raw rows do not hold k / block blocks");
  const int64_t groups = (n + 15) / 16, nsb = k / f.sb;
  const int64_t sb_bytes = bits == 4 ? 8 * f.sb : bits == 6 ? 12 * f.sb : 16 * f.sb;
  const int64_t per_scale = f.sfmt == qk::kF32 ? 4 : f.sfmt == qk::kE8 ? 1 : 2;  // or kF16
  const size_t scale_bytes = size_t(f.sfmt == qk::kKS ? groups * (k / 256) * qk::ks_tile_bytes(f.sb)
                                                      : groups * nsb * 16 * per_scale);
  if (qs.size() != size_t(groups * nsb * sb_bytes) || scale.size() != scale_bytes ||
      mins.size() != (f.mins ? scale_bytes : 0) || zero.size() != size_t(f.zero ? groups * 16 : 0))
    throw std::invalid_argument("qrepack: segment arrays do not match n, k and the type");
  const Out o{qs.data(), scale.data(), f.mins ? mins.data() : nullptr,
              f.zero ? zero.data() : nullptr, nsb, sb_bytes, k / 256, qk::ks_tile_bytes(f.sb),
              bits == 6, codes};
  const uint8_t* src = raw.data();
  const int64_t row_bytes = nblk * f.bytes;
  const bool kquant = f.block == 256;
  nb::gil_scoped_release release;
  // Parts by whole groups of the segment, so no two threads write one cache line.
  const int64_t g0 = row_off / 16, g1 = rows ? (row_off + rows - 1) / 16 + 1 : g0;
  rs::split(g1 - g0, threads, [&](int64_t a, int64_t b) {
    const int64_t r0 = std::max(row_off, (g0 + a) * 16);
    const int64_t r1 = std::min(row_off + rows, (g0 + b) * 16);
    for (int64_t row = r0; row < r1; ++row) {
      const RowOut r{o, row / 16, row % 16};
      const uint8_t* p = src + (row - row_off) * row_bytes;
      for (int64_t blk = 0; blk < nblk; ++blk, p += f.bytes) {
        if (kquant) k_block(type, p, blk, r); else legacy_block(type, p, blk, r);
      }
      if (o.zero) o.zero[row] = f.zero;
    }
  });
}

}  // namespace

void register_qrepack(nb::module_& m) {
  m.def("qrepack", &qrepack, nb::arg("raw"), nb::arg("type"), nb::arg("n"), nb::arg("k"),
        nb::arg("row_off"), nb::arg("qs").noconvert(), nb::arg("scale").noconvert(),
        nb::arg("mins").noconvert(), nb::arg("zero").noconvert(), nb::arg("bits"),
        nb::arg("threads") = 1,
        "rows of GGUF block bytes into a segment's arrays in the kernel layout (qkernels.h)");
}
