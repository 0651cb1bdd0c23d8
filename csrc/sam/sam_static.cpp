#include "sam/sam_static.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "sam/hash64.h"

namespace recallspec {

namespace {

// Edge encoding in the construction pool: sorting the uint64 sorts by token.
inline uint64_t edge(uint32_t tok, uint32_t tgt) { return (uint64_t(tok) << 32) | tgt; }
inline uint32_t edge_tok(uint64_t e) { return uint32_t(e >> 32); }
inline uint32_t edge_tgt(uint64_t e) { return uint32_t(e); }

// Size class k holds 1 << k edges; capacity of a state with n edges is bit_ceil(n).
inline uint32_t size_class(uint32_t n) {
  uint32_t k = 0;
  while ((1u << k) < n) ++k;
  return k;
}
inline bool is_full(uint32_t n) { return (n & (n - 1)) == 0; }  // 0 or a power of two

}  // namespace

StaticSamBuilder::StaticSamBuilder(uint32_t vocab_size, uint64_t expected_tokens)
    : vocab_(vocab_size), root_next_(vocab_size, kNone) {
  if (vocab_size == 0 || vocab_size == kSep) throw std::invalid_argument("vocab_size must be in [1, 2^32-1)");
  // Measured: 0.9-1.2 states and 1.3-2.1 edges per token (text, random tokens); the
  // reservation has headroom and avoids the 2x peak of vector regrowth. Reserved but
  // untouched pages cost no memory.
  const uint64_t S = expected_tokens * 17 / 10 + 16;
  st_.reserve(S);
  firstpos_.reserve(S);
  count_.reserve(S);
  pool_.reserve(expected_tokens * 3 + 16);
  text_.reserve(expected_tokens + expected_tokens / 64 + 16);
  new_state(0, kNone, kNone);  // root: firstpos undefined (empty string)
}

uint32_t StaticSamBuilder::new_state(uint32_t len, uint32_t link, uint32_t firstpos) {
  if (st_.size() >= kNone - 1) throw std::length_error("suffix automaton exceeds 2^32 states");
  st_.push_back(Node{len, link, 0, 0});
  firstpos_.push_back(firstpos);
  count_.push_back(0);
  return uint32_t(st_.size() - 1);
}

uint32_t StaticSamBuilder::clone_state(uint32_t q, uint32_t len) {
  // A clone takes over the shorter strings of q: same transitions, same earliest
  // end (every earlier occurrence of them was an occurrence of q), no own count.
  uint32_t cl = new_state(len, st_[q].link, firstpos_[q]);
  uint32_t n = st_[q].ecnt;
  if (n) {
    uint32_t k = size_class(n);
    uint32_t off;
    if (!free_[k].empty()) {
      off = free_[k].back();
      free_[k].pop_back();
    } else {
      off = uint32_t(pool_.size());
      if (pool_.size() + (uint64_t(1) << k) >= kNone) throw std::length_error("edge pool exceeds 2^32");
      pool_.resize(pool_.size() + (size_t(1) << k));
    }
    std::memcpy(&pool_[off], &pool_[st_[q].eoff], n * sizeof(uint64_t));
    st_[cl].eoff = off;
    st_[cl].ecnt = n;
    n_edges_ += n;
  }
  return cl;
}

uint32_t StaticSamBuilder::get(uint32_t s, uint32_t tok) const {
  if (s == 0) return root_next_[tok];
  const uint64_t* b = pool_.data() + st_[s].eoff;
  uint32_t n = st_[s].ecnt;
  if (n <= 8) {
    for (uint32_t i = 0; i < n; ++i)
      if (edge_tok(b[i]) == tok) return edge_tgt(b[i]);
    return kNone;
  }
  const uint64_t* it = std::lower_bound(b, b + n, uint64_t(tok) << 32);
  return (it != b + n && edge_tok(*it) == tok) ? edge_tgt(*it) : kNone;
}

void StaticSamBuilder::set(uint32_t s, uint32_t tok, uint32_t target) {
  if (s == 0) {
    if (root_next_[tok] == kNone) ++st_[0].ecnt, ++n_edges_;
    root_next_[tok] = target;
    return;
  }
  uint32_t n = st_[s].ecnt;
  uint64_t* b = pool_.data() + st_[s].eoff;
  uint64_t* it = std::lower_bound(b, b + n, uint64_t(tok) << 32);
  uint32_t at = uint32_t(it - b);
  if (at < n && edge_tok(*it) == tok) {  // redirect (cloning)
    *it = edge(tok, target);
    return;
  }
  if (is_full(n)) {  // move to the next size class
    uint32_t k = size_class(n + 1);
    uint32_t off;
    if (!free_[k].empty()) {
      off = free_[k].back();
      free_[k].pop_back();
    } else {
      if (pool_.size() + (uint64_t(1) << k) >= kNone) throw std::length_error("edge pool exceeds 2^32");
      off = uint32_t(pool_.size());
      pool_.resize(pool_.size() + (size_t(1) << k));
    }
    b = pool_.data() + st_[s].eoff;  // resize may have moved the pool
    uint64_t* nb = pool_.data() + off;
    std::memcpy(nb, b, at * sizeof(uint64_t));
    nb[at] = edge(tok, target);
    std::memcpy(nb + at + 1, b + at, (n - at) * sizeof(uint64_t));
    if (n) free_[size_class(n)].push_back(st_[s].eoff);
    st_[s].eoff = off;
  } else {
    std::memmove(b + at + 1, b + at, (n - at) * sizeof(uint64_t));
    b[at] = edge(tok, target);
  }
  st_[s].ecnt = n + 1;
  ++n_edges_;
}

void StaticSamBuilder::extend(uint32_t tok, uint32_t pos) {
  const uint32_t last = last_;
  uint32_t q = get(last, tok);
  if (q != kNone) {
    // Generalized-SAM case: longest(last)+tok already occurs (in an earlier document).
    if (st_[q].len == st_[last].len + 1) {
      last_ = q;
    } else {
      uint32_t cl = clone_state(q, st_[last].len + 1);
      for (uint32_t p = last; p != kNone && get(p, tok) == q; p = st_[p].link) set(p, tok, cl);
      st_[q].link = cl;
      last_ = cl;
    }
    ++count_[last_];
    return;
  }
  const uint32_t cur = new_state(st_[last].len + 1, kNone, pos);
  uint32_t p = last;
  while (p != kNone && (q = get(p, tok)) == kNone) {
    set(p, tok, cur);
    p = st_[p].link;
  }
  if (p == kNone) {
    st_[cur].link = 0;
  } else if (st_[p].len + 1 == st_[q].len) {
    st_[cur].link = q;
  } else {
    uint32_t cl = clone_state(q, st_[p].len + 1);
    for (; p != kNone && get(p, tok) == q; p = st_[p].link) set(p, tok, cl);
    st_[q].link = cl;
    st_[cur].link = cl;
  }
  last_ = cur;
  ++count_[cur];
}

void StaticSamBuilder::add_documents(const uint32_t* tokens, size_t n_tokens, const int64_t* offsets,
                                     size_t n_off) {
  if (finished_) throw std::logic_error("builder already written");
  if (n_off == 0) return;
  if (offsets[0] != 0 || uint64_t(offsets[n_off - 1]) != n_tokens)
    throw std::invalid_argument("offsets must start at 0 and end at len(tokens)");
  for (size_t i = 0; i + 1 < n_off; ++i)
    if (offsets[i + 1] < offsets[i]) throw std::invalid_argument("offsets must be non-decreasing");
  for (size_t i = 0; i < n_tokens; ++i)
    if (tokens[i] >= vocab_)
      throw std::invalid_argument("token id " + std::to_string(tokens[i]) + " at position " +
                                  std::to_string(i) + " is >= vocab_size " + std::to_string(vocab_));
  if (text_.size() + n_tokens + n_off >= kNone) throw std::length_error("corpus exceeds 2^32 positions");
  for (size_t d = 0; d + 1 < n_off; ++d) {
    const int64_t b = offsets[d], e = offsets[d + 1];
    if (b == e) continue;  // empty documents add nothing
    last_ = 0;             // every document starts at the root: no match spans a boundary
    for (int64_t i = b; i < e; ++i) {
      uint32_t pos = uint32_t(text_.size());
      text_.push_back(tokens[i]);
      extend(tokens[i], pos);
    }
    text_.push_back(kSep);
    n_tokens_ += uint64_t(e - b);
    max_doc_len_ = std::max<uint64_t>(max_doc_len_, uint64_t(e - b));
    ++n_docs_;
  }
}

void StaticSamBuilder::finish_counts() {
  // count(s) = |endpos(s)|: each position was credited to the state of its whole
  // prefix; sum over the suffix-link tree, children (longer) before parents.
  const size_t S = st_.size();
  std::vector<uint32_t> bucket(max_doc_len_ + 2, 0), order(S);
  for (size_t s = 0; s < S; ++s) ++bucket[st_[s].len + 1];
  for (size_t i = 1; i < bucket.size(); ++i) bucket[i] += bucket[i - 1];
  for (size_t s = 0; s < S; ++s) order[bucket[st_[s].len]++] = uint32_t(s);
  for (size_t i = S; i-- > 1;) {
    uint32_t s = order[i];
    count_[st_[s].link] += count_[s];
  }
}

namespace {

// Buffered writer that hashes everything after the header.
class PayloadWriter {
 public:
  PayloadWriter(FILE* f, const std::string& path) : f_(f), path_(path), buf_(1 << 20) {}
  void put(const void* p, size_t n) {
    h_.update(p, n);
    if (n && std::fwrite(p, 1, n, f_) != n)
      throw IndexFormatError("cannot write " + path_ + ": " + std::strerror(errno));
    pos_ += n;
  }
  void pad_to(uint64_t off) {
    static const uint8_t zeros[kSectionAlign] = {};
    while (pos_ < off) put(zeros, std::min<uint64_t>(off - pos_, kSectionAlign));
  }
  // Emit values through a 1 MiB buffer.
  template <class T>
  void val(T v) {
    std::memcpy(buf_.data() + nbuf_, &v, sizeof v);
    nbuf_ += sizeof v;
    if (nbuf_ + 8 > buf_.size()) flush();
  }
  void u32(uint32_t v) { val(v); }
  // A token id in the file's token width (the separator becomes all ones).
  void tok(uint32_t v, bool narrow) {
    if (narrow) val(uint16_t(v == kSep ? 0xFFFFu : v));
    else val(v);
  }
  void flush() {
    put(buf_.data(), nbuf_);
    nbuf_ = 0;
  }
  uint64_t pos() const { return pos_; }
  uint64_t digest() const { return h_.digest(); }

 private:
  FILE* f_;
  std::string path_;
  Hash64 h_{0xa5a5};
  std::vector<uint8_t> buf_;
  size_t nbuf_ = 0;
  uint64_t pos_ = kHeaderBytes;
};

}  // namespace

uint64_t StaticSamBuilder::write(const std::string& path, const std::string& fingerprint,
                                 const std::string& metadata) {
  if (finished_) throw std::logic_error("builder already written");
  if (n_tokens_ == 0) throw std::invalid_argument("corpus is empty (no tokens)");
  if (fingerprint.size() >= kFingerprintBytes) throw std::invalid_argument("fingerprint too long");
  if (metadata.size() >= kMetadataBytes) throw std::invalid_argument("metadata too long");
  finished_ = true;
  finish_counts();

  const uint64_t S = st_.size(), E = n_edges_;
  IndexHeader h;
  std::memset(&h, 0, sizeof h);
  std::memcpy(h.magic, kIndexMagic, sizeof kIndexMagic);
  h.version = kIndexVersion;
  h.header_bytes = kHeaderBytes;
  h.vocab_size = vocab_;
  h.num_sections = kNumSections;
  const bool narrow = vocab_ < 0xFFFF;  // 16-bit token ids; 0xFFFF stays free for the separator
  h.token_bytes = narrow ? 2 : 4;
  h.n_tokens = n_tokens_;
  h.n_text = text_.size();
  h.n_docs = n_docs_;
  h.n_states = S;
  h.n_edges = E;
  h.max_doc_len = max_doc_len_;
  std::memcpy(h.fingerprint, fingerprint.data(), fingerprint.size());
  std::memcpy(h.metadata, metadata.data(), metadata.size());
  const uint64_t tb = h.token_bytes;
  const uint64_t bytes[kNumSections] = {h.n_text * tb, S * 4, S * 4, S * 4, S * 4, (S + 1) * 4,
                                        E * tb, E * 4, uint64_t(vocab_) * 4};
  uint64_t off = kHeaderBytes;
  for (uint32_t i = 0; i < kNumSections; ++i) {
    h.sections[i] = SectionRef{off, bytes[i]};
    off = align_up(off + bytes[i], kSectionAlign);
  }
  h.file_bytes = h.sections[kNumSections - 1].offset + h.sections[kNumSections - 1].bytes;

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw IndexFormatError("cannot create " + tmp + ": " + std::strerror(errno));
  try {
    static const uint8_t zeros[kHeaderBytes] = {};
    if (std::fwrite(zeros, 1, kHeaderBytes, f) != kHeaderBytes)
      throw IndexFormatError("cannot write " + tmp + ": " + std::strerror(errno));
    PayloadWriter w(f, tmp);
    auto section = [&](Section s, const U32Vec& v) {
      w.pad_to(h.sections[s].offset);
      w.put(v.data(), v.size() * 4);
    };
    w.pad_to(h.sections[kText].offset);
    if (narrow) {
      for (uint32_t t : text_) w.tok(t, true);
      w.flush();
    } else {
      w.put(text_.data(), text_.size() * 4);
    }
    for (Section sec : {kStateLen, kStateLink}) {  // columns of the interleaved node array
      w.pad_to(h.sections[sec].offset);
      for (const Node& nd : st_) w.u32(sec == kStateLen ? nd.len : nd.link);
      w.flush();
    }
    section(kStateFirstPos, firstpos_);
    section(kStateCount, count_);
    w.pad_to(h.sections[kEdgeOffset].offset);
    uint64_t acc = 0;
    for (uint64_t s = 0; s < S; ++s) {
      w.u32(uint32_t(acc));
      acc += st_[s].ecnt;
    }
    w.u32(uint32_t(acc));
    w.flush();
    // Edge tokens then targets, state by state (root from its dense table).
    for (int part = 0; part < 2; ++part) {
      w.pad_to(h.sections[part == 0 ? kEdgeToken : kEdgeTarget].offset);
      for (uint32_t t = 0; t < vocab_; ++t) {
        if (root_next_[t] == kNone) continue;
        if (part == 0) w.tok(t, narrow); else w.u32(root_next_[t]);
      }
      for (uint64_t s = 1; s < S; ++s) {
        const uint64_t* b = pool_.data() + st_[s].eoff;
        for (uint32_t i = 0; i < st_[s].ecnt; ++i) {
          if (part == 0) w.tok(edge_tok(b[i]), narrow); else w.u32(edge_tgt(b[i]));
        }
      }
      w.flush();
    }
    section(kRootNext, root_next_);
    if (w.pos() != h.file_bytes) throw std::logic_error("index writer size mismatch");
    h.payload_hash = w.digest();
    h.header_hash = header_checksum(h);
    if (std::fseek(f, 0, SEEK_SET) != 0 || std::fwrite(&h, 1, sizeof h, f) != sizeof h ||
        std::fflush(f) != 0 || ::fsync(fileno(f)) != 0)
      throw IndexFormatError("cannot write " + tmp + ": " + std::strerror(errno));
  } catch (...) {
    std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
  if (std::fclose(f) != 0 || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw IndexFormatError("cannot write " + path + ": " + std::strerror(errno));
  }
  // Make the rename durable.
  std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/') + 1);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  // Release construction memory.
  for (auto* v : {&firstpos_, &count_, &text_, &root_next_}) U32Vec().swap(*v);
  decltype(st_)().swap(st_);
  decltype(pool_)().swap(pool_);
  return h.file_bytes;
}

StaticSam::StaticSam(const std::string& path, bool verify)
    : file_(std::make_unique<MappedFile>(path)) {
  hdr_ = &validate_index(*file_, verify);
  vocab_ = hdr_->vocab_size;
  n_states_ = hdr_->n_states;
  n_edges_ = hdr_->n_edges;
  narrow_ = hdr_->token_bytes == 2;
  auto sec = [&](Section s) {
    return reinterpret_cast<const uint32_t*>(file_->data() + hdr_->sections[s].offset);
  };
  auto sec16 = [&](Section s) {
    return reinterpret_cast<const uint16_t*>(file_->data() + hdr_->sections[s].offset);
  };
  if (narrow_) {
    text16_ = sec16(kText);
    etok16_ = sec16(kEdgeToken);
  } else {
    text32_ = sec(kText);
    etok32_ = sec(kEdgeToken);
  }
  len_ = sec(kStateLen);
  link_ = sec(kStateLink);
  firstpos_ = sec(kStateFirstPos);
  count_ = sec(kStateCount);
  eoff_ = sec(kEdgeOffset);
  etgt_ = sec(kEdgeTarget);
  root_next_ = sec(kRootNext);
  if (eoff_[hdr_->n_states] != hdr_->n_edges) throw IndexFormatError("edge table is inconsistent");
}

template <class T>
int64_t StaticSam::copy_until_sep(const T* text, uint64_t p, int64_t n, int64_t* out) const {
  const T sep = T(~T(0));
  int64_t k = 0;
  while (k < n && p < hdr_->n_text && text[p] != sep) out[k++] = text[p++];
  return k;
}

int64_t StaticSam::draft_chain(const Cursor& c, int64_t n, int64_t* out) const {
  if (c.length == 0) return 0;
  const uint64_t p = uint64_t(firstpos_[c.state]) + 1;
  return narrow_ ? copy_until_sep(text16_, p, n, out) : copy_until_sep(text32_, p, n, out);
}

}  // namespace recallspec
