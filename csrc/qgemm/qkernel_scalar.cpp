// Portable paths of the quantized kernels (see qkernels.h for the layout and the
// canonical arithmetic): activation quantization, the product, dequantized rows.
// Compiled for the baseline x86-64 target with -ffp-contract=off; std::fma is the
// correctly rounded fmaf, so the results are the SIMD paths' bits.
#include <cmath>
#include <cstring>

#include "qgemm/qkernels.h"

namespace qk {

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in fp32
    float v = float(man) * 5.9604644775390625e-08f;
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

void quantize_scalar(const float* x, int64_t ldx, int64_t k, int sb, int64_t m0, int64_t m1,
                     const QXBuf& buf) {
  const int64_t nb = k / 32;
  for (int64_t m = m0; m < m1; ++m) {
    const float* xr = x + m * ldx;
    int8_t* q = buf.q + m * k;
    for (int64_t b = 0; b < nb; ++b) {
      float amax = 0.0f;
      for (int i = 0; i < 32; ++i) {
        const float a = std::fabs(xr[32 * b + i]);
        amax = a > amax ? a : amax;  // the order of max is irrelevant: max is exact
      }
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      int32_t half[2] = {0, 0};
      for (int i = 0; i < 32; ++i) {
        const int v = int(std::nearbyint(xr[32 * b + i] * id));  // |v| <= 127
        q[32 * b + i] = int8_t(v);
        half[i / 16] += v;
      }
      store_block(buf, m, k, sb, b, d, half);
    }
  }
}

void widen_pairs(const QXBuf& buf, int64_t k, int64_t m0, int64_t m1) {
  for (int64_t m = m0; m < m1; ++m) {
    const int8_t* q = buf.q + m * k;
    int16_t* w = buf.qw + m * k;
    for (int64_t i = 0; i < k; i += 4) {
      w[i] = q[i];
      w[i + 1] = q[i + 2];
      w[i + 2] = q[i + 1];
      w[i + 3] = q[i + 3];
    }
  }
}

namespace {

// The scale (or min) of row lane r of group g in sub-block b, from p in w's format.
inline float load_scale(const QW& w, const void* p, int64_t g, int64_t b, int r) {
  if (w.sfmt == kKS) {
    const uint8_t* t = static_cast<const uint8_t*>(p);
    const int64_t od = w.sb == 32 ? KS<32>::d(w, g, b) : KS<16>::d(w, g, b);
    const int64_t os = w.sb == 32 ? KS<32>::sc(w, g, b) : KS<16>::sc(w, g, b);
    uint16_t d;
    std::memcpy(&d, t + od + 2 * r, 2);
    return half_to_float(d) * float(int8_t(t[os + r]));  // exact (qkernels.h)
  }
  const int64_t i = (g * w.nsb() + b) * 16 + r;
  if (w.sfmt == kF16) return half_to_float(static_cast<const uint16_t*>(p)[i]);
  if (w.sfmt == kE8) return e8m0_half(static_cast<const uint8_t*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

// u of row lane r, k = b*SB + o in group g.
inline int weight(const QW& w, int64_t g, int64_t b, int r, int o) {
  const int c = o / 4, j = o % 4;
  const uint8_t* blk = w.qs + (g * w.nsb() + b) * w.sb_bytes();
  if (w.p6) {  // pair c / 2 of chunks, vectors A, B, C (qkernels.h)
    const uint8_t* pair = blk + 96 * (c / 2);
    const int v = 2 * (r / 8) + c % 2, t = 4 * (r % 8) + j;  // v: 0 A, 1 B, 2 C, 3 spread
    if (v < 3) return pair[32 * v + t] & 0x3F;
    return (pair[t] >> 6) | (pair[32 + t] >> 6) << 2 | (pair[64 + t] >> 6) << 4;
  }
  if (!w.u4) return blk[c * 64 + r * 4 + j];
  const uint8_t byte = blk[(c % 4) * 64 + r * 4 + j];
  const int nib = c < 4 ? (byte & 0x0F) : (byte >> 4);
  return w.lut ? kE2M1U[nib] : nib;
}

}  // namespace

void gemm_scalar(const QW& w, const QX& x, float* out, int64_t ldo, int64_t g0, int64_t g1) {
  const int64_t nsb = w.nsb(), nb = w.k / 32;
  for (int64_t g = g0; g < g1; ++g)
    for (int r = 0; r < 16 && 16 * g + r < w.n; ++r) {
      const int64_t n = 16 * g + r;
      const int32_t z = w.zero ? w.zero[n] : 0;
      for (int64_t m = 0; m < x.m; ++m) {
        const int8_t* q = x.q + m * w.k;
        float acc = 0.0f;
        for (int64_t b = 0; b < nsb; ++b) {
          int32_t isum = 0;
          for (int o = 0; o < w.sb; ++o) isum += weight(w, g, b, r, o) * q[b * w.sb + o];
          isum -= z * x.xs[m * nsb + b];
          const float f = float(isum) * x.d[m * nb + (b * w.sb) / 32];
          acc = std::fma(load_scale(w, w.scale, g, b, r), f, acc);
          if (w.mins) acc = std::fma(load_scale(w, w.mins, g, b, r), x.dxs[m * nsb + b], acc);
        }
        out[m * ldo + n] = acc;
      }
    }
}

void dequant_rows(const QW& w, const int64_t* ids, int64_t n_ids, float* out) {
  const int64_t nsb = w.nsb();
  for (int64_t i = 0; i < n_ids; ++i) {
    const int64_t g = ids[i] / 16;
    const int r = int(ids[i] % 16);
    const int32_t z = w.zero ? w.zero[ids[i]] : 0;
    float* o = out + i * w.k;
    for (int64_t b = 0; b < nsb; ++b) {
      const float s = load_scale(w, w.scale, g, b, r);
      if (w.mins) {
        const float mn = load_scale(w, w.mins, g, b, r);
        for (int e = 0; e < w.sb; ++e) o[b * w.sb + e] = s * float(weight(w, g, b, r, e) - z) + mn;
      } else {
        for (int e = 0; e < w.sb; ++e) o[b * w.sb + e] = s * float(weight(w, g, b, r, e) - z);
      }
    }
  }
}

}  // namespace qk
