// Shared pieces of both suffix automata: sentinels, the match cursor
// (SAM-Decoding's Algorithm 1) and best-first tree drafts.
//
// An automaton type A provides: root(), len(s), link(s), firstpos(s), count(s),
// next(s, tok) (kNone if absent), for_each_edge(s, f(tok, target)), and
// kMayGrow (true when states can be cloned while a cursor points into it).
#pragma once
#include <cstdint>
#include <queue>
#include <vector>

namespace recallspec {

constexpr uint32_t kNone = 0xFFFFFFFFu;  // "no state" / absent transition
constexpr uint32_t kSep = 0xFFFFFFFFu;   // document separator in the stored text; never a token

// Longest suffix of the text fed so far that occurs in the automaton.
// Invariant: `length` == 0 iff state == root; otherwise the matched string has
// length `length` and belongs to `state`, i.e. len(link(state)) < length <= len(state).
struct Cursor {
  uint32_t state = 0;
  uint32_t length = 0;
};

template <class A>
inline void cursor_normalize(const A& a, Cursor& c) {
  // Only needed for a growing automaton: cloning may have split the cursor's state,
  // moving the shorter strings (ours among them) into a new state on its link path.
  if constexpr (A::kMayGrow) {
    while (c.length > 0 && c.length <= a.len(a.link(c.state))) c.state = a.link(c.state);
  }
}

// One step: O(1) amortized (each link walk shortens the match it later grew).
template <class A>
inline void cursor_advance(const A& a, Cursor& c, uint32_t tok) {
  for (;;) {
    uint32_t nx = a.next(c.state, tok);
    if (nx != kNone) {
      c.state = nx;
      c.length += 1;
      return;
    }
    if (c.state == a.root()) {
      c.length = 0;
      return;
    }
    c.state = a.link(c.state);
    c.length = a.len(c.state);
  }
}

// Best-first draft tree below the matched state: nodes are popped in order of
// occurrence count of (matched string + path), which equals ranking by the product
// of conditional frequencies count(child)/count(parent) along the path. Counts never
// grow along a path, so a parent is always emitted before its children.
// Writes up to max_nodes nodes; returns how many.
template <class A>
int64_t draft_tree(const A& a, const Cursor& c, int64_t max_nodes, int64_t max_depth,
                   int64_t* tokens, int64_t* parents, int64_t* counts) {
  if (c.length == 0 || max_nodes <= 0 || max_depth <= 0) return 0;
  struct Cand {
    uint64_t count;
    uint64_t seq;  // tie-break: earlier discovered first (deterministic)
    uint32_t state, token;
    int64_t parent;
    int64_t depth;
  };
  struct Less {
    bool operator()(const Cand& x, const Cand& y) const {
      return x.count != y.count ? x.count < y.count : x.seq > y.seq;
    }
  };
  std::priority_queue<Cand, std::vector<Cand>, Less> heap;
  uint64_t seq = 0;
  auto push_children = [&](uint32_t s, int64_t parent, int64_t depth) {
    a.for_each_edge(s, [&](uint32_t tok, uint32_t tgt) {
      heap.push(Cand{a.count(tgt), seq++, tgt, tok, parent, depth});
    });
  };
  push_children(c.state, -1, 1);
  int64_t n = 0;
  while (n < max_nodes && !heap.empty()) {
    Cand top = heap.top();
    heap.pop();
    tokens[n] = top.token;
    parents[n] = top.parent;
    if (counts) counts[n] = static_cast<int64_t>(top.count);
    if (top.depth < max_depth) push_children(top.state, n, top.depth + 1);
    ++n;
  }
  return n;
}

}  // namespace recallspec
