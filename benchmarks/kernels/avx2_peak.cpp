// Ceilings of the AVX2 product without VNNI on one core (issue 37: "a profile shows what
// bounds it, with the arithmetic floor of this CPU"), the counterpart of vnni_peak.cpp
// for CPUs without VNNI (Zen 3, Intel before Ice Lake). Feeds the notebook
// docs/history/benchmarks_2026-11-27_to_12-01.md, "What bounds the products on a CPU
// without VNNI: the arithmetic floor (issue 37, 2026-11-30 evening)".
//
//   g++ -O2 -mavx2 -mfma -o /tmp/avx2_peak benchmarks/kernels/avx2_peak.cpp && /tmp/avx2_peak
//
// Each loop repeats one instruction pattern of qgemm_avx2_bytes.inc's u4 kernel
// (block_u4x2) on registers and L1 only, with independent accumulators, so its rate is
// the rate the execution units allow:
//   maddubsw       vpmaddubsw alone (32 u8 x s8 products in int16 pairs)
//   int            vpmaddubsw + vpaddw (the int16 running sum), a vpbroadcastd of 4
//                  activations from L1 per two of them: the kernel's inner loop
//   float step     per 8 outputs of a row and sub-block: vpmaddwd by ones (widen),
//                  vcvtdq2ps, vmulps by the row's d, two vfmadd (scale, mins): the
//                  canonical arithmetic of qkernels.h
// and prints the u4 kernel's ceiling: one (row, sub-block of 32, 16 outputs) takes 16 of
// the int pattern's vpmaddubsw and 2 float steps, so 512 multiply-adds take 16 / int +
// 2 / float seconds. The scales' conversion and the nibble split, shared by a block of
// rows, are left out: the ceiling is an upper bound on the kernel.
// (Run both cores at once, `/tmp/avx2_peak & /tmp/avx2_peak; wait`, to see whether they
// share execution units. The loop counter's add and branch ride beside the vector work.)
#include <chrono>
#include <cstdint>
#include <cstdio>

namespace {

constexpr int64_t kIters = 50000000;

// One chunk of block_u4x2's inner loop: 4 activations broadcast from OFF(%1) (ymm0), times
// the two halves' weights (ymm14, ymm15), each product added to an int16 sum (ymmA, ymmB).
#define QK_CHUNK(OFF, A, B)                                                   \
  "vpbroadcastd " OFF "(%1), %%ymm0\n"                                         \
  "vpmaddubsw %%ymm0, %%ymm14, %%ymm1\n vpaddw %%ymm1, %%ymm" A ", %%ymm" A "\n" \
  "vpmaddubsw %%ymm0, %%ymm15, %%ymm2\n vpaddw %%ymm2, %%ymm" B ", %%ymm" B "\n"

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The best of 5 runs of loop(), in instructions (of the pattern's unit) per second.
template <class F>
double best_rate(F loop, double per_iter) {
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const double t = now();
    loop();
    const double d = now() - t;
    if (d < best) best = d;
  }
  return kIters * per_iter / best;
}

}  // namespace

int main() {
  alignas(64) static int32_t acts[16] = {0x01020304, 0x05060708, 0x090a0b0c, 0x0d0e0f10};
  alignas(64) static float dx[16] = {1.0f, 1.0f, 1.0f, 1.0f};

  const double maddubsw = best_rate(
      [] {
        int64_t n = kIters;
        asm volatile(
            "vpxor %%ymm14, %%ymm14, %%ymm14\n vpxor %%ymm15, %%ymm15, %%ymm15\n"
            "1:\n"
            "vpmaddubsw %%ymm14, %%ymm15, %%ymm0\n vpmaddubsw %%ymm14, %%ymm15, %%ymm1\n"
            "vpmaddubsw %%ymm14, %%ymm15, %%ymm2\n vpmaddubsw %%ymm14, %%ymm15, %%ymm3\n"
            "vpmaddubsw %%ymm14, %%ymm15, %%ymm4\n vpmaddubsw %%ymm14, %%ymm15, %%ymm5\n"
            "vpmaddubsw %%ymm14, %%ymm15, %%ymm6\n vpmaddubsw %%ymm14, %%ymm15, %%ymm7\n"
            "dec %0\n jnz 1b\n"
            : "+r"(n)::"xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm14", "xmm15");
      },
      8);

  // Four chunks (QK_CHUNK) per iteration: a broadcast per row and chunk used by both
  // halves, six int16 sums (three rows x two halves) as in block_u4x2.
  const double integer = best_rate(
      [] {
        int64_t n = kIters;
        const int32_t* p = acts;
        asm volatile(
            "vpxor %%ymm14, %%ymm14, %%ymm14\n vpxor %%ymm15, %%ymm15, %%ymm15\n"
            "1:\n" QK_CHUNK("0", "8", "9") QK_CHUNK("4", "10", "11") QK_CHUNK("8", "12", "13")
                QK_CHUNK("12", "8", "9") "dec %0\n jnz 1b\n"
            : "+r"(n)
            : "r"(p)
            : "xmm0", "xmm1", "xmm2", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
      },
      8);

  // Four independent float steps per iteration (the outputs of four (row, half) pairs).
  // The kernel adds each step onto a running sum whose previous step is a sub-block of
  // work away (its latency hidden); here the steps start from fixed sums (ymm4-7) so that
  // no chain runs across iterations and the loop measures throughput, not latency.
  const double fstep = best_rate(
      [] {
        int64_t n = kIters;
        const float* p = dx;
        asm volatile(
            "vpxor %%ymm12, %%ymm12, %%ymm12\n vpxor %%ymm13, %%ymm13, %%ymm13\n"
            "vxorps %%ymm14, %%ymm14, %%ymm14\n vxorps %%ymm15, %%ymm15, %%ymm15\n"
            "vxorps %%ymm4, %%ymm4, %%ymm4\n vxorps %%ymm5, %%ymm5, %%ymm5\n"
            "vxorps %%ymm6, %%ymm6, %%ymm6\n vxorps %%ymm7, %%ymm7, %%ymm7\n"
            "1:\n"
            "vpmaddwd %%ymm12, %%ymm13, %%ymm0\n vpmaddwd %%ymm12, %%ymm13, %%ymm1\n"
            "vpmaddwd %%ymm12, %%ymm13, %%ymm2\n vpmaddwd %%ymm12, %%ymm13, %%ymm3\n"
            "vcvtdq2ps %%ymm0, %%ymm0\n vcvtdq2ps %%ymm1, %%ymm1\n"
            "vcvtdq2ps %%ymm2, %%ymm2\n vcvtdq2ps %%ymm3, %%ymm3\n"
            "vbroadcastss (%1), %%ymm11\n"
            "vmulps %%ymm11, %%ymm0, %%ymm0\n vmulps %%ymm11, %%ymm1, %%ymm1\n"
            "vmulps %%ymm11, %%ymm2, %%ymm2\n vmulps %%ymm11, %%ymm3, %%ymm3\n"
            "vfmadd213ps %%ymm4, %%ymm14, %%ymm0\n vfmadd213ps %%ymm5, %%ymm14, %%ymm1\n"
            "vfmadd213ps %%ymm6, %%ymm14, %%ymm2\n vfmadd213ps %%ymm7, %%ymm14, %%ymm3\n"
            "vbroadcastss 4(%1), %%ymm10\n"
            "vfmadd231ps %%ymm15, %%ymm10, %%ymm0\n vfmadd231ps %%ymm15, %%ymm10, %%ymm1\n"
            "vfmadd231ps %%ymm15, %%ymm10, %%ymm2\n vfmadd231ps %%ymm15, %%ymm10, %%ymm3\n"
            "dec %0\n jnz 1b\n"
            : "+r"(n)
            : "r"(p)
            : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm10", "xmm11", "xmm12", "xmm13",
              "xmm14", "xmm15");
      },
      4);

  // One (row, sub-block of 32, 16 outputs) of block_u4x2 per iteration: 8 chunks of a
  // broadcast and two vpmaddubsw + vpaddw (the two halves), then the two halves' float
  // steps from their int16 sums. ymm8-13: int16 sums; ymm14, ymm15: weights; ymm0-3:
  // temporaries; ymm4, ymm5: fixed float sums (as above); ymm6, ymm7: scales and mins.
  const double mix = best_rate(
      [] {
        int64_t n = kIters;
        const int32_t* p = acts;
        const float* f = dx;
#define QK_STEP(SRC, T)                                                        \
  "vpmaddwd %%ymm3, %%ymm" SRC ", %%ymm" T "\n vcvtdq2ps %%ymm" T ", %%ymm" T "\n" \
  "vmulps (%2), %%ymm" T ", %%ymm" T "\n vfmadd213ps %%ymm4, %%ymm6, %%ymm" T "\n"  \
  "vbroadcastss 4(%2), %%ymm5\n vfmadd231ps %%ymm7, %%ymm5, %%ymm" T "\n"
        asm volatile(
            "vpxor %%ymm14, %%ymm14, %%ymm14\n vpxor %%ymm15, %%ymm15, %%ymm15\n"
            "vpxor %%ymm3, %%ymm3, %%ymm3\n vxorps %%ymm4, %%ymm4, %%ymm4\n"
            "vxorps %%ymm6, %%ymm6, %%ymm6\n vxorps %%ymm7, %%ymm7, %%ymm7\n"
            "1:\n" QK_CHUNK("0", "8", "9") QK_CHUNK("4", "10", "11") QK_CHUNK("8", "12", "13")
                QK_CHUNK("12", "8", "9") QK_CHUNK("16", "10", "11") QK_CHUNK("20", "12", "13")
                    QK_CHUNK("24", "8", "9") QK_CHUNK("28", "10", "11") QK_STEP("12", "1") QK_STEP("13", "2")
            "dec %0\n jnz 1b\n"
            : "+r"(n)
            : "r"(p), "r"(f)
            : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
              "xmm12", "xmm13", "xmm14", "xmm15");
#undef QK_STEP
      },
      512);

  const double ceiling = 512.0 / (16.0 / integer + 2.0 / fstep);
  std::printf("vpmaddubsw ymm alone:            %.2f G/s = %.0f G MAC/s\n", maddubsw / 1e9, maddubsw * 32 / 1e9);
  std::printf("int pattern (with broadcasts):   %.2f G vpmaddubsw/s = %.0f G MAC/s\n", integer / 1e9,
              integer * 32 / 1e9);
  std::printf("float steps (8 outputs each):    %.2f G/s\n", fstep / 1e9);
  std::printf("int then float, one after other: %.0f G MAC/s per core (float steps %.0f%% of its time)\n",
              ceiling / 1e9, 100.0 * (2.0 / fstep) / (16.0 / integer + 2.0 / fstep));
  std::printf("u4 kernel mix (canonical):       %.0f G MAC/s per core\n", mix / 1e9);
}
