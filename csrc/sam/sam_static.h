// Static suffix automaton over a corpus of documents.
//
// Construction (StaticSamBuilder): Blumer et al.'s online algorithm, generalised to
// many documents by resetting `last` to the root at every document start (a
// "generalized SAM"). When the next transition already exists we reuse or clone
// its target instead of creating an empty state, which keeps the automaton minimal
// and every state reachable, with at most 2N states. No string crossing a document
// boundary is ever represented, so boundaries break matches without sentinels.
//
// Per state: len, link, firstpos (= min_endpos: earliest end position of its
// strings in the stored text, SAM-Decoding's modification) and count (= |endpos|,
// occurrences). Transitions are built in per-state sorted arrays from a pool with
// power-of-two size classes, plus a dense root table; they are written as CSR.
//
// Stored text positions: documents are laid out back to back with one kSep after
// each, so a chain draft copies text[firstpos+1 ...] until kSep.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/huge_alloc.h"
#include "sam/index_file.h"
#include "sam/sam_common.h"

namespace recallspec {

class StaticSamBuilder {
 public:
  StaticSamBuilder(uint32_t vocab_size, uint64_t expected_tokens);

  // Append documents: tokens[offsets[i]:offsets[i+1]] is document i.
  // Every token must be < vocab_size (checked; throws std::invalid_argument).
  void add_documents(const uint32_t* tokens, size_t n_tokens, const int64_t* offsets, size_t n_off);

  uint64_t n_tokens() const { return n_tokens_; }
  uint64_t n_docs() const { return n_docs_; }
  uint64_t n_states() const { return st_.size(); }
  uint64_t n_edges() const { return n_edges_; }

  // Finalise (counts) and write the index atomically: tmp file, fsync, rename.
  // Returns the file size. The builder is consumed (its memory released).
  uint64_t write(const std::string& path, const std::string& fingerprint,
                 const std::string& metadata);

 private:
  uint32_t new_state(uint32_t len, uint32_t link, uint32_t firstpos);
  uint32_t clone_state(uint32_t q, uint32_t len);
  uint32_t get(uint32_t s, uint32_t tok) const;
  void set(uint32_t s, uint32_t tok, uint32_t target);  // insert or overwrite
  void extend(uint32_t tok, uint32_t pos);
  void finish_counts();

  uint32_t vocab_;
  // Per-state arrays (structure of arrays: the hot loop touches len/link/edges).
  using U32Vec = std::vector<uint32_t, HugeAllocator<uint32_t>>;
  // The fields the construction loop touches together share one 16-byte node (one
  // cache line per visit); firstpos/count are written once and live apart.
  struct Node {
    uint32_t len, link;
    uint32_t eoff, ecnt;  // edges: pool_[eoff : eoff + ecnt]
  };
  std::vector<Node, HugeAllocator<Node>> st_;
  U32Vec firstpos_, count_;
  std::vector<uint64_t, HugeAllocator<uint64_t>> pool_;  // (token << 32) | target, sorted per state
  std::vector<uint32_t> free_[33];                   // free blocks by size class (1 << k edges)
  U32Vec root_next_;                                 // dense root transitions
  U32Vec text_;
  uint32_t last_ = 0;
  uint64_t n_tokens_ = 0, n_docs_ = 0, n_edges_ = 0, max_doc_len_ = 0;
  bool finished_ = false;
};

// Read-only view of an index file (memory-mapped; opening is O(1)).
class StaticSam {
 public:
  static constexpr bool kMayGrow = false;

  StaticSam(const std::string& path, bool verify);

  const IndexHeader& header() const { return *hdr_; }
  uint32_t root() const { return 0; }
  uint32_t len(uint32_t s) const { return len_[s]; }
  // Reads are bounds-checked against the header, so a corrupted payload opened
  // without verify=True gives wrong drafts, never an out-of-bounds access.
  // (and links must shorten, so a corrupted link cycle cannot hang a cursor).
  uint32_t link(uint32_t s) const {
    const uint32_t l = link_[s];
    return l < n_states_ && len_[l] < len_[s] ? l : 0;
  }
  uint32_t firstpos(uint32_t s) const { return firstpos_[s]; }
  uint32_t count(uint32_t s) const { return count_[s]; }
  uint32_t next(uint32_t s, uint32_t tok) const {
    if (tok >= vocab_) return kNone;  // also keeps a 16-bit label comparison exact
    const uint32_t t = s == 0 ? root_next_[tok]
                              : (narrow_ ? find_edge(etok16_, s, tok) : find_edge(etok32_, s, tok));
    return t < n_states_ ? t : kNone;
  }
  template <class F>
  void for_each_edge(uint32_t s, F&& f) const {
    const uint32_t b = eoff_[s], e = std::min<uint64_t>(eoff_[s + 1], n_edges_);
    for (uint32_t i = b; i < e; ++i)
      if (etgt_[i] < n_states_) f(narrow_ ? uint32_t(etok16_[i]) : etok32_[i], etgt_[i]);
  }
  // Tokens after the earliest occurrence of the cursor's string, within its document.
  int64_t draft_chain(const Cursor& c, int64_t n, int64_t* out) const;

  uint64_t text_size() const { return hdr_->n_text; }
  // Raw text section: uint16 (narrow) or uint32 elements; separator = all ones.
  const void* text_data() const { return narrow_ ? static_cast<const void*>(text16_) : text32_; }
  bool narrow() const { return narrow_; }
  size_t file_bytes() const { return file_->size(); }

 private:
  template <class T>
  uint32_t find_edge(const T* labels, uint32_t s, uint32_t tok) const {
    const uint32_t b = eoff_[s], e = eoff_[s + 1];
    if (b > e || e > n_edges_) return kNone;
    const T* lo = labels + b;
    const T* hi = labels + e;
    while (hi - lo > 8) {  // binary search down to a short linear scan
      const T* mid = lo + (hi - lo) / 2;
      if (*mid <= tok) lo = mid; else hi = mid;
    }
    for (; lo < hi; ++lo)
      if (*lo == tok) return etgt_[lo - labels];
    return kNone;
  }
  template <class T>
  int64_t copy_until_sep(const T* text, uint64_t p, int64_t n, int64_t* out) const;

  std::unique_ptr<MappedFile> file_;
  const IndexHeader* hdr_;
  uint32_t vocab_;
  uint64_t n_states_, n_edges_;
  bool narrow_;
  const uint16_t *text16_ = nullptr, *etok16_ = nullptr;
  const uint32_t *text32_ = nullptr, *etok32_ = nullptr;
  const uint32_t *len_, *link_, *firstpos_, *count_, *eoff_, *etgt_, *root_next_;
};

}  // namespace recallspec
