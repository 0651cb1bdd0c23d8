// Peak throughput of this CPU's 512-bit integer dot (vpdpbusd: 64 u8 x s8 products per
// instruction) and fp32 FMA on one core: the ceilings issue 18's profile compares the
// quantized GEMM and attention with. Feeds the notebook docs/history/benchmarks_2026-11.md,
// "Profile of one step (native forward, SmolLM2, 200 cached tokens, idle machine)": its
// "What bounds k = 16" parts.
//
//   g++ -O2 -march=native -o /tmp/vnni_peak benchmarks/kernels/vnni_peak.cpp && /tmp/vnni_peak
//
// (Needs AVX-512 VNNI. 12 independent accumulators hide the instructions' latency; the
// empty asm keeps the compiler from folding the loop. Run both cores at once with
// `/tmp/vnni_peak & /tmp/vnni_peak; wait` to see whether they share the units.)
#include <immintrin.h>

#include <chrono>
#include <cstdio>

int main() {
  constexpr long kIters = 200000000;
  constexpr int kAcc = 12;
  __m512i a[kAcc];
  for (int i = 0; i < kAcc; ++i) a[i] = _mm512_set1_epi32(i);
  __m512i w = _mm512_set1_epi8(3);
  const __m512i x = _mm512_set1_epi8(5);
  auto t0 = std::chrono::steady_clock::now();
  for (long n = 0; n < kIters; ++n) {
#pragma GCC unroll 12
    for (int i = 0; i < kAcc; ++i) a[i] = _mm512_dpbusd_epi32(a[i], w, x);
    __asm__ volatile("" : "+v"(w));
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int sink = 0;
  for (int i = 0; i < kAcc; ++i) sink += _mm512_reduce_add_epi32(a[i]);
  std::printf("vpdpbusd zmm: %.3g /s = %.0f GMAC/s per core (sink %d)\n", kIters * kAcc / s,
              kIters * kAcc * 64 / s / 1e9, sink);

  __m512 f[kAcc];
  for (int i = 0; i < kAcc; ++i) f[i] = _mm512_set1_ps(float(i));
  __m512 fw = _mm512_set1_ps(1.0001f);
  const __m512 fx = _mm512_set1_ps(0.9999f);
  t0 = std::chrono::steady_clock::now();
  for (long n = 0; n < kIters; ++n) {
#pragma GCC unroll 12
    for (int i = 0; i < kAcc; ++i) f[i] = _mm512_fmadd_ps(f[i], fw, fx);
    __asm__ volatile("" : "+v"(fw));
  }
  s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  float fsink = 0.0f;
  for (int i = 0; i < kAcc; ++i) fsink += _mm512_reduce_add_ps(f[i]);
  std::printf("fma zmm fp32: %.3g /s = %.0f GFMA/s per core (sink %g)\n", kIters * kAcc / s,
              kIters * kAcc * 16 / s / 1e9, fsink);
}
