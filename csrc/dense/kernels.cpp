// recallspec._kernels: small-M dense products y = x W^T for decoding and verification,
// and the module definition (the quantized kernels register themselves from qbind.cpp).
//
// Why: MKL reaches ~12 GB/s on a 1-row fp32 matrix-vector product here and is slower
// for 2-3 rows than for 4, while the machine streams ~25 GB/s. Decoding reads every
// weight once per step, so this kernel streams W once for all M <= 32 rows of x.
//
// Invariant (batch invariance and ISA invariance): out[m, n] is computed by the same
// sequence of floating-point operations whatever M is, whichever thread computes it and
// whichever instruction-set path runs: one 16-lane accumulator per (m, n), lane l
// taking k = l, l+16, l+32, ... by FMA in increasing k (lanes past K get fma(0, 0, acc),
// as a masked AVX-512 load gives), then the fixed reduction tree of reduce16 below. The
// AVX2 path holds lanes 0-7 and 8-15 in two registers; the scalar path runs the lanes
// one by one with fmaf. The file is compiled with -ffp-contract=off, so no multiply and
// add are fused behind our back.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "common/kernel_common.h"

namespace nb = nanobind;

void register_qkernels(nb::module_& m);  // qbind.cpp
void register_qrepack(nb::module_& m);   // qrepack.cpp
void register_native(nb::module_& m);    // native_bind.cpp
void register_sampling(nb::module_& m);  // sample_bind.cpp

namespace {

using rs::pool;

// The reduction order of every path: pairs (l, l+8), then (l, l+4), (l, l+2), (0, 1).
inline float reduce16_scalar(const float* a) {
  float t8[8], t4[4];
  for (int i = 0; i < 8; ++i) t8[i] = a[i] + a[i + 8];
  for (int i = 0; i < 4; ++i) t4[i] = t8[i] + t8[i + 4];
  const float t2a = t4[0] + t4[2], t2b = t4[1] + t4[3];
  return t2a + t2b;
}

inline uint16_t to_bf16(float v) {  // round to nearest even
  uint32_t b;
  std::memcpy(&b, &v, 4);
  b += 0x7FFFu + ((b >> 16) & 1u);
  return uint16_t(b >> 16);
}

// ---------------------------------------------------------------- AVX-512 -----------
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,fma")

// reduce16 with 8-lane halves (lanes 0-7 + lanes 8-15), then 4, 2, 1: the same tree.
inline float reduce8x2_avx512(__m256 lo, __m256 hi) {
  const __m256 t8 = _mm256_add_ps(lo, hi);
  const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
  return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
}
inline float reduce16_avx512(__m512 a) {
  return reduce8x2_avx512(_mm512_castps512_ps256(a),
                          _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

struct F32 {
  using T = float;
  static inline __m512 load(const float* p) { return _mm512_loadu_ps(p); }
  static inline __m512 load_tail(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
  static inline void store(float* p, float v) { *p = v; }
};
struct BF16 {
  using T = int16_t;
  static inline void store(int16_t* p, float v) { *p = int16_t(to_bf16(v)); }
};

// Rows [n, n+NR) x inputs [m, m+MR) of out = x W^T. x: [M, K], W: [N, K], out: [M, N].
// Each accumulator sees exactly the same FMA sequence as in any other blocking.
template <int NR, int MR>
inline void block_512(const float* x, const float* w, float* out, int64_t K, int64_t N,
                      int64_t n, int64_t m) {
  __m512 acc[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < MR; ++j) acc[r][j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = F32::load(w + (n + r) * K + k);
    for (int j = 0; j < MR; ++j) {
      __m512 xv = F32::load(x + (m + j) * K + k);
      for (int r = 0; r < NR; ++r) acc[r][j] = _mm512_fmadd_ps(wv[r], xv, acc[r][j]);
    }
  }
  if (k < K) {
    __mmask16 mask = __mmask16((1u << (K - k)) - 1);
    __m512 wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = F32::load_tail(w + (n + r) * K + k, mask);
    for (int j = 0; j < MR; ++j) {
      __m512 xv = F32::load_tail(x + (m + j) * K + k, mask);
      for (int r = 0; r < NR; ++r) acc[r][j] = _mm512_fmadd_ps(wv[r], xv, acc[r][j]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < MR; ++j) out[(m + j) * N + n + r] = reduce16_avx512(acc[r][j]);
}

// bf16 with AVX512_BF16: vdpbf16ps multiplies 32 bf16 pairs and accumulates into 16
// fp32 lanes, so weights are used as stored, with no widening. Per (m, n) the
// sequence of operations is still fixed, so batch invariance holds (this path exists
// only on AVX512_BF16 CPUs; elsewhere bf16 goes to torch).
template <int NR, int MR>
inline void block_bf16(const int16_t* x, const int16_t* w, int16_t* out, int64_t K,
                       int64_t N, int64_t n, int64_t m) {
  __m512 acc[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < MR; ++j) acc[r][j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512bh wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = (__m512bh)_mm512_loadu_si512(w + (n + r) * K + k);
    for (int j = 0; j < MR; ++j) {
      __m512bh xv = (__m512bh)_mm512_loadu_si512(x + (m + j) * K + k);
      for (int r = 0; r < NR; ++r) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], wv[r], xv);
    }
  }
  if (k < K) {
    __mmask32 mask = __mmask32((uint64_t(1) << (K - k)) - 1);
    __m512bh wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + (n + r) * K + k);
    for (int j = 0; j < MR; ++j) {
      __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + (m + j) * K + k);
      for (int r = 0; r < NR; ++r) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], wv[r], xv);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < MR; ++j) BF16::store(out + (m + j) * N + n + r, reduce16_avx512(acc[r][j]));
}

// Inputs in blocks of 4, then the 1-3 left over (blk(MR, m) computes rows [m, m+MR)).
template <class B>
inline void rows_m(int64_t M, B blk) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) blk(std::integral_constant<int, 4>{}, m);
  switch (M - m) {
    case 3: blk(std::integral_constant<int, 3>{}, m); break;
    case 2: blk(std::integral_constant<int, 2>{}, m); break;
    case 1: blk(std::integral_constant<int, 1>{}, m); break;
    default: break;
  }
}

void range_f32_avx512(const float* x, const float* w, float* out, int64_t M, int64_t K,
                      int64_t N, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4)
    rows_m(M, [&](auto mr, int64_t m) { block_512<4, decltype(mr)::value>(x, w, out, K, N, n, m); });
  for (; n < n1; ++n)
    rows_m(M, [&](auto mr, int64_t m) { block_512<1, decltype(mr)::value>(x, w, out, K, N, n, m); });
}

void range_bf16_avx512(const int16_t* x, const int16_t* w, int16_t* out, int64_t M,
                       int64_t K, int64_t N, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4)
    rows_m(M, [&](auto mr, int64_t m) { block_bf16<4, decltype(mr)::value>(x, w, out, K, N, n, m); });
  for (; n < n1; ++n)
    rows_m(M, [&](auto mr, int64_t m) { block_bf16<1, decltype(mr)::value>(x, w, out, K, N, n, m); });
}

#pragma GCC pop_options

// ---------------------------------------------------------------- AVX2 --------------
#pragma GCC push_options
#pragma GCC target("avx2,fma")

inline float reduce8x2_avx2(__m256 lo, __m256 hi) {
  const __m256 t8 = _mm256_add_ps(lo, hi);
  const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
  return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
}

// The AVX-512 accumulator emulated: a[0] holds lanes 0-7, a[1] lanes 8-15. 2 rows x 2
// inputs keep 8 accumulators in the 16 ymm registers.
template <int NR, int MR>
inline void block_256(const float* x, const float* w, float* out, int64_t K, int64_t N,
                      int64_t n, int64_t m) {
  __m256 acc[NR][MR][2];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < MR; ++j) acc[r][j][0] = acc[r][j][1] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m256 wv[NR][2];
    for (int r = 0; r < NR; ++r)
      for (int h = 0; h < 2; ++h) wv[r][h] = _mm256_loadu_ps(w + (n + r) * K + k + 8 * h);
    for (int j = 0; j < MR; ++j)
      for (int h = 0; h < 2; ++h) {
        __m256 xv = _mm256_loadu_ps(x + (m + j) * K + k + 8 * h);
        for (int r = 0; r < NR; ++r) acc[r][j][h] = _mm256_fmadd_ps(wv[r][h], xv, acc[r][j][h]);
      }
  }
  if (k < K) {
    const int rem = int(K - k);
    __m256i mask[2];
    for (int h = 0; h < 2; ++h) {
      const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      mask[h] = _mm256_cmpgt_epi32(_mm256_set1_epi32(rem - 8 * h), lane);  // lane < rem - 8h
    }
    __m256 wv[NR][2];
    for (int r = 0; r < NR; ++r)
      for (int h = 0; h < 2; ++h) wv[r][h] = _mm256_maskload_ps(w + (n + r) * K + k + 8 * h, mask[h]);
    for (int j = 0; j < MR; ++j)
      for (int h = 0; h < 2; ++h) {
        __m256 xv = _mm256_maskload_ps(x + (m + j) * K + k + 8 * h, mask[h]);
        for (int r = 0; r < NR; ++r) acc[r][j][h] = _mm256_fmadd_ps(wv[r][h], xv, acc[r][j][h]);
      }
  }
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < MR; ++j) out[(m + j) * N + n + r] = reduce8x2_avx2(acc[r][j][0], acc[r][j][1]);
}

void range_f32_avx2(const float* x, const float* w, float* out, int64_t M, int64_t K,
                    int64_t N, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 2 <= n1; n += 2) {
    int64_t m = 0;
    for (; m + 2 <= M; m += 2) block_256<2, 2>(x, w, out, K, N, n, m);
    if (m < M) block_256<2, 1>(x, w, out, K, N, n, m);
  }
  for (; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) block_256<1, 1>(x, w, out, K, N, n, m);
}

#pragma GCC pop_options

// ---------------------------------------------------------------- scalar ------------
// Lane by lane with fmaf (correctly rounded, as vfmadd is); slow but the same bits.
void range_f32_scalar(const float* x, const float* w, float* out, int64_t M, int64_t K,
                      int64_t N, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) {
      const float* wr = w + n * K;
      const float* xr = x + m * K;
      float acc[16] = {};
      int64_t k = 0;
      for (; k + 16 <= K; k += 16)
        for (int l = 0; l < 16; ++l) acc[l] = std::fma(wr[k + l], xr[k + l], acc[l]);
      if (k < K)
        for (int l = 0; l < 16; ++l) {
          const bool in = k + l < K;
          acc[l] = std::fma(in ? wr[k + l] : 0.0f, in ? xr[k + l] : 0.0f, acc[l]);
        }
      out[m * N + n] = reduce16_scalar(acc);
    }
}

template <class F>
void split_rows(int64_t N, unsigned threads, F fn) {
  rs::Pool& p = pool();
  const int64_t parts = std::max(1u, std::min(threads, p.parts()));
  // Split output rows evenly in multiples of 4 so that each thread streams its own
  // contiguous slice of W.
  const int64_t per = ((N + parts - 1) / parts + 3) / 4 * 4;
  p.run(unsigned(parts), [&](unsigned part) {
    const int64_t n0 = std::min<int64_t>(N, int64_t(part) * per);
    const int64_t n1 = std::min<int64_t>(N, n0 + per);
    if (n0 < n1) fn(n0, n1);
  });
}

template <class T>
using Mat = nb::ndarray<T, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

template <class T>
void check_shapes(const Mat<const T>& x, const Mat<const T>& w, const Mat<T>& out) {
  if (w.shape(1) != x.shape(1) || out.shape(0) != x.shape(0) || out.shape(1) != w.shape(0))
    throw std::invalid_argument("linear_small: shapes must be x[M,K], w[N,K], out[M,N]");
}

void bind_f32(Mat<const float> x, Mat<const float> w, Mat<float> out, unsigned threads, int isa) {
  check_shapes(x, w, out);
  rs::require_isa(isa);
  const int64_t M = x.shape(0), K = x.shape(1), N = w.shape(0);
  const float *xp = x.data(), *wp = w.data();
  float* op = out.data();
  nb::gil_scoped_release release;
  split_rows(N, threads, [&](int64_t n0, int64_t n1) {
    if (rs::isa_avx512(isa)) range_f32_avx512(xp, wp, op, M, K, N, n0, n1);
    else if (rs::isa_avx2(isa)) range_f32_avx2(xp, wp, op, M, K, N, n0, n1);
    else range_f32_scalar(xp, wp, op, M, K, N, n0, n1);
  });
}

void bind_bf16(Mat<const int16_t> x, Mat<const int16_t> w, Mat<int16_t> out, unsigned threads) {
  check_shapes(x, w, out);
  if (!rs::cpu_has_isa(rs::kAvx512) || !__builtin_cpu_supports("avx512bf16"))
    throw std::invalid_argument("linear_bf16: needs AVX512_BF16");
  const int64_t M = x.shape(0), K = x.shape(1), N = w.shape(0);
  const int16_t *xp = x.data(), *wp = w.data();
  int16_t* op = out.data();
  nb::gil_scoped_release release;
  split_rows(N, threads, [&](int64_t n0, int64_t n1) {
    range_bf16_avx512(xp, wp, op, M, K, N, n0, n1);
  });
}

// The machine's streaming read as the products read their weights (a benchmark's
// ceiling, bench/common/machine.py): `threads` contiguous parts, each line of 64 bytes
// loaded once, software prefetch kStreamAhead bytes ahead (a plain read without it stays
// well below what the prefetching products reach on some CPUs). Returns the XOR of the
// 64-bit words of the buffer's whole 64-byte lines (a tail shorter than a line is not
// read), so that no load is optimized away.
constexpr int64_t kStreamAhead = 8192;

uint64_t stream_read(nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> buf,
                     unsigned threads) {
  const uint8_t* p = buf.data();
  const int64_t lines = int64_t(buf.shape(0)) / 64;
  const unsigned parts = std::max(1u, threads);
  std::vector<uint64_t> acc(size_t(parts) * 8, 0);  // a cache line apart per part
  {
    nb::gil_scoped_release release;
    rs::split_parts(lines, parts, [&](unsigned part, int64_t a, int64_t b) {
      uint64_t x = 0;
      for (int64_t l = a; l < b; ++l) {
        const uint8_t* line = p + l * 64;
        __builtin_prefetch(line + kStreamAhead);  // (past the end: a hint, never a fault)
        uint64_t w[8];
        std::memcpy(w, line, sizeof(w));
        x ^= w[0] ^ w[1] ^ w[2] ^ w[3] ^ w[4] ^ w[5] ^ w[6] ^ w[7];
      }
      acc[size_t(part) * 8] = x;
    });
  }
  uint64_t x = 0;
  for (unsigned i = 0; i < parts; ++i) x ^= acc[size_t(i) * 8];
  return x;
}

}  // namespace

NB_MODULE(_kernels, m) {
  m.doc() = "Batch-invariant small-M dense and quantized kernels (AVX-512, AVX2, scalar)";
  m.def("has_avx512", [] { return rs::cpu_has_isa(rs::kAvx512); });
  m.def("has_avx512_bf16", [] {
    return rs::cpu_has_isa(rs::kAvx512) && bool(__builtin_cpu_supports("avx512bf16"));
  });
  m.def("cpu_has_isa", &rs::cpu_has_isa, nb::arg("isa"),
        "Whether this CPU can run path isa (0 scalar, 1 avx2, 2 avx512, 3 avx512+vnni, "
        "4 avx2+vnni, 5 avx2+vnni as EVEX)");
  m.def("max_threads", [] { return pool().parts(); });
  m.def("stream_read", &stream_read, nb::arg("buf").noconvert(), nb::arg("threads"),
        "Read a uint8 buffer once over `threads` parts with software prefetch (the "
        "products' way); returns the XOR of the 64-bit words of its whole 64-byte lines");
  m.def("linear_f32", &bind_f32, nb::arg("x").noconvert(), nb::arg("w").noconvert(),
        nb::arg("out").noconvert(), nb::arg("threads"), nb::arg("isa"));
  m.def("linear_bf16", &bind_bf16, nb::arg("x").noconvert(), nb::arg("w").noconvert(),
        nb::arg("out").noconvert(), nb::arg("threads") = 1,
        "bf16 data passed as int16 views; AVX512_BF16 only");
  register_qkernels(m);
  register_qrepack(m);
  register_native(m);
  register_sampling(m);
}
