// The structure of one native forward (native_forward.cpp): the arguments as the Python
// side passes them, validated once, and, per attention kind (global or a window size),
// the keys each row sees. Pure bookkeeping: no float arithmetic.
//
// Visibility (runtime/attention.py is the reference): row i of sequence b (c cached
// keys, query position p = positions[row]) sees
//   * cached key k < c when it is real (cache_valid, padded-KV mode) and, for a window W,
//     p - pos(k) < W, pos(k) = k or, with padding, the count of real keys before k;
//   * new row j of its sequence (cache position c + j) when j is i or an ancestor of i,
//     and, for a window, p - positions[j] < W.
// Keys are listed in increasing cache position; a chain's keys form one range.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "native/native_ops.h"

namespace nf {

struct BatchArgs {
  const int64_t *ids, *positions, *parents, *logits_rows;  // [T], [T], [T], [R]
  int64_t T, R;
  std::vector<int64_t> query_start, slots, cache_lens;  // [B+1], [B], [B]
  std::vector<const bool*> valid;                       // [B] or empty; nullptr: no padding
};

// K and V: [layers, slots, kv_heads, max_len, head_dim] of float32, or of IEEE binary16
// bits when half (written rounded to nearest even, read back exactly: Ops::to_half).
struct CacheArgs {
  void *k, *v;
  int64_t layers, slots, kv_heads, max_len, head_dim;
  bool half = false;
  int64_t offset(int64_t layer, int64_t slot, int64_t head, int64_t pos) const {
    return (((layer * slots + slot) * kv_heads + head) * max_len + pos) * head_dim;
  }
};

struct RopeArgs {  // one cos and one sin table [rows, rotary dims] per distinct RoPE
  std::vector<const float*> cos, sin;
  int64_t rows = 0;
};

class Plan {
 public:
  // Consecutive rows of one sequence whose keys start at the same lo (<= kMaxAttnRows):
  // attention takes them together (AttnBlock), sharing the loads of their common keys.
  struct RowBlock {
    int64_t t, rows, cost;  // first row, rows, their keys + 1 each
  };
  struct Kind {
    int32_t window = 0;
    std::vector<int32_t> lo, hi, off, cnt;  // per row: Keys{lo, hi, list + off, cnt}
    std::vector<int32_t> list;
    std::vector<RowBlock> blocks;
    int64_t total_keys = 0;
    Keys keys(int64_t t) const {
      return Keys{lo[size_t(t)], hi[size_t(t)], list.data() + off[size_t(t)], cnt[size_t(t)]};
    }
    // Boundaries of the items (block b, head group g) = b * groups + g for `parts`
    // threads, balanced by key counts.
    std::vector<int64_t> cuts(int64_t groups, unsigned parts) const;
  };

  // Validates every index the forward will use (throws std::invalid_argument) and
  // builds the keys of each row for each distinct window in `windows` (0 = global).
  void build(const BatchArgs& a, const CacheArgs& c, const RopeArgs& r,
             const std::vector<int32_t>& windows, const std::vector<int32_t>& ropes, int64_t vocab);

  int64_t slot(int64_t t) const { return slot_[size_t(t)]; }
  int64_t cache_pos(int64_t t) const { return pos_[size_t(t)]; }
  const Kind& kind(int32_t window) const;

 private:
  void build_kind(Kind& k, const BatchArgs& a);

  std::vector<int32_t> seq_, local_;
  std::vector<int64_t> slot_, pos_;
  std::vector<char> chain_;  // per sequence: a chain with consecutive positions
  std::vector<Kind> kinds_;
  std::vector<int32_t> anc_;  // scratch: one row's ancestors
};

}  // namespace nf
