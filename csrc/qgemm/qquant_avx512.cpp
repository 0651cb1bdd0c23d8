// The AVX-512 activation quantizer (qkernels.h: the format; quantize_scalar: the
// reference). Compiled with -mavx512f -mavx512bw -mavx512vl only.
//
// Sixteen blocks of 32 at a time: each block's max |x| and its integer sums are reduced
// into one lane of a vector by a transposition tree (max and integer sums are exact, so
// any order gives quantize_scalar's values), and d = amax / 127 and 1 / d are one vector
// division each (the same IEEE operation lane by lane). One block at a time spent most
// of its time in horizontal reductions and two scalar divisions (a k = 16 forward's 120
// quantizations: 0.48 ms on one thread; now 0.25). 512 rows on Zen 4
// (_kernels.qquantize): 576 values (16 + 2 blocks) 104 -> 59 us, 1536 (3 x 16) 253 -> 123.
#include <immintrin.h>

#include <cstdint>

#include "qgemm/qkernels.h"

namespace qk {
namespace {

// (No std:: templates here: an instantiation compiled for AVX-512 could be the one the
// linker keeps for portable callers.)
inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

inline __m512 add_i32(__m512 a, __m512 b) {
  return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
}

// Lane i of the result: op over the 16 lanes of A[i] (op exact and commutative). The
// levels of dot16 (native_attention.inc): halves, quarters, pairs, lanes; A[i]'s total
// ends in lane pos[i] of R, which the last permutation puts back in lane i.
template <class Op>
inline __m512 reduce_lanes16(const __m512 (&A)[16], Op op) {
  __m512 B[8], C[4], D[2];
  for (int p = 0; p < 8; ++p) {
    const __m512 x = _mm512_mask_blend_ps(0xFF00, A[2 * p], A[2 * p + 1]);
    B[p] = op(x, _mm512_shuffle_f32x4(A[2 * p], A[2 * p + 1], 0x4E));
  }
  for (int p = 0; p < 4; ++p) {
    const __m512 x = _mm512_mask_blend_ps(0xF0F0, B[2 * p], B[2 * p + 1]);
    const __m512 z = _mm512_mask_blend_ps(0xF0F0, B[2 * p + 1], B[2 * p]);
    C[p] = op(x, _mm512_shuffle_f32x4(z, z, 0xB1));
  }
  for (int p = 0; p < 2; ++p) {
    const __m512d c0 = _mm512_castps_pd(C[2 * p]), c1 = _mm512_castps_pd(C[2 * p + 1]);
    const __m512d x = _mm512_mask_blend_pd(0xAA, c0, c1), z = _mm512_mask_blend_pd(0xAA, c1, c0);
    D[p] = op(_mm512_castpd_ps(x), _mm512_castpd_ps(_mm512_permute_pd(z, 0x55)));
  }
  const __m512 x = _mm512_mask_blend_ps(0xAAAA, D[0], D[1]), z = _mm512_mask_blend_ps(0xAAAA, D[1], D[0]);
  const __m512 R = op(x, _mm512_permute_ps(z, 0xB1));
  const __m512i pos = _mm512_setr_epi32(0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15);
  return _mm512_permutexvar_ps(pos, R);
}

constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;  // half to even

// Blocks [b0, b0 + n) of one row (n <= 16); missing blocks count as zeros and are not
// stored.
void quantize16(const float* xr, int8_t* q, int64_t k, int sb, int64_t m, int64_t b0, int n,
                const QXBuf& buf) {
  const int64_t nb = k / 32, nsb = k / sb;
  const __m512 zero = _mm512_setzero_ps();
  __m512 A[16];
  for (int j = 0; j < 16; ++j) {
    const float* p = xr + 32 * (b0 + j);
    A[j] = j < n ? _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(p)), _mm512_abs_ps(_mm512_loadu_ps(p + 16)))
                 : zero;
  }
  const __m512 amax = reduce_lanes16(A, [](__m512 a, __m512 b) { return _mm512_max_ps(a, b); });
  const __m512 d = _mm512_div_ps(amax, _mm512_set1_ps(127.0f));
  // id = d != 0 ? 1 / d : 0, as quantize_scalar (unordered compare: a NaN d divides).
  const __mmask16 nz = _mm512_cmp_ps_mask(d, zero, _CMP_NEQ_UQ);
  const __m512 id = _mm512_maskz_div_ps(nz, _mm512_set1_ps(1.0f), d);
  const __mmask16 valid = __mmask16((1u << n) - 1);
  _mm512_mask_storeu_ps(buf.d + m * nb + b0, valid, d);

  // q of two blocks per pass: two packs (|q| <= 127: no saturation) put 4-value groups
  // of the four vectors side by side in each 128-bit lane; the permutation orders them.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  __m512 S[2][16];  // per block: the int32 sums of values 0-15 and 16-31, lane-wise
  for (int j = 0; j < 16; j += 2) {
    __m512i v[4];
    for (int t = 0; t < 4; ++t) {  // block j + t / 2, half t % 2
      const int jb = j + t / 2;
      v[t] = jb < n ? _mm512_cvt_roundps_epi32(
                          _mm512_mul_ps(_mm512_loadu_ps(xr + 32 * (b0 + j) + 16 * t),
                                        _mm512_permutexvar_ps(_mm512_set1_epi32(jb), id)),
                          kRound)
                    : _mm512_setzero_si512();
      S[t % 2][jb] = _mm512_castsi512_ps(v[t]);
    }
    if (j >= n) continue;
    const __m512i p8 = _mm512_packs_epi16(_mm512_packs_epi32(v[0], v[1]), _mm512_packs_epi32(v[2], v[3]));
    const __m512i ordered = _mm512_permutexvar_epi32(order, p8);
    if (j + 1 < n) _mm512_storeu_si512(q + 32 * (b0 + j), ordered);
    else _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * (b0 + j)), _mm512_castsi512_si256(ordered));
  }
  if (sb == 32) {
    __m512 T[16];
    for (int j = 0; j < 16; ++j) T[j] = add_i32(S[0][j], S[1][j]);
    const __m512i xs = _mm512_castps_si512(reduce_lanes16(T, add_i32));
    _mm512_mask_storeu_epi32(buf.xs + m * nsb + b0, valid, xs);
    _mm512_mask_storeu_ps(buf.dxs + m * nsb + b0, valid, _mm512_mul_ps(d, _mm512_cvtepi32_ps(xs)));
    return;
  }
  // Sub-blocks of 16: block b's two sums go to 2b and 2b + 1.
  const __m512i h0 = _mm512_castps_si512(reduce_lanes16(S[0], add_i32));
  const __m512i h1 = _mm512_castps_si512(reduce_lanes16(S[1], add_i32));
  const __m512 e0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(h0)), e1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(h1));
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
  const int n0 = n < 8 ? n : 8, n1 = n - n0;
  const __mmask16 m0 = __mmask16((1u << (2 * n0)) - 1), m1 = __mmask16((1u << (2 * n1)) - 1);
  int32_t* xs = buf.xs + m * nsb + 2 * b0;
  float* dxs = buf.dxs + m * nsb + 2 * b0;
  _mm512_mask_storeu_epi32(xs, m0, _mm512_permutex2var_epi32(h0, lo, h1));
  _mm512_mask_storeu_ps(dxs, m0, _mm512_permutex2var_ps(e0, lo, e1));
  if (n1 > 0) {
    _mm512_mask_storeu_epi32(xs + 16, m1, _mm512_permutex2var_epi32(h0, hi, h1));
    _mm512_mask_storeu_ps(dxs + 16, m1, _mm512_permutex2var_ps(e0, hi, e1));
  }
}

// Blocks left in a row below which they go one at a time: a group's reduction trees
// cost as much for 2 blocks as for 16 (512 rows of 16 + 2 blocks: 76 us with the 2 as a
// group, 59 us one by one).
constexpr int64_t kGroupMin = 6;

// One block by itself (the tail of a row with fewer than kGroupMin blocks left).
void quantize1(const float* xr, int8_t* q, int64_t k, int sb, int64_t m, int64_t b, const QXBuf& buf) {
  const __m512 v0 = _mm512_loadu_ps(xr + 32 * b), v1 = _mm512_loadu_ps(xr + 32 * b + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  const float d = amax / 127.0f;
  const __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
  const __m512i q0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v0, id), kRound);
  const __m512i q1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v1, id), kRound);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * b), _mm512_cvtepi32_epi8(q0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * b + 16), _mm512_cvtepi32_epi8(q1));
  const int32_t half[2] = {_mm512_reduce_add_epi32(q0), _mm512_reduce_add_epi32(q1)};
  store_block(buf, m, k, sb, b, d, half);
}

}  // namespace

void quantize_avx512(const float* x, int64_t ldx, int64_t k, int sb, int64_t m0, int64_t m1,
                     const QXBuf& buf) {
  const int64_t nb = k / 32;
  for (int64_t m = m0; m < m1; ++m) {
    int64_t b0 = 0;
    for (; nb - b0 >= kGroupMin; b0 += 16)
      quantize16(x + m * ldx, buf.q + m * k, k, sb, m, b0, int(min64(16, nb - b0)), buf);
    for (; b0 < nb; ++b0) quantize1(x + m * ldx, buf.q + m * k, k, sb, m, b0, buf);
  }
}

}  // namespace qk
