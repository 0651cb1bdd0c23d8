// See suffix_search.h. Semantics are those of the numpy reference they replaced
// (tests/recall/test_datastore.py checks both against brute force).
#include "datastore/suffix_search.h"

#include <algorithm>
#include <numeric>
#include <vector>

namespace recallspec {
namespace {

// Sign of text[pos : pos + qn] vs q as prefixes: a window cut short by the text's end
// compares smaller (as Python's list comparison does).
int compare_at(const SaText& t, int64_t pos, const int32_t* q, int64_t qn) {
  for (int64_t i = 0; i < qn; ++i) {
    if (pos + i >= t.n_text) return -1;
    const int32_t a = t.text[pos + i];
    if (a != q[i]) return a < q[i] ? -1 : 1;
  }
  return 0;
}

}  // namespace

void sa_match_range(const SaText& t, const int32_t* q, int64_t qn, int64_t* lo_out,
                    int64_t* hi_out) {
  int64_t lo = 0, hi = t.n_sa;
  while (lo < hi) {  // first entry >= q
    const int64_t mid = lo + (hi - lo) / 2;
    if (compare_at(t, t.sa[mid], q, qn) < 0) lo = mid + 1; else hi = mid;
  }
  const int64_t first = lo;
  hi = t.n_sa;
  while (lo < hi) {  // first entry > q (as a prefix)
    const int64_t mid = lo + (hi - lo) / 2;
    if (compare_at(t, t.sa[mid], q, qn) <= 0) lo = mid + 1; else hi = mid;
  }
  *lo_out = first;
  *hi_out = lo;
}

int64_t sa_longest_match(const SaText& t, const int32_t* ctx, int64_t n, int64_t min_q,
                         int64_t max_q, int64_t* lo_out, int64_t* hi_out) {
  if (n > max_q) {  // only the last max_q tokens count
    ctx += n - max_q;
    n = max_q;
  }
  int64_t best = 0, best_lo = 0, best_hi = 0;
  int64_t a = min_q, b = n;
  while (a <= b) {
    const int64_t mid = a + (b - a) / 2;
    int64_t lo, hi;
    sa_match_range(t, ctx + (n - mid), mid, &lo, &hi);
    if (hi > lo) {
      best = mid, best_lo = lo, best_hi = hi;
      a = mid + 1;
    } else {
      b = mid - 1;
    }
  }
  *lo_out = best_lo;
  *hi_out = best_hi;
  return best;
}

int64_t sa_continuations(const SaText& t, int64_t lo, int64_t hi, int64_t offset,
                         int64_t max_matches, int64_t depth, int64_t* conts) {
  const int64_t run = hi - lo;
  const int64_t k = run > max_matches ? max_matches : run;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t entry = run > max_matches ? lo + (i * run) / max_matches : lo + i;
    const int64_t start = int64_t(t.sa[entry]) + offset;
    int64_t* row = conts + i * depth;
    bool ended = false;
    for (int64_t d = 0; d < depth; ++d) {
      const int64_t at = start + d;
      const int64_t tok = (ended || at >= t.n_text) ? -1 : int64_t(t.text[at]);
      ended = tok < 0;
      row[d] = tok;
    }
  }
  return k;
}

int64_t top_k_trie(const int64_t* conts, int64_t k, int64_t depth, int64_t max_nodes,
                   int64_t* tokens, int64_t* parents) {
  if (k <= 0 || depth <= 0 || max_nodes <= 0) return 0;
  // Rows' live length (up to their first negative entry).
  std::vector<int64_t> live(k);
  for (int64_t j = 0; j < k; ++j) {
    int64_t d = 0;
    while (d < depth && conts[j * depth + d] >= 0) ++d;
    live[j] = d;
  }
  // Rows in lexicographic order of their live prefixes (a row from a suffix array run
  // comes sorted already). Then the rows sharing a prefix are adjacent, and numbering
  // each depth's nodes in row order numbers them by (parent, token), which is the
  // order the final sort breaks its ties by.
  auto less = [&](int64_t x, int64_t y) {
    const int64_t* a = conts + x * depth;
    const int64_t* b = conts + y * depth;
    const int64_t n = std::min(live[x], live[y]);
    for (int64_t d = 0; d < n; ++d)
      if (a[d] != b[d]) return a[d] < b[d];
    return live[x] < live[y];
  };
  std::vector<int64_t> order(k);
  std::iota(order.begin(), order.end(), 0);
  bool sorted = true;
  for (int64_t j = 1; j < k && sorted; ++j) sorted = !less(order[j], order[j - 1]);
  if (!sorted) std::stable_sort(order.begin(), order.end(), less);

  std::vector<int64_t> node(k, -1);  // each row's node at the current depth (-1: root)
  std::vector<int64_t> tok, par, cnt, dep;
  for (int64_t d = 0; d < depth; ++d) {
    int64_t prev_row = -1;  // the last row alive at this depth
    int64_t prev_parent = -2;
    bool any = false;
    for (int64_t j : order) {
      if (live[j] <= d) continue;
      any = true;
      const int64_t parent = node[j];
      const int64_t token = conts[j * depth + d];
      if (prev_row >= 0 && parent == prev_parent && token == conts[prev_row * depth + d]) {
        node[j] = node[prev_row];
        ++cnt[node[j]];
      } else {
        node[j] = int64_t(tok.size());
        tok.push_back(token);
        par.push_back(parent);
        cnt.push_back(1);
        dep.push_back(d);
      }
      prev_row = j;
      prev_parent = parent;
    }
    if (!any) break;
  }
  const int64_t n_nodes = int64_t(tok.size());
  if (n_nodes == 0) return 0;
  std::vector<int64_t> ids(n_nodes);
  std::iota(ids.begin(), ids.end(), 0);
  const int64_t n = std::min(max_nodes, n_nodes);
  // (A parent has at least its child's count and a smaller depth: it sorts first, so
  // every prefix of the order is a tree.)
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int64_t x, int64_t y) {
    if (cnt[x] != cnt[y]) return cnt[x] > cnt[y];
    if (dep[x] != dep[y]) return dep[x] < dep[y];
    if (tok[x] != tok[y]) return tok[x] < tok[y];
    return x < y;
  });
  std::vector<int64_t> new_index(n_nodes, -1);
  for (int64_t i = 0; i < n; ++i) new_index[ids[i]] = i;
  for (int64_t i = 0; i < n; ++i) {
    tokens[i] = tok[ids[i]];
    const int64_t p = par[ids[i]];
    parents[i] = p < 0 ? -1 : new_index[p];
  }
  return n;
}

}  // namespace recallspec
