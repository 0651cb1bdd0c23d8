// REST datastore retrieval: suffix-array range search, longest matching suffix, and the
// most frequent trie nodes of the continuations (recallspec.recall.datastore).
//
// Text: int32 token ids, -1 after every document (the separator); sa: the suffix array of
// the suffixes starting with a token, in lexicographic order of the int32 values (see
// suffix_array.py). The functions are pure and allocate only their scratch space.
#pragma once

#include <cstdint>

namespace recallspec {

struct SaText {
  const int32_t* text;
  int64_t n_text;
  const int32_t* sa;
  int64_t n_sa;
};

// [lo, hi) of the suffix-array entries whose suffix starts with q[0:qn].
void sa_match_range(const SaText& t, const int32_t* q, int64_t qn, int64_t* lo, int64_t* hi);

// The longest suffix of ctx[0:n] (length in [min_q, min(max_q, n)]) occurring in the
// text: its length (0 = none) and suffix-array range. Occurrence is monotone in the
// length, so a binary search over lengths finds it.
int64_t sa_longest_match(const SaText& t, const int32_t* ctx, int64_t n, int64_t min_q,
                         int64_t max_q, int64_t* lo, int64_t* hi);

// conts[k * depth]: the `depth` tokens after up to max_matches entries of sa[lo:hi]
// (evenly spaced over the run when there are more), each entry's suffix continuing
// `offset` tokens past its start; -1 past a document or the text end. Returns k.
int64_t sa_continuations(const SaText& t, int64_t lo, int64_t hi, int64_t offset,
                         int64_t max_matches, int64_t depth, int64_t* conts);

// The max_nodes most frequent nodes of the trie of the rows conts[k][depth] (a row ends
// at its first negative entry), sorted by (count desc, depth asc, token asc, then the
// order of their prefixes): tokens/parents[n] (parent -1 = the root), returns n.
int64_t top_k_trie(const int64_t* conts, int64_t k, int64_t depth, int64_t max_nodes,
                   int64_t* tokens, int64_t* parents);

}  // namespace recallspec
