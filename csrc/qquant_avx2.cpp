// The AVX2 activation quantizer (qkernels.h: the format; quantize_scalar: the
// reference). Compiled with -mavx2 -mfma -mf16c.
#include <immintrin.h>

#include <cstdint>

#include "qkernels.h"

namespace qk {

// Same values as quantize_scalar: |x| and max are exact, d and 1/d are single IEEE
// operations, x*id one multiply, and the conversion rounds half to even explicitly.
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
