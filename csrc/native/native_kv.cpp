// A 16-bit KV cache's widening for the native forward (native_model.h: widen_kv): the
// keys and values that one layer's multi-row attention blocks read, converted exactly to
// float32 once, so that verification and prefill rows (compute-bound: each vector is
// used by every row and head of a block) read floats instead of converting at every load.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/kernel_common.h"
#include "native/native_model.h"

namespace nf {

namespace {

// Below this many floats the widening runs in the calling thread (a fork-join costs
// microseconds).
constexpr size_t kParallelWiden = size_t(1) << 15;

}  // namespace

void NativeModel::widen_kv(const Plan::Kind& kind, const CacheArgs& c, int64_t li,
                           std::vector<Widened>& out) {
  const int64_t Hkv = cfg_.kv_heads, D = cfg_.head_dim;
  out.clear();
  // Per sequence, the union of its blocks' key ranges: from the lowest lo to past the
  // last key any of their rows sees (range part or listed tree keys).
  for (const Plan::RowBlock& b : kind.blocks) {
    if (b.rows < kHalfWidenRows) continue;
    const int64_t lo = kind.keys(b.t).lo;
    int64_t top = lo;
    for (int64_t r = 0; r < b.rows; ++r) {
      const Keys k = kind.keys(b.t + r);
      top = std::max<int64_t>(top, k.cnt ? std::max<int64_t>(k.hi, k.list[k.cnt - 1] + 1) : k.hi);
    }
    const int64_t slot = plan_.slot(b.t);
    auto e = std::find_if(out.begin(), out.end(), [&](const Widened& x) { return x.slot == slot; });
    if (e == out.end()) {
      out.push_back(Widened{slot, lo, top - lo, 0});
    } else {
      const int64_t end = std::max(e->lo + e->n, top);
      e->lo = std::min(e->lo, lo);
      e->n = end - e->lo;
    }
  }
  size_t used = 0;
  for (Widened& e : out) {
    e.at = used;
    used += size_t(2 * Hkv * e.n * D);
  }
  if (kvf_.size() < used) kvf_.resize(used);
  // Tasks (sequence, K or V, kv head), contiguous runs of them per thread.
  const Ops& op = *ops_;
  const int64_t tasks = int64_t(out.size()) * 2 * Hkv;
  auto run = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const Widened& e = out[size_t(t / (2 * Hkv))];
      const int64_t which = t / Hkv % 2, g = t % Hkv;
      const uint16_t* src = static_cast<const uint16_t*>(which ? c.v : c.k) + c.offset(li, e.slot, g, e.lo);
      op.from_half(src, kvf_.data() + e.at + size_t((which * Hkv + g) * e.n * D), e.n * D);
    }
  };
  rs::split(tasks, used < kParallelWiden ? 1u : parts_, run);
}

}  // namespace nf
