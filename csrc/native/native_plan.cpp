// Validation of a native forward's arguments and the keys of every row (native_plan.h).
#include "native/native_plan.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace nf {

namespace {

void need(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("native forward: ") + what);
}

}  // namespace

void Plan::build(const BatchArgs& a, const CacheArgs& c, const RopeArgs& r,
                 const std::vector<int32_t>& windows, const std::vector<int32_t>& ropes,
                 int64_t vocab) {
  const int64_t T = a.T, B = int64_t(a.slots.size());
  need(B >= 1 && int64_t(a.query_start.size()) == B + 1 && int64_t(a.cache_lens.size()) == B,
       "query_start must have B + 1 entries, slots and cache_lens B");
  need(a.valid.empty() || int64_t(a.valid.size()) == B, "valid must be empty or have B entries");
  need(a.query_start[0] == 0 && a.query_start[size_t(B)] == T, "query_start must run from 0 to T");
  need(c.max_len < (int64_t(1) << 30) && T < (int64_t(1) << 30), "sizes beyond int32 positions");
  for (int64_t i = 0; i < a.R; ++i) need(a.logits_rows[i] >= 0 && a.logits_rows[i] < T, "logits row out of range");
  for (int32_t rp : ropes) need(rp >= -1 && (rp < 0 || size_t(rp) < r.cos.size()), "a layer's RoPE table is missing");
  seq_.assign(size_t(T), 0);
  local_.assign(size_t(T), 0);
  slot_.assign(size_t(T), 0);
  pos_.assign(size_t(T), 0);
  chain_.assign(size_t(B), 1);
  std::vector<char> used(size_t(c.slots), 0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q0 = a.query_start[size_t(b)], q1 = a.query_start[size_t(b + 1)];
    const int64_t cl = a.cache_lens[size_t(b)], s = a.slots[size_t(b)];
    need(q1 > q0, "every sequence needs at least one row");
    need(s >= 0 && s < c.slots, "KV-cache slot out of range");
    need(!used[size_t(s)], "two sequences share a KV-cache slot");  // their writes would race
    used[size_t(s)] = 1;
    need(cl >= 0 && cl + (q1 - q0) <= c.max_len, "sequence overflows the KV cache");
    for (int64_t t = q0; t < q1; ++t) {
      const int64_t i = t - q0, p = a.parents[t];
      need(p >= -1 && p < i, "parents must precede their children (local indices)");
      need(a.ids[t] >= 0 && a.ids[t] < vocab, "token id out of range");
      need(a.positions[t] >= 0 && a.positions[t] < r.rows, "position beyond the RoPE table");
      if (p != i - 1 || a.positions[t] != a.positions[q0] + i) chain_[size_t(b)] = 0;
      seq_[size_t(t)] = int32_t(b);
      local_[size_t(t)] = int32_t(i);
      slot_[size_t(t)] = s;
      pos_[size_t(t)] = cl + i;
    }
  }
  std::vector<int32_t> distinct;
  for (int32_t w : windows) {
    need(w >= 0, "window < 0");
    if (std::find(distinct.begin(), distinct.end(), w) == distinct.end()) distinct.push_back(w);
  }
  kinds_.resize(distinct.size());
  for (size_t i = 0; i < distinct.size(); ++i) {
    kinds_[i].window = distinct[i];
    build_kind(kinds_[i], a);
  }
}

void Plan::build_kind(Kind& k, const BatchArgs& a) {
  const int64_t T = a.T, W = k.window;
  k.lo.assign(size_t(T), 0);
  k.hi.assign(size_t(T), 0);
  k.off.assign(size_t(T), 0);
  k.cnt.assign(size_t(T), 0);
  k.list.clear();
  k.blocks.clear();
  k.total_keys = 0;
  auto in_window = [&](int64_t pq, int64_t pk) { return W == 0 || pq - pk < W; };
  for (int64_t t = 0; t < T; ++t) {
    const int64_t b = seq_[size_t(t)], i = local_[size_t(t)];
    const int64_t q0 = a.query_start[size_t(b)], cl = a.cache_lens[size_t(b)];
    const int64_t pq = a.positions[t];
    const bool* valid = a.valid.empty() ? nullptr : a.valid[size_t(b)];
    int64_t lo = 0, hi = 0;
    const size_t off = k.list.size();
    if (valid) {  // padded KV: the real cached keys, by their logical positions
      int64_t logical = -1;
      for (int64_t j = 0; j < cl; ++j) {
        logical += valid[j] ? 1 : 0;
        if (valid[j] && in_window(pq, logical)) k.list.push_back(int32_t(j));
      }
    } else {
      lo = W ? std::clamp<int64_t>(pq - W + 1, 0, cl) : 0;
      hi = cl;
    }
    if (chain_[size_t(b)] && !valid) {
      // New rows j <= i at positions positions[q0] + j: visible when i - j < W.
      const int64_t jlo = W ? std::max<int64_t>(0, i - W + 1) : 0;
      if (lo == hi) {
        lo = cl + jlo;
        hi = cl + i + 1;
      } else if (jlo == 0) {
        hi = cl + i + 1;
      } else {
        for (int64_t j = jlo; j <= i; ++j) k.list.push_back(int32_t(cl + j));
      }
    } else {  // self and ancestors, in increasing local index
      anc_.clear();
      for (int64_t j = i; j >= 0; j = a.parents[q0 + j]) anc_.push_back(int32_t(j));
      for (auto it = anc_.rbegin(); it != anc_.rend(); ++it)
        if (in_window(pq, a.positions[q0 + *it])) k.list.push_back(int32_t(cl + *it));
    }
    k.lo[size_t(t)] = int32_t(lo);
    k.hi[size_t(t)] = int32_t(hi);
    k.off[size_t(t)] = int32_t(off);
    k.cnt[size_t(t)] = int32_t(k.list.size() - off);
    const int64_t n = (hi - lo) + int64_t(k.list.size() - off);
    k.total_keys += n;
    RowBlock* last = k.blocks.empty() ? nullptr : &k.blocks.back();
    if (last && seq_[size_t(last->t)] == b && k.lo[size_t(last->t)] == lo && last->rows < kMaxAttnRows) {
      ++last->rows;
      last->cost += n + 1;
    } else {
      k.blocks.push_back(RowBlock{t, 1, n + 1});
    }
  }
}

const Plan::Kind& Plan::kind(int32_t window) const {
  for (const Kind& k : kinds_)
    if (k.window == window) return k;
  throw std::logic_error("native forward: attention kind not planned");
}

std::vector<int64_t> Plan::Kind::cuts(int64_t groups, unsigned parts) const {
  const int64_t nb = int64_t(blocks.size());
  int64_t total = 0;
  for (const RowBlock& b : blocks) total += b.cost * groups;
  std::vector<int64_t> out(size_t(parts) + 1, nb * groups);
  out[0] = 0;
  int64_t cum = 0;  // cost of the blocks before b
  unsigned p = 1;
  for (int64_t b = 0; b < nb && p < parts; ++b) {
    const int64_t per = blocks[size_t(b)].cost;  // one item's cost
    while (p < parts && cum + per * groups >= total * int64_t(p) / int64_t(parts)) {
      // The cut at the item boundary nearest the target (rounding up gave a whole item
      // to the earlier part: Gemma's k = 16 verification, two blocks of one item each,
      // ran both in one thread).
      const int64_t need_cost = total * int64_t(p) / int64_t(parts) - cum;  // in [0, per * groups]
      out[p++] = b * groups + std::min<int64_t>(groups, (2 * need_cost + per) / (2 * per));
    }
    cum += per * groups;
  }
  for (unsigned q = 1; q <= parts; ++q) out[q] = std::max(out[q], out[q - 1]);
  return out;
}

}  // namespace nf
