// A/B of the AVX2 (no VNNI) quantized product: an older revision's kernel against this
// checkout's, one thread, in one process, alternating calls (best of R each), with
// both checked bit for bit against the scalar path. Random weights in the kernel layout
// (q4k: Q4_K-like u4 with K-quant scales and mins; q6k: 6-bit u8, sb 16, z 32; q40: u4,
// fp16 scales, z 8; q80: u8, z 128), activations quantized by the scalar quantizer.
// Feeds the notebook docs/history/benchmarks_2026-11-27_to_12-01.md, "AVX2 without VNNI:
// byte products that share their broadcasts (issue 37, 2026-11-29 morning)" and "What
// bounds the products on a CPU without VNNI: the arithmetic floor (issue 37, 2026-11-30
// evening)".
//
//   mkdir -p /tmp/base/qgemm
//   for f in qgemm_avx2.inc qgemm_avx2_bytes.inc qkernels.h; do
//     git show REV:csrc/qgemm/$f > /tmp/base/qgemm/$f; done
//   printf '#define QK_VNNI 0\n#define QK_GEMM gemm_base\n#include "qgemm/qgemm_avx2.inc"\n' > /tmp/base/base.cpp
//   F="-O3 -ffp-contract=off -mavx2 -mfma -mf16c"
//   g++ $F -I/tmp/base -c /tmp/base/base.cpp -o /tmp/base.o
//   g++ $F -Icsrc benchmarks/kernels/qgemm_ab.cpp /tmp/base.o csrc/qgemm/qgemm_avx2.cpp csrc/qgemm/qkernel_scalar.cpp -o /tmp/qgemm_ab
//   /tmp/qgemm_ab q4k 256 2048 50     # FORMAT N K REPEATS (256 x 2048 stays in L2)
//   /tmp/qgemm_ab q4k where 10        # this checkout's kernel from L1 to memory (where())
//
// (Every file of REV's kernel comes from REV: until 2026-11-30 this build took the
// working tree's qgemm_avx2_bytes.inc for the base too, so an A/B of a change in that
// file compared it with itself. REV's kernel must agree with this checkout's qkernels.h
// on QW and QX.) Prints per row
// count the ms and G MAC/s of both and "ok" where both match the scalar bits. Run it
// alone on the machine.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "qgemm/qkernels.h"

namespace qk {
void gemm_base(const QW& w, const QX& x, float* out, int64_t ldo, int64_t g0, int64_t g1);
}
using namespace qk;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Mat {
  std::vector<uint8_t> qs, sc, mn;
  std::vector<int32_t> z;
  QW w;
};

// Scales (or mins, negative d) in w's format: small positive fp16 d, K-quant sc bytes.
void fill_scales(const std::string& fmt, const QW& w, std::vector<uint8_t>& v, bool neg, std::mt19937& rng) {
  auto h = [&](float f) { return uint16_t(_cvtss_sh((neg ? -1 : 1) * f, 0)); };
  if (w.sfmt == kKS) {
    const int64_t tile = ks_tile_bytes(w.sb);
    for (int64_t t = 0; t < int64_t(v.size()) / tile; ++t) {
      for (int r = 0; r < 16; ++r) {
        const uint16_t d = h(0.001f + float(rng() % 1000) * 1e-5f);
        std::memcpy(&v[t * tile + 2 * r], &d, 2);
      }
      for (int64_t i = 32; i < tile; ++i) v[t * tile + i] = uint8_t(fmt == "q6k" ? rng() % 255 - 127 : rng() % 64);
    }
    return;
  }
  for (size_t i = 0; i + 1 < v.size(); i += 2) {
    const uint16_t d = h(0.001f + float(rng() % 1000) * 1e-5f);
    std::memcpy(&v[i], &d, 2);
  }
}

Mat make(const std::string& fmt, int64_t n, int64_t k, std::mt19937& rng) {
  Mat m;
  QW& w = m.w;
  w = QW{};
  w.n = n;
  w.k = k;
  w.groups = (n + 15) / 16;
  w.u4 = fmt == "q4k" || fmt == "q40";
  w.sb = fmt == "q6k" ? 16 : 32;
  w.sfmt = fmt == "q4k" || fmt == "q6k" ? kKS : kF16;
  w.u6 = fmt == "q6k";  // (what QSeg finds for 6-bit bytes)
  m.qs.resize(w.groups * w.nsb() * w.sb_bytes());
  for (auto& b : m.qs) b = uint8_t(fmt == "q6k" ? rng() % 64 : rng() & 0xFF);
  m.sc.resize(w.scale_bytes());
  fill_scales(fmt, w, m.sc, false, rng);
  if (fmt == "q4k") {
    m.mn.resize(w.scale_bytes());
    fill_scales(fmt, w, m.mn, true, rng);
  } else {
    m.z.assign(w.groups * 16, fmt == "q6k" ? 32 : fmt == "q40" ? 8 : 128);
  }
  w.qs = m.qs.data();
  w.scale = m.sc.data();
  w.mins = m.mn.empty() ? nullptr : m.mn.data();
  w.zero = m.z.empty() ? nullptr : m.z.data();
  return m;
}

struct Act {
  std::vector<int8_t> q;
  std::vector<int16_t> qw;
  std::vector<float> d, dxs;
  std::vector<int32_t> xs;
  QX x;
};

Act activations(int64_t rows, int64_t k, int sb, std::mt19937& rng) {
  Act a;
  std::vector<float> f(rows * k);
  std::normal_distribution<float> nd;
  for (auto& v : f) v = nd(rng);
  a.q.resize(rows * k);
  a.qw.resize(rows * k);
  a.d.resize(rows * k / 32);
  a.xs.resize(rows * k / sb);
  a.dxs.resize(rows * k / sb);
  const QXBuf b{a.q.data(), a.qw.data(), a.d.data(), a.xs.data(), a.dxs.data()};
  quantize_scalar(f.data(), k, k, sb, 0, rows, b);
  widen_pairs(b, k, 0, rows);
  a.x = QX{a.q.data(), a.qw.data(), a.d.data(), a.xs.data(), a.dxs.data(), rows, k, sb};
  return a;
}

}  // namespace

// `FORMAT where REPEATS`: this checkout's kernel alone on matrices of 16, 256, 4096 and
// 32768 x 2048 (in L1, L2, L3 and memory on a Zen 3) for 6, 12 and 64 input rows, the
// sizes alternating within each repeat (best of REPEATS each): what the memory hierarchy
// costs the product.
static int where(const std::string& fmt, int reps) {
  const int64_t k = 2048, ns[] = {16, 256, 4096, 32768};
  std::mt19937 rng(1);
  std::vector<Mat> mats;
  for (const int64_t n : ns) mats.push_back(make(fmt, n, k, rng));
  std::vector<float> out(64 * 32768);
  for (const int rows : {6, 12, 64}) {
    const Act a = activations(rows, k, mats[0].w.sb, rng);
    double best[4] = {1e30, 1e30, 1e30, 1e30};
    for (int r = 0; r < reps; ++r)
      for (int i = 0; i < 4; ++i) {
        // Small matrices run several times per timing (at least 1/64 of the largest's work).
        const int inner = int(std::min<int64_t>(64, 32768 / ns[i]));
        const double t = now();
        for (int z = 0; z < inner; ++z) gemm_avx2(mats[i].w, a.x, out.data(), ns[i], 0, mats[i].w.groups);
        best[i] = std::min(best[i], (now() - t) / inner);
      }
    std::printf("%s rows %2d, G MAC/s:", fmt.c_str(), rows);
    for (int i = 0; i < 4; ++i) std::printf("  %ld x %ld %6.1f", long(ns[i]), long(k), double(rows) * ns[i] * k / best[i] / 1e9);
    std::printf("\n");
  }
  return 0;
}

int main(int argc, char** argv) {
  const std::string fmt = argc > 1 ? argv[1] : "q4k";
  if (fmt != "q4k" && fmt != "q6k" && fmt != "q40" && fmt != "q80") {
    std::fprintf(stderr, "format: q4k, q6k, q40 or q80\n");
    return 2;
  }
  if (argc > 2 && std::string(argv[2]) == "where") return where(fmt, argc > 3 ? std::max(1, std::atoi(argv[3])) : 10);
  const int64_t n = argc > 2 ? std::atol(argv[2]) : 256, k = argc > 3 ? std::atol(argv[3]) : 2048;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 20;
  if (n <= 0 || k <= 0 || k % 256 || reps <= 0) {
    std::fprintf(stderr, "need N > 0, K a multiple of 256, REPEATS > 0\n");
    return 2;
  }
  std::mt19937 rng(1);
  const Mat m = make(fmt, n, k, rng);
  for (const int rows : {1, 2, 3, 4, 5, 6, 7, 8, 16, 64}) {
    const Act a = activations(rows, k, m.w.sb, rng);
    std::vector<float> base(rows * n), cand(rows * n), ref(rows * n);
    gemm_scalar(m.w, a.x, ref.data(), n, 0, m.w.groups);
    double tb = 1e30, tc = 1e30;
    for (int r = 0; r < reps; ++r) {
      double t = now();
      gemm_base(m.w, a.x, base.data(), n, 0, m.w.groups);
      tb = std::min(tb, now() - t);
      t = now();
      gemm_avx2(m.w, a.x, cand.data(), n, 0, m.w.groups);
      tc = std::min(tc, now() - t);
    }
    const size_t bytes = sizeof(float) * rows * n;
    const bool ok = !std::memcmp(base.data(), ref.data(), bytes) && !std::memcmp(cand.data(), ref.data(), bytes);
    const double mac = double(rows) * double(n) * double(k);
    std::printf("%s %ldx%ld rows %2d: base %8.3f ms %6.1f G MAC/s | new %8.3f ms %6.1f G MAC/s | %.2fx %s\n",
                fmt.c_str(), long(n), long(k), rows, tb * 1e3, mac / tb / 1e9, tc * 1e3, mac / tc / 1e9,
                tb / tc, ok ? "ok" : "BITS DIFFER");
  }
}
