// AVX2 (+FMA, F16C) quantized product and activation quantizer (layout and canonical
// arithmetic: qkernels.h). A ymm holds 8 int32/fp32 lanes, so a group of 16 output
// rows is processed as two half-groups ("units" u = 2g + h, rows 16g + 8h ..+8), each
// reading the h-th 32-byte half of every 64-byte weight vector. Lane = output row, as
// on AVX-512, so every output sees the same float operations. Integer products: u4
// weights by vpmaddubsw on the int8 activations (sums in int16, see dot_u4), u8 weights
// by vpmaddwd on the int16 pairs of widen_pairs.
// Compiled with -mavx2 -mfma -mf16c; everything but the two entry points has internal
// linkage.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "qkernels.h"

namespace qk {
namespace {

constexpr int64_t kMTile = 64;

inline int32_t load32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// A 32-byte u8 weight half-vector (4 consecutive u of each of 8 rows) as int16 pairs
// (u0, u2) and (u1, u3), ready for vpmaddwd (vpmaddubsw would saturate: 2 * 255 * 127).
struct WV {
  __m256i even, odd;
};
inline WV prep_u8(__m256i w) {
  return {_mm256_and_si256(w, _mm256_set1_epi16(0x00FF)), _mm256_srli_epi16(w, 8)};
}

// u4 weights take vpmaddubsw instead: u (0..15) times q (-127..127) in byte pairs, so a
// pair sum is at most 2 * 15 * 127 = 3810 (no saturation) and the 8 pair sums of one
// 16-bit lane over a 32-value sub-block at most 30480 < 2^15: the sub-block adds up
// exactly in int16, then one vpmaddwd by ones widens it. The same isum as every path.
// s += per 16-bit lane, the pair sums of the nibbles w (4 u per 32-bit lane, as bytes)
// with the 4 activations at q.
inline __m256i dot_u4(__m256i s, __m256i w, const int8_t* q) {
  return _mm256_add_epi16(s, _mm256_maddubs_epi16(w, _mm256_set1_epi32(load32(q))));
}
// acc += per lane, the dot of the lane's 4 u with activations (q0, q2 | q1, q3) at qw
// (exact: |u q| <= 255 * 127, pair sums fit int32).
inline __m256i dot(__m256i acc, const WV& w, const int16_t* qw) {
  acc = _mm256_add_epi32(acc, _mm256_madd_epi16(w.even, _mm256_set1_epi32(load32(qw))));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(w.odd, _mm256_set1_epi32(load32(qw + 2))));
}

inline __m256 load_scales(const void* p, bool f16, int64_t i) {
  if (f16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(static_cast<const uint16_t*>(p) + i)));
  return _mm256_loadu_ps(static_cast<const float*>(p) + i);
}

// Units [u, u+NH) x input rows [m, m+MR).
template <bool U4, int SB, bool HZ, bool HM, int NH, int MR>
void block(const QW& w, const QX& x, float* out, int64_t ldo, int64_t u, int64_t m) {
  constexpr int64_t kBytes = U4 ? 8 * SB : 16 * SB;
  const int64_t K = w.k, nsb = K / SB, nb = K / 32;
  __m256 acc[NH][MR];
  __m256i negz[NH];
#pragma GCC unroll 16
  for (int i = 0; i < NH; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < MR; ++j) acc[i][j] = _mm256_setzero_ps();
    if constexpr (HZ)
      negz[i] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                 _mm256_loadu_si256((const __m256i*)(w.zero + 8 * (u + i))));
  }
  for (int64_t b = 0; b < nsb; ++b) {
    __m256i is[NH][MR];
#pragma GCC unroll 16
    for (int i = 0; i < NH; ++i)
#pragma GCC unroll 16
      for (int j = 0; j < MR; ++j) {
        if constexpr (HZ) is[i][j] = _mm256_mullo_epi32(negz[i], _mm256_set1_epi32(x.xs[(m + j) * nsb + b]));
        else is[i][j] = _mm256_setzero_si256();
      }
    // One unit at a time (16 ymm registers): its weights once, then each input row.
#pragma GCC unroll 16
    for (int i = 0; i < NH; ++i) {
      const int64_t g = (u + i) >> 1, h = (u + i) & 1;
      const uint8_t* p = w.qs + (g * nsb + b) * kBytes + 32 * h;
      if constexpr (U4) {
        // The sub-block's 8 chunks unpacked once into registers, then each row's 8
        // products summed in one int16 chain (chunks as the outer loop, the compiler
        // built a tree over rows and chunks and spilled its partial sums to the stack).
        const __m256i nib = _mm256_set1_epi8(0x0F);
        __m256i wc[8];
#pragma GCC unroll 4
        for (int v = 0; v < 4; ++v) {
          const __m256i wv = _mm256_loadu_si256((const __m256i*)(p + 64 * v));
          wc[v] = _mm256_and_si256(wv, nib);                             // chunk v
          wc[v + 4] = _mm256_and_si256(_mm256_srli_epi16(wv, 4), nib);  // chunk v+4
        }
#pragma GCC unroll 16
        for (int j = 0; j < MR; ++j) {
          const int8_t* q = x.q + (m + j) * K + b * SB;
          __m256i s16 = _mm256_setzero_si256();
#pragma GCC unroll 8
          for (int c = 0; c < 8; ++c) s16 = dot_u4(s16, wc[c], q + 4 * c);
          is[i][j] = _mm256_add_epi32(is[i][j], _mm256_madd_epi16(s16, _mm256_set1_epi16(1)));
        }
      } else {
#pragma GCC unroll 16
        for (int c = 0; c < SB / 4; ++c) {
          const WV W = prep_u8(_mm256_loadu_si256((const __m256i*)(p + 64 * c)));
#pragma GCC unroll 16
          for (int j = 0; j < MR; ++j) is[i][j] = dot(is[i][j], W, x.qw + (m + j) * K + b * SB + 4 * c);
        }
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < NH; ++i) {
      const int64_t g = (u + i) >> 1, h = (u + i) & 1;
      const int64_t si = (g * nsb + b) * 16 + 8 * h;
      const __m256 S = load_scales(w.scale, w.f16, si);
      __m256 Mn = _mm256_setzero_ps();
      if constexpr (HM) Mn = load_scales(w.mins, w.f16, si);
#pragma GCC unroll 16
      for (int j = 0; j < MR; ++j) {
        const __m256 dx = _mm256_set1_ps(x.d[(m + j) * nb + (b * SB) / 32]);
        const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(is[i][j]), dx);
        acc[i][j] = _mm256_fmadd_ps(S, f, acc[i][j]);
        if constexpr (HM) acc[i][j] = _mm256_fmadd_ps(Mn, _mm256_set1_ps(x.dxs[(m + j) * nsb + b]), acc[i][j]);
      }
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < NH; ++i) {
    const int64_t n = 8 * (u + i), valid = w.n - n;
    if (valid <= 0) continue;
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(valid < 8 ? valid : 8)),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#pragma GCC unroll 16
    for (int j = 0; j < MR; ++j) _mm256_maskstore_ps(out + (m + j) * ldo + n, mask, acc[i][j]);
  }
}

template <bool U4, int SB, bool HZ, bool HM>
void run(const QW& w, const QX& x, float* out, int64_t ldo, int64_t g0, int64_t g1) {
  const int64_t u1 = 2 * g1;
  for (int64_t m0 = 0; m0 < x.m; m0 += kMTile) {
    const int64_t m1 = m0 + kMTile < x.m ? m0 + kMTile : x.m;
    int64_t u = 2 * g0;
    // One row: the two halves of one group at a time, i.e. one sequential weight stream
    // per thread (two groups at once interleaved two streams: RECALLSPEC_KERNELS=avx2
    // scripts/exp_verify_profile.py on Zen 4, the 1-row products 8.3-8.5 -> 5.2 ms on one
    // thread, 4.4-4.8 -> 2.9 on two; as on AVX-512, qgemm_avx512.inc).
    if (m1 - m0 == 1) {
      for (; u + 2 <= u1; u += 2) block<U4, SB, HZ, HM, 2, 1>(w, x, out, ldo, u, m0);
      for (; u < u1; ++u) block<U4, SB, HZ, HM, 1, 1>(w, x, out, ldo, u, m0);
      continue;
    }
    for (; u < u1; ++u) {
      int64_t m = m0;
      for (; m + 4 <= m1; m += 4) block<U4, SB, HZ, HM, 1, 4>(w, x, out, ldo, u, m);
      switch (m1 - m) {
        case 3: block<U4, SB, HZ, HM, 1, 3>(w, x, out, ldo, u, m); break;
        case 2: block<U4, SB, HZ, HM, 1, 2>(w, x, out, ldo, u, m); break;
        case 1: block<U4, SB, HZ, HM, 1, 1>(w, x, out, ldo, u, m); break;
        default: break;
      }
    }
  }
}

template <bool U4, int SB>
void run_zm(const QW& w, const QX& x, float* out, int64_t ldo, int64_t g0, int64_t g1) {
  const bool hz = w.zero != nullptr, hm = w.mins != nullptr;
  if (hz && hm) run<U4, SB, true, true>(w, x, out, ldo, g0, g1);
  else if (hz) run<U4, SB, true, false>(w, x, out, ldo, g0, g1);
  else if (hm) run<U4, SB, false, true>(w, x, out, ldo, g0, g1);
  else run<U4, SB, false, false>(w, x, out, ldo, g0, g1);
}

}  // namespace

void gemm_avx2(const QW& w, const QX& x, float* out, int64_t ldo, int64_t g0, int64_t g1) {
  if (w.u4) run_zm<true, 32>(w, x, out, ldo, g0, g1);
  else if (w.sb == 32) run_zm<false, 32>(w, x, out, ldo, g0, g1);
  else run_zm<false, 16>(w, x, out, ldo, g0, g1);
}

// Same values as quantize_scalar (see quantize_avx512).
void quantize_avx2(const float* x, int64_t ldx, int64_t k, int sb, int64_t m0, int64_t m1,
                   const QXBuf& buf) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t m = m0; m < m1; ++m) {
    const float* xr = x + m * ldx;
    int8_t* q = buf.q + m * k;
    for (int64_t b = 0; b < k / 32; ++b) {
      __m256 v[4], a = _mm256_setzero_ps();
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(xr + 32 * b + 8 * i);
        a = _mm256_max_ps(_mm256_and_ps(v[i], absmask), a);
      }
      __m128 a4 = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
      a4 = _mm_max_ps(a4, _mm_movehl_ps(a4, a4));
      const float amax = _mm_cvtss_f32(_mm_max_ss(a4, _mm_shuffle_ps(a4, a4, 1)));
      const float d = amax / 127.0f;
      const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
      __m256i v32[4];
      for (int i = 0; i < 4; ++i) {
        const __m256 r = _mm256_round_ps(_mm256_mul_ps(v[i], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        v32[i] = _mm256_cvtps_epi32(r);  // integral, |q| <= 127: exact
      }
      // int32 -> int8 without saturation (|q| <= 127); the packs interleave 4-value
      // groups of the 128-bit lanes, the permutation puts them back in order.
      const __m256i p8 = _mm256_packs_epi16(_mm256_packs_epi32(v32[0], v32[1]),
                                            _mm256_packs_epi32(v32[2], v32[3]));
      _mm256_storeu_si256((__m256i*)(q + 32 * b),
                          _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
      int32_t half[2];  // the sums of values 0-15 and 16-31 (integers: any order)
      for (int hf = 0; hf < 2; ++hf) {
        const __m256i s8 = _mm256_add_epi32(v32[2 * hf], v32[2 * hf + 1]);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        half[hf] = _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1)));
      }
      store_block(buf, m, k, sb, b, d, half);
    }
  }
}

}  // namespace qk
