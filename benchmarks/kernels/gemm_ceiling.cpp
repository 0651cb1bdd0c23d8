// The ceiling of our quantized product on this CPU (issue 18): qk::gemm_avx512vnni, the
// kernel the native forward runs, on Q4_1 weights (u4, fp16 scales and mins) of 1,024 x
// 576, one thread, for M input rows: with one matrix that stays in cache (the kernel's
// arithmetic alone) and with 320 distinct matrices, 118 MB, streamed from memory as a
// forward streams its layers. Throughput is against the peak vnni_peak.cpp measures
// (pass it as the second argument, GMAC/s per core). Feeds the notebook
// docs/history/benchmarks_2026-11.md, "Profile of one step (native forward, SmolLM2, 200
// cached tokens, idle machine)": the product's own ceiling.
//
//   F="-O3 -ffp-contract=off -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma -mf16c"
//   g++ $F -Icsrc -o /tmp/gemm_ceiling benchmarks/kernels/gemm_ceiling.cpp csrc/qgemm/qgemm_avx512vnni.cpp
//   /tmp/gemm_ceiling "1 6 16" PEAK   # PEAK: vnni_peak's vpdpbusd GMAC/s per core
//
// (Weights and activations are random bytes: the time of integer dots and float steps
// does not depend on their values.)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "qgemm/qkernels.h"

namespace {

constexpr int64_t kN = 1024, kK = 576, kG = kN / 16, kNsb = kK / 32;

struct Matrix {
  std::vector<uint8_t> qs;
  std::vector<uint16_t> scale, mins;
};

// Best seconds of one product (best of 50 timings over all the matrices).
double best_seconds(const std::vector<Matrix>& ms, const qk::QX& x, std::vector<float>& out) {
  const int rounds = ms.size() == 1 ? 100 : 1;  // in cache: many products per timing
  double best = 1e9;
  for (int it = 0; it < 50; ++it) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < rounds; ++r)
      for (const Matrix& m : ms) {
        const qk::QW w{m.qs.data(), m.scale.data(), m.mins.data(), nullptr, kN, kK, kG, 32, true, true};
        qk::gemm_avx512vnni(w, x, out.data(), kN, 0, kG);
      }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s / double(rounds * ms.size()));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::istringstream rows_arg(argc > 1 ? argv[1] : "1 16");
  const double peak = argc > 2 ? std::atof(argv[2]) : 0.0;
  std::mt19937 rng(1);
  auto matrix = [&] {
    Matrix m{std::vector<uint8_t>(size_t(kG * kNsb * 256)), std::vector<uint16_t>(size_t(kG * kNsb * 16), 0x3c00),
             std::vector<uint16_t>(size_t(kG * kNsb * 16), 0x3c00)};
    for (uint8_t& b : m.qs) b = uint8_t(rng());
    return m;
  };
  const std::vector<Matrix> one{matrix()};
  std::vector<Matrix> many;
  for (int i = 0; i < 320; ++i) many.push_back(matrix());
  for (int64_t M; rows_arg >> M;) {
    std::vector<int8_t> q(size_t(M * kK));
    for (int8_t& b : q) b = int8_t(int(rng() % 255) - 127);
    std::vector<float> d(size_t(M * kK / 32), 0.01f), dxs(size_t(M * kNsb), 0.5f), out(size_t(M * kN));
    std::vector<int32_t> xs(size_t(M * kNsb), 3);
    const qk::QX x{q.data(), nullptr, d.data(), xs.data(), dxs.data(), M, kK, 32};
    for (const std::vector<Matrix>* ms : {&one, static_cast<const std::vector<Matrix>*>(&many)}) {
      const double gmac = double(M) * kN * kK / best_seconds(*ms, x, out) / 1e9;
      std::printf("M = %2ld, %s: %6.1f GMAC/s", long(M), ms->size() == 1 ? "in cache " : "streamed ", gmac);
      if (peak > 0) std::printf(" (%.0f%% of %.0f)", 100 * gmac / peak, peak);
      std::printf("\n");
    }
  }
}
