// Shared by every kernel of recallspec._kernels: the instruction-set paths and a tiny
// persistent thread pool. The fp32/bf16 linear kernel and the quantized kernels live in
// one module so that one set of workers exists (two pools would spin against each
// other on a 2-core machine).
//
// Invariant: run(n, fn) calls fn(part) exactly once for each part in [0, n) and returns
// after all have finished; the caller runs part 0. Which thread runs a part never
// changes what a kernel computes (each part writes its own outputs, in a fixed order).
#pragma once

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace rs {

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

// One pool per process (an inline function's static is unique within the module).
inline Pool& pool() {
  static Pool p(std::max(1u, std::thread::hardware_concurrency()) - 1);
  return p;
}

// Run fn(p, a, b) on contiguous parts [a, b) of [0, total), part p in thread p: at most
// `parts` parts (and the pool's), each ceil(total / parts) long but the last, none empty;
// a single part runs in the calling thread.
template <class F>
void split_parts(int64_t total, unsigned parts, F&& fn) {
  const int64_t np = std::max<int64_t>(1, std::min<int64_t>({int64_t(parts), int64_t(pool().parts()), total}));
  if (np == 1) {
    if (total > 0) fn(0u, int64_t(0), total);
    return;
  }
  const int64_t per = (total + np - 1) / np;
  pool().run(unsigned(np), [&](unsigned p) {
    const int64_t a = std::min<int64_t>(total, int64_t(p) * per);
    const int64_t b = std::min<int64_t>(total, a + per);
    if (a < b) fn(p, a, b);
  });
}

// split_parts for fn(a, b).
template <class F>
void split(int64_t total, unsigned parts, F&& fn) {
  split_parts(total, parts, [&](unsigned, int64_t a, int64_t b) { fn(a, b); });
}

// Kernel instruction-set paths. The caller names one explicitly (nothing in C++ reads
// the environment); check_isa refuses a path the CPU cannot execute. The VNNI variants
// differ from their base path in the quantized product only (vpdpbusd for the integer
// sums); kAvx2VnniEvex is the AVX-VNNI product encoded as AVX-512 VL instructions, so
// that CPUs with AVX-512 VNNI but not AVX-VNNI (Zen 4) run and test the same code.
enum Isa : int {
  kScalar = 0,
  kAvx2 = 1,
  kAvx512 = 2,
  kAvx512Vnni = 3,
  kAvx2Vnni = 4,
  kAvx2VnniEvex = 5,
  kAvx512Amx = 6,  // kAvx512Vnni with AMX-INT8 tiles for products of 10-32 rows (qgemm_amx.cpp)
};

inline bool isa_avx512(int isa) { return isa == kAvx512 || isa == kAvx512Vnni || isa == kAvx512Amx; }
inline bool isa_avx2(int isa) { return isa == kAvx2 || isa == kAvx2Vnni || isa == kAvx2VnniEvex; }
// The products without VNNI take u8 weights through vpmaddwd on int16 activation pairs
// (widen_pairs).
inline bool isa_widened(int isa) { return isa == kAvx2 || isa == kAvx512; }

// AMX-TILE and AMX-INT8 (CPUID leaf 7, EDX bits 24 and 25).
inline bool cpu_has_amx_int8() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (d >> 24 & 1) && (d >> 25 & 1);
}

// Linux hands a process the (8 KB) tile state only on request (arch_prctl
// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, since 5.16); a CPU with AMX under a kernel
// or hypervisor that refuses it cannot run the tiles. Asked once per process (the
// permission then holds for every thread); the answer never changes.
inline bool amx_permitted() {
  static const bool ok = [] {
#if defined(__linux__) && defined(SYS_arch_prctl)
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
  }();
  return ok;
}

inline bool cpu_has_isa(int isa) {
  switch (isa) {
    case kScalar: return true;
    case kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case kAvx512Vnni: return cpu_has_isa(kAvx512) && __builtin_cpu_supports("avx512vnni");
    case kAvx2Vnni: return cpu_has_isa(kAvx2) && __builtin_cpu_supports("avxvnni");
    case kAvx2VnniEvex: return cpu_has_isa(kAvx2) && cpu_has_isa(kAvx512Vnni);
    case kAvx512Amx:
#ifdef RS_HAVE_AMX  // (CMakeLists.txt: the compiler knows -mamx-tile -mamx-int8)
      return cpu_has_isa(kAvx512Vnni) && cpu_has_amx_int8() && amx_permitted();
#else
      return false;
#endif
    default: return false;
  }
}

inline void require_isa(int isa) {
  if (isa < kScalar || isa > kAvx512Amx)
    throw std::invalid_argument(
        "kernels: isa must be 0 (scalar), 1 (avx2), 2 (avx512), 3 (avx512+vnni), 4 (avx2+vnni), "
        "5 (avx2+vnni, EVEX) or 6 (avx512+vnni+amx)");
  if (!cpu_has_isa(isa))
    throw std::invalid_argument("kernels: this CPU cannot run the requested instruction-set path");
}

}  // namespace rs
