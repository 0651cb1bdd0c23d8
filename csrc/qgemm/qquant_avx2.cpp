// The AVX2 activation quantizer (qkernels.h: the format; quantize_scalar: the
// reference). Compiled with -mavx2 -mfma -mf16c.
//
// As on AVX-512 (qquant_avx512.cpp), blocks of 32 go in groups, here of 8: each block's
// max |x| and integer sums are reduced into one lane of a ymm by a transposition tree
// (max and integer sums are exact: any order gives quantize_scalar's values), and
// d = amax / 127 and 1 / d are one vector division each. The int8 values are stored by
// two packs and one permutation (|q| <= 127: no saturation).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "qgemm/qkernels.h"

namespace qk {
namespace {

inline __m256 add_i32(__m256 a, __m256 b) {
  return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(a), _mm256_castps_si256(b)));
}

// Lane i of the result: op over the 8 lanes of A[i] (op exact and commutative): halves,
// then pairs of quarters, then neighbours; A[i]'s total ends in lane pos[i] of R, which
// the last permutation puts back in lane i.
template <class Op>
inline __m256 reduce_lanes8(const __m256 (&A)[8], Op op) {
  __m256 B[4], C[2];
  for (int p = 0; p < 4; ++p)  // lanes 0-3: half sums of A[2p], 4-7: of A[2p+1]
    B[p] = op(_mm256_blend_ps(A[2 * p], A[2 * p + 1], 0xF0), _mm256_permute2f128_ps(A[2 * p], A[2 * p + 1], 0x21));
  for (int p = 0; p < 2; ++p) {  // lanes (0-1, 2-3, 4-5, 6-7): A[4p + (0, 2, 1, 3)]
    const __m256 x = _mm256_blend_ps(B[2 * p], B[2 * p + 1], 0xCC);
    const __m256 z = _mm256_blend_ps(B[2 * p + 1], B[2 * p], 0xCC);
    C[p] = op(x, _mm256_permute_ps(z, 0x4E));
  }
  const __m256 x = _mm256_blend_ps(C[0], C[1], 0xAA), z = _mm256_blend_ps(C[1], C[0], 0xAA);
  const __m256 R = op(x, _mm256_permute_ps(z, 0xB1));  // A[0, 4, 2, 6, 1, 5, 3, 7]
  return _mm256_permutevar8x32_ps(R, _mm256_setr_epi32(0, 4, 2, 6, 1, 5, 3, 7));
}

constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;  // half to even

// The 32 values at x as int8 at q (two packs interleave 4-value groups of the 128-bit
// lanes, the permutation puts them back in order); h: the int32 sums of values 0-15
// and 16-31, lane-wise (8 lanes each).
inline void quantize_block(const float* x, __m256 id, int8_t* q, __m256i h[2]) {
  __m256i v32[4];
  for (int i = 0; i < 4; ++i)
    v32[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), id), kRound));
  const __m256i p8 = _mm256_packs_epi16(_mm256_packs_epi32(v32[0], v32[1]), _mm256_packs_epi32(v32[2], v32[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  h[0] = _mm256_add_epi32(v32[0], v32[1]);
  h[1] = _mm256_add_epi32(v32[2], v32[3]);
}

inline __m256 abs_max(const float* x) {  // lane-wise max |x| over the block's 4 vectors
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 a = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) a = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + 8 * i), absmask), a);
  return a;
}

// One block by itself (the tail of a row with fewer than kGroupMin blocks left).
void quantize1(const float* xr, int8_t* q, int64_t k, int sb, int64_t m, int64_t b, const QXBuf& buf) {
  const __m256 a = abs_max(xr + 32 * b);
  __m128 a4 = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  a4 = _mm_max_ps(a4, _mm_movehl_ps(a4, a4));
  const float amax = _mm_cvtss_f32(_mm_max_ss(a4, _mm_shuffle_ps(a4, a4, 1)));
  const float d = amax / 127.0f;
  __m256i h[2];
  quantize_block(xr + 32 * b, _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f), q + 32 * b, h);
  int32_t half[2];  // (integers: any order)
  for (int hf = 0; hf < 2; ++hf) {
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(h[hf]), _mm256_extracti128_si256(h[hf], 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    half[hf] = _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1)));
  }
  store_block(buf, m, k, sb, b, d, half);
}

// Blocks left in a row below which they go one at a time (a group's trees cost the same
// for 2 blocks as for 8).
constexpr int64_t kGroupMin = 4;

// Blocks [b0, b0 + n) of one row (n <= 8); missing blocks count as zeros, not stored.
void quantize8(const float* xr, int8_t* q, int64_t k, int sb, int64_t m, int64_t b0, int n,
               const QXBuf& buf) {
  const int64_t nb = k / 32, nsb = k / sb;
  __m256 A[8];
  for (int j = 0; j < 8; ++j) A[j] = j < n ? abs_max(xr + 32 * (b0 + j)) : _mm256_setzero_ps();
  const __m256 amax = reduce_lanes8(A, [](__m256 a, __m256 b) { return _mm256_max_ps(a, b); });
  const __m256 d = _mm256_div_ps(amax, _mm256_set1_ps(127.0f));
  // id = d != 0 ? 1 / d : 0, as quantize_scalar (unordered compare: a NaN d divides).
  const __m256 nz = _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_NEQ_UQ);
  const __m256 id = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), d), nz);
  __m256 S[2][8];  // per block: the lane-wise int32 sums of values 0-15 and 16-31
  for (int j = 0; j < 8; ++j) {
    if (j >= n) {
      S[0][j] = S[1][j] = _mm256_setzero_ps();
      continue;
    }
    __m256i h[2];
    quantize_block(xr + 32 * (b0 + j), _mm256_permutevar8x32_ps(id, _mm256_set1_epi32(j)), q + 32 * (b0 + j), h);
    S[0][j] = _mm256_castsi256_ps(h[0]);
    S[1][j] = _mm256_castsi256_ps(h[1]);
  }
  alignas(32) float dv[8], dxs[16];
  alignas(32) int32_t xs[16];
  _mm256_store_ps(dv, d);
  std::memcpy(buf.d + m * nb + b0, dv, size_t(n) * sizeof(float));
  if (sb == 32) {
    __m256 T[8];
    for (int j = 0; j < 8; ++j) T[j] = add_i32(S[0][j], S[1][j]);
    const __m256i s = _mm256_castps_si256(reduce_lanes8(T, add_i32));
    _mm256_store_si256(reinterpret_cast<__m256i*>(xs), s);
    _mm256_store_ps(dxs, _mm256_mul_ps(d, _mm256_cvtepi32_ps(s)));
    std::memcpy(buf.xs + m * nsb + b0, xs, size_t(n) * sizeof(int32_t));
    std::memcpy(buf.dxs + m * nsb + b0, dxs, size_t(n) * sizeof(float));
    return;
  }
  // Sub-blocks of 16: block b's two sums go to 2b and 2b + 1.
  const __m256i h0 = _mm256_castps_si256(reduce_lanes8(S[0], add_i32));
  const __m256i h1 = _mm256_castps_si256(reduce_lanes8(S[1], add_i32));
  const __m256 e0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(h0)), e1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(h1));
  const __m256i lo = _mm256_unpacklo_epi32(h0, h1), hi = _mm256_unpackhi_epi32(h0, h1);  // per 128-bit lane
  _mm256_store_si256(reinterpret_cast<__m256i*>(xs), _mm256_permute2x128_si256(lo, hi, 0x20));
  _mm256_store_si256(reinterpret_cast<__m256i*>(xs + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
  const __m256 flo = _mm256_unpacklo_ps(e0, e1), fhi = _mm256_unpackhi_ps(e0, e1);
  _mm256_store_ps(dxs, _mm256_permute2f128_ps(flo, fhi, 0x20));
  _mm256_store_ps(dxs + 8, _mm256_permute2f128_ps(flo, fhi, 0x31));
  std::memcpy(buf.xs + m * nsb + 2 * b0, xs, size_t(2 * n) * sizeof(int32_t));
  std::memcpy(buf.dxs + m * nsb + 2 * b0, dxs, size_t(2 * n) * sizeof(float));
}

}  // namespace

void quantize_avx2(const float* x, int64_t ldx, int64_t k, int sb, int64_t m0, int64_t m1,
                   const QXBuf& buf) {
  const int64_t nb = k / 32;
  for (int64_t m = m0; m < m1; ++m) {
    const float* xr = x + m * ldx;
    int8_t* q = buf.q + m * k;
    int64_t b0 = 0;
    for (; nb - b0 >= kGroupMin; b0 += 8) quantize8(xr, q, k, sb, m, b0, int(nb - b0 < 8 ? nb - b0 : 8), buf);
    for (; b0 < nb; ++b0) quantize1(xr, q, k, sb, m, b0, buf);
  }
}

}  // namespace qk
