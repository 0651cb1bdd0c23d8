// Dynamic suffix automaton for one request: extended token by token with the
// prompt and then each accepted token. Small, so transitions are per-state sorted
// vectors. It keeps the token sequence, so drafts copy continuations from it.
//
// Self-match invariant (the subtlety of matching a text against its own SAM):
// after extending with token t_i, the longest suffix of t_0..t_i that also occurs
// ending *earlier* (at a position < i) is exactly the longest string of
// link(last): the suffix-link of the state of the whole text is, by definition,
// the longest suffix whose endpos differs from {i}, i.e. that occurs before i.
// So the request's own cursor is {link(last), len(link(last))} — computed for free
// by the construction, never "matching itself" trivially.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "sam/sam_common.h"

namespace recallspec {

class DynamicSam {
 public:
  static constexpr bool kMayGrow = true;

  DynamicSam() { new_state(0, kNone, kNone, false); }

  uint32_t root() const { return 0; }
  uint32_t len(uint32_t s) const { return st_[s].len; }
  uint32_t link(uint32_t s) const { return st_[s].link; }
  uint32_t firstpos(uint32_t s) const { return st_[s].firstpos; }
  uint32_t count(uint32_t s) const {
    if (counts_dirty_) recount();
    return cnt_[s];
  }
  uint32_t next(uint32_t s, uint32_t tok) const {
    const auto& e = st_[s].edges;
    auto it = std::lower_bound(e.begin(), e.end(), uint64_t(tok) << 32);
    return (it != e.end() && uint32_t(*it >> 32) == tok) ? uint32_t(*it) : kNone;
  }
  template <class F>
  void for_each_edge(uint32_t s, F&& f) const {
    for (uint64_t e : st_[s].edges) f(uint32_t(e >> 32), uint32_t(e));
  }

  size_t size() const { return text_.size(); }
  size_t n_states() const { return st_.size(); }
  const std::vector<uint32_t>& text() const { return text_; }

  void extend(uint32_t tok) {
    const uint32_t pos = uint32_t(text_.size());
    text_.push_back(tok);
    counts_dirty_ = true;
    const uint32_t cur = new_state(st_[last_].len + 1, kNone, pos, true);
    uint32_t p = last_, q = kNone;
    while (p != kNone && (q = next(p, tok)) == kNone) {
      set(p, tok, cur);
      p = st_[p].link;
    }
    if (p == kNone) {
      st_[cur].link = 0;
    } else if (st_[p].len + 1 == st_[q].len) {
      st_[cur].link = q;
    } else {
      const uint32_t cl = new_state(st_[p].len + 1, st_[q].link, st_[q].firstpos, false);
      st_[cl].edges = st_[q].edges;
      for (; p != kNone && next(p, tok) == q; p = st_[p].link) set(p, tok, cl);
      st_[q].link = cl;
      st_[cur].link = cl;
    }
    last_ = cur;
  }

  // The request's own cursor (see the invariant above).
  Cursor self_cursor() const {
    uint32_t s = st_[last_].link;
    if (s == kNone) return Cursor{0, 0};  // empty text
    return Cursor{s, st_[s].len};
  }

  // Up to n tokens following the earliest occurrence of the cursor's string. When
  // fewer than n follow it (the occurrence is near the end of the text), climb
  // suffix links: shorter suffixes occur no later, so more tokens follow them.
  int64_t draft_chain(const Cursor& c, int64_t n, int64_t* out) const {
    if (c.length == 0 || n <= 0) return 0;
    uint32_t s = c.state;
    while (s != 0 && c.length <= st_[st_[s].link].len) s = st_[s].link;  // normalise
    const uint64_t end = text_.size();
    while (end - 1 - st_[s].firstpos < uint64_t(n) && st_[s].link != 0) s = st_[s].link;
    uint64_t p = uint64_t(st_[s].firstpos) + 1;
    int64_t k = 0;
    while (k < n && p < end) out[k++] = text_[p++];
    return k;
  }

 private:
  struct State {
    uint32_t len, link, firstpos;
    bool own;                     // created for a position (not a clone): counts 1 occurrence
    std::vector<uint64_t> edges;  // (token << 32) | target, sorted
  };
  uint32_t new_state(uint32_t len, uint32_t link, uint32_t firstpos, bool own) {
    st_.push_back(State{len, link, firstpos, own, {}});
    return uint32_t(st_.size() - 1);
  }
  void set(uint32_t s, uint32_t tok, uint32_t tgt) {
    auto& e = st_[s].edges;
    const uint64_t v = (uint64_t(tok) << 32) | tgt;
    auto it = std::lower_bound(e.begin(), e.end(), uint64_t(tok) << 32);
    if (it != e.end() && uint32_t(*it >> 32) == tok) *it = v;
    else e.insert(it, v);
  }
  // Occurrence counts are recomputed lazily (O(states)) when asked after growth.
  void recount() const {
    const size_t S = st_.size();
    cnt_.assign(S, 0);
    std::vector<uint32_t> bucket(text_.size() + 2, 0), order(S);
    for (size_t s = 0; s < S; ++s) {
      cnt_[s] = st_[s].own ? 1 : 0;
      ++bucket[st_[s].len + 1];
    }
    for (size_t i = 1; i < bucket.size(); ++i) bucket[i] += bucket[i - 1];
    for (size_t s = 0; s < S; ++s) order[bucket[st_[s].len]++] = uint32_t(s);
    for (size_t i = S; i-- > 1;) cnt_[st_[order[i]].link] += cnt_[order[i]];
    counts_dirty_ = false;
  }

  std::vector<State> st_;
  std::vector<uint32_t> text_;
  uint32_t last_ = 0;
  mutable std::vector<uint32_t> cnt_;
  mutable bool counts_dirty_ = false;
};

}  // namespace recallspec
