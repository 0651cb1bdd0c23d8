// recallspec._kernels: small-M dense products y = x W^T for decoding and verification.
//
// Why: MKL reaches ~12 GB/s on a 1-row fp32 matrix-vector product here and is slower
// for 2-3 rows than for 4, while the machine streams ~25 GB/s. Decoding reads every
// weight once per step, so this kernel streams W once for all M <= 16 rows of x.
//
// Invariant (batch invariance): out[m, n] is computed by the same sequence of
// floating-point operations whatever M is and whichever thread computes it: one
// 16-lane accumulator per (m, n), FMAs in increasing k order, then the same
// horizontal reduction. Verifying k draft tokens therefore gives bit-identical
// logits rows to decoding them one at a time (for these layers).
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

namespace nb = nanobind;

namespace {

// ---- a tiny persistent thread pool: the caller runs part 0, workers the rest ----
class Pool {
  static constexpr int kSpinRounds = 256;
  static constexpr int kPollRounds = 20000;

 public:
  explicit Pool(unsigned n_workers) {
    for (unsigned i = 0; i < n_workers; ++i) workers_.emplace_back([this, i] { loop(i + 1); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      gen_.fetch_add(1);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  unsigned parts() const { return unsigned(workers_.size()) + 1; }

  // Run fn(part) for part in [0, n_parts) (n_parts <= parts()) and wait for all.
  // Workers beyond n_parts wake up and find nothing to do.
  void run(unsigned n_parts, const std::function<void(unsigned)>& fn) {
    if (workers_.empty() || n_parts <= 1) { fn(0); return; }
    active_ = n_parts;
    job_ = &fn;
    pending_.store(unsigned(workers_.size()), std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lk(mu_);
      gen_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    fn(0);
    // Never spin blindly on a worker that may not be scheduled: yield after a moment.
    for (int i = 0; pending_.load(std::memory_order_acquire) != 0; ++i) {
      if (i < kSpinRounds) _mm_pause(); else std::this_thread::yield();
    }
  }

 private:
  void loop(unsigned part) {
    uint64_t seen = 0;
    for (;;) {
      // Decode steps issue many back-to-back calls, so poll for the next job: a short
      // busy spin, then sched_yield (which hands the core to any other runnable thread,
      // so an oversubscribed machine does not stall), then sleep on the condition.
      for (int i = 0; gen_.load(std::memory_order_acquire) == seen && i < kPollRounds; ++i) {
        if (i < kSpinRounds) _mm_pause(); else std::this_thread::yield();
      }
      if (gen_.load(std::memory_order_acquire) == seen) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return gen_.load() != seen; });
      }
      seen = gen_.load(std::memory_order_acquire);
      if (stop_) return;
      if (part < active_) (*job_)(part);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> gen_{0};
  std::atomic<unsigned> pending_{0};
  const std::function<void(unsigned)>* job_ = nullptr;
  unsigned active_ = 1;
  bool stop_ = false;
};

Pool& pool() {
  static Pool p(std::max(1u, std::thread::hardware_concurrency()) - 1);
  return p;
}

// Everything from here to the matching pop_options is AVX-512 code, compiled for
// that target only; callers check has_avx512() first (the Python wrapper does).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,fma")

// ---- loads of 16 lanes as fp32 ----
struct F32 {
  using T = float;
  static inline __m512 load(const float* p) { return _mm512_loadu_ps(p); }
  static inline __m512 load_tail(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
  static inline void store(float* p, float v) { *p = v; }
};
struct BF16 {
  using T = int16_t;
  static inline __m512 widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static inline __m512 load(const int16_t* p) { return widen(_mm256_loadu_si256((const __m256i*)p)); }
  static inline __m512 load_tail(const int16_t* p, __mmask16 m) {
    return widen(_mm256_maskz_loadu_epi16(m, p));
  }
  static inline void store(int16_t* p, float v) {  // round to nearest even
    uint32_t b;
    std::memcpy(&b, &v, 4);
    b += 0x7FFFu + ((b >> 16) & 1u);
    *p = int16_t(uint16_t(b >> 16));
  }
};

// Rows [n0, n1) of out = x W^T. x: [M, K], W: [N, K], out: [M, N] (all row-major).
// Blocks of NR weight rows x MR inputs keep NR*MR accumulators in registers; each
// accumulator sees exactly the same FMA sequence as in any other blocking.
template <class L, int NR, int MR>
inline void block(const typename L::T* x, const typename L::T* w, typename L::T* out,
                  int64_t K, int64_t N, int64_t n, int64_t m) {
  __m512 acc[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < MR; ++j) acc[r][j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = L::load(w + (n + r) * K + k);
    for (int j = 0; j < MR; ++j) {
      __m512 xv = L::load(x + (m + j) * K + k);
      for (int r = 0; r < NR; ++r) acc[r][j] = _mm512_fmadd_ps(wv[r], xv, acc[r][j]);
    }
  }
  if (k < K) {
    __mmask16 mask = __mmask16((1u << (K - k)) - 1);
    __m512 wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = L::load_tail(w + (n + r) * K + k, mask);
    for (int j = 0; j < MR; ++j) {
      __m512 xv = L::load_tail(x + (m + j) * K + k, mask);
      for (int r = 0; r < NR; ++r) acc[r][j] = _mm512_fmadd_ps(wv[r], xv, acc[r][j]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < MR; ++j) L::store(out + (m + j) * N + n + r, _mm512_reduce_add_ps(acc[r][j]));
}

template <class L, int NR>
inline void rows(const typename L::T* x, const typename L::T* w, typename L::T* out,
                 int64_t M, int64_t K, int64_t N, int64_t n) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) block<L, NR, 4>(x, w, out, K, N, n, m);
  switch (M - m) {
    case 3: block<L, NR, 3>(x, w, out, K, N, n, m); break;
    case 2: block<L, NR, 2>(x, w, out, K, N, n, m); break;
    case 1: block<L, NR, 1>(x, w, out, K, N, n, m); break;
    default: break;
  }
}


// bf16 with AVX512_BF16: vdpbf16ps multiplies 32 bf16 pairs and accumulates into 16
// fp32 lanes, so weights are used as stored, with no widening. Per (m, n) the
// sequence of operations is still fixed, so batch invariance holds.
template <int NR, int MR>
inline void block_dp(const int16_t* x, const int16_t* w, int16_t* out,
                     int64_t K, int64_t N, int64_t n, int64_t m) {
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
    for (int j = 0; j < MR; ++j) BF16::store(out + (m + j) * N + n + r, _mm512_reduce_add_ps(acc[r][j]));
}

template <int NR>
inline void rows_dp(const int16_t* x, const int16_t* w, int16_t* out,
                    int64_t M, int64_t K, int64_t N, int64_t n) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) block_dp<NR, 4>(x, w, out, K, N, n, m);
  switch (M - m) {
    case 3: block_dp<NR, 3>(x, w, out, K, N, n, m); break;
    case 2: block_dp<NR, 2>(x, w, out, K, N, n, m); break;
    case 1: block_dp<NR, 1>(x, w, out, K, N, n, m); break;
    default: break;
  }
}

template <class L>
void rows_range(const typename L::T* x, const typename L::T* w, typename L::T* out,
                int64_t M, int64_t K, int64_t N, int64_t n0, int64_t n1) {
  int64_t n = n0;
  if constexpr (std::is_same_v<L, BF16>) {
    for (; n + 4 <= n1; n += 4) rows_dp<4>(x, w, out, M, K, N, n);
    for (; n < n1; ++n) rows_dp<1>(x, w, out, M, K, N, n);
  } else {
    for (; n + 4 <= n1; n += 4) rows<L, 4>(x, w, out, M, K, N, n);
    for (; n < n1; ++n) rows<L, 1>(x, w, out, M, K, N, n);
  }
}

#pragma GCC pop_options

template <class L>
void linear(const typename L::T* x, const typename L::T* w, typename L::T* out,
            int64_t M, int64_t K, int64_t N, unsigned threads) {
  Pool& p = pool();
  const int64_t parts = std::max(1u, std::min(threads, p.parts()));
  // Split output rows evenly in multiples of 4 so that each thread streams its own
  // contiguous slice of W.
  const int64_t per = ((N + parts - 1) / parts + 3) / 4 * 4;
  p.run(unsigned(parts), [&](unsigned part) {
    const int64_t n0 = std::min<int64_t>(N, int64_t(part) * per);
    const int64_t n1 = std::min<int64_t>(N, n0 + per);
    if (n0 < n1) rows_range<L>(x, w, out, M, K, N, n0, n1);
  });
}

template <class T>
using Mat = nb::ndarray<T, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

template <class L>
void bind_linear(Mat<const typename L::T> x, Mat<const typename L::T> w, Mat<typename L::T> out,
                 unsigned threads) {
  const int64_t M = x.shape(0), K = x.shape(1), N = w.shape(0);
  if (w.shape(1) != size_t(K) || out.shape(0) != size_t(M) || out.shape(1) != size_t(N))
    throw std::invalid_argument("linear_small: shapes must be x[M,K], w[N,K], out[M,N]");
  nb::gil_scoped_release release;
  linear<L>(x.data(), w.data(), out.data(), M, K, N, threads);
}

}  // namespace

NB_MODULE(_kernels, m) {
  m.doc() = "Small-M dense kernels (AVX-512), batch-invariant";
  m.def("has_avx512", [] {
    return bool(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl"));
  });
  m.def("has_avx512_bf16", [] { return bool(__builtin_cpu_supports("avx512bf16")); });
  m.def("max_threads", [] { return pool().parts(); });
  m.def("linear_f32", &bind_linear<F32>, nb::arg("x").noconvert(), nb::arg("w").noconvert(), nb::arg("out").noconvert(),
        nb::arg("threads") = 1);
  m.def("linear_bf16", &bind_linear<BF16>, nb::arg("x").noconvert(), nb::arg("w").noconvert(), nb::arg("out").noconvert(),
        nb::arg("threads") = 1, "bf16 data passed as int16/uint16 views");
}
