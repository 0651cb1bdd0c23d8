// recallspec._core: the thin C++ core (suffix automata, index file, REST retrieval). Bindings only; algorithms live in their own files.
// Array arguments are validated (dtype, 1-D, C-contiguous, CPU) by nanobind; the
// Python wrapper (recallspec.index) adds friendly messages and value checks.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "datastore/suffix_search.h"
#include "sam/index_file.h"
#include "sam/sam_common.h"
#include "sam/sam_dynamic.h"
#include "sam/sam_static.h"

namespace nb = nanobind;
using namespace recallspec;

using U32In = nb::ndarray<const uint32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I64In = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I64Out = nb::ndarray<int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I32In = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I64In2 = nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using I64Out2 = nb::ndarray<int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

namespace {

// A cursor bound to one automaton (kept alive by nb::keep_alive).
template <class A>
struct BoundCursor {
  const A* a;
  Cursor c;
  explicit BoundCursor(const A& a_) : a(&a_) {}

  void advance(U32In toks) {
    const uint32_t* t = toks.data();
    cursor_normalize(*a, c);
    for (size_t i = 0, n = toks.shape(0); i < n; ++i) cursor_advance(*a, c, t[i]);
  }
  // Like advance, also writing the match length after every token into `out`.
  void advance_lengths(U32In toks, I64Out out) {
    if (out.shape(0) != toks.shape(0)) throw std::invalid_argument("out must have len(tokens) entries");
    const uint32_t* t = toks.data();
    int64_t* o = out.data();
    cursor_normalize(*a, c);
    for (size_t i = 0, n = toks.shape(0); i < n; ++i) {
      cursor_advance(*a, c, t[i]);
      o[i] = c.length;
    }
  }
  int64_t chain(I64Out out) {
    cursor_normalize(*a, c);
    return a->draft_chain(c, int64_t(out.shape(0)), out.data());
  }
  int64_t tree(int64_t max_depth, I64Out tokens, I64Out parents, I64Out counts) {
    const size_t n = tokens.shape(0);
    if (parents.shape(0) != n || counts.shape(0) != n)
      throw std::invalid_argument("tokens, parents and counts must have the same length");
    cursor_normalize(*a, c);
    return draft_tree(*a, c, int64_t(n), max_depth, tokens.data(), parents.data(), counts.data());
  }
};

template <class A>
void bind_cursor(nb::module_& m, const char* name) {
  using BC = BoundCursor<A>;
  nb::class_<BC>(m, name)
      .def(nb::init<const A&>(), nb::keep_alive<1, 2>())
      .def("advance", &BC::advance)
      .def("advance_lengths", &BC::advance_lengths)
      .def("reset", [](BC& b) { b.c = Cursor{}; })
      .def_prop_ro("length", [](BC& b) { cursor_normalize(*b.a, b.c); return b.c.length; })
      .def_prop_ro("state", [](BC& b) { cursor_normalize(*b.a, b.c); return b.c.state; })
      .def("draft_chain", &BC::chain)
      .def("draft_tree", &BC::tree);
}

SaText sa_text(I32In text, I32In sa) {
  return SaText{text.data(), int64_t(text.shape(0)), sa.data(), int64_t(sa.shape(0))};
}

void check_tree_out(I64Out tokens, I64Out parents) {
  if (parents.shape(0) != tokens.shape(0))
    throw std::invalid_argument("tokens and parents must have the same length");
}

// REST retrieval (csrc/datastore/suffix_search.h). The Python wrapper
// (recallspec.recall.datastore) checks values; bounds that would read outside the
// arrays are checked here.
void bind_datastore(nb::module_& m) {
  m.def("sa_match_range", [](I32In text, I32In sa, I32In query) {
    int64_t lo, hi;
    sa_match_range(sa_text(text, sa), query.data(), int64_t(query.shape(0)), &lo, &hi);
    return std::make_pair(lo, hi);
  });
  m.def("sa_longest_match", [](I32In text, I32In sa, I32In context, int64_t min_q,
                               int64_t max_q) {
    if (min_q < 1 || max_q < min_q) throw std::invalid_argument("need 1 <= min_q <= max_q");
    int64_t lo, hi;
    const int64_t n = sa_longest_match(sa_text(text, sa), context.data(),
                                       int64_t(context.shape(0)), min_q, max_q, &lo, &hi);
    return std::make_tuple(n, lo, hi);
  });
  m.def("sa_continuations", [](I32In text, I32In sa, int64_t lo, int64_t hi, int64_t offset,
                               int64_t max_matches, I64Out2 out) {
    const int64_t n_sa = int64_t(sa.shape(0));
    if (lo < 0 || hi > n_sa || lo > hi || offset < 0 || max_matches < 1)
      throw std::invalid_argument("need 0 <= lo <= hi <= len(sa), offset >= 0, max_matches >= 1");
    if (int64_t(out.shape(0)) < std::min(hi - lo, max_matches))
      throw std::invalid_argument("out has fewer rows than matches");
    return sa_continuations(sa_text(text, sa), lo, hi, offset, max_matches,
                            int64_t(out.shape(1)), out.data());
  });
  m.def("top_k_trie", [](I64In2 conts, int64_t max_nodes, I64Out tokens, I64Out parents) {
    check_tree_out(tokens, parents);
    const int64_t n = std::min<int64_t>(max_nodes, int64_t(tokens.shape(0)));
    return top_k_trie(conts.data(), int64_t(conts.shape(0)), int64_t(conts.shape(1)), n,
                      tokens.data(), parents.data());
  });
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "recallspec C++ core";
  m.attr("ABI_VERSION") = 1;
  m.attr("INDEX_FORMAT_VERSION") = kIndexVersion;
  m.attr("HEADER_BYTES") = kHeaderBytes;
  nb::exception<IndexFormatError>(m, "IndexFormatError");
  bind_datastore(m);

  nb::class_<StaticSamBuilder>(m, "StaticSamBuilder")
      .def(nb::init<uint32_t, uint64_t>(), nb::arg("vocab_size"), nb::arg("expected_tokens") = 0)
      .def(
          "add_documents",
          [](StaticSamBuilder& b, U32In toks, I64In offsets) {
            b.add_documents(toks.data(), toks.shape(0), offsets.data(), offsets.shape(0));
          },
          nb::call_guard<nb::gil_scoped_release>())
      .def("write", &StaticSamBuilder::write, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("n_tokens", &StaticSamBuilder::n_tokens)
      .def_prop_ro("n_docs", &StaticSamBuilder::n_docs)
      .def_prop_ro("n_states", &StaticSamBuilder::n_states)
      .def_prop_ro("n_edges", &StaticSamBuilder::n_edges);

  nb::class_<StaticSam>(m, "StaticSam")
      .def(nb::init<const std::string&, bool>(), nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("version", [](const StaticSam& s) { return s.header().version; })
      .def_prop_ro("vocab_size", [](const StaticSam& s) { return s.header().vocab_size; })
      .def_prop_ro("n_tokens", [](const StaticSam& s) { return s.header().n_tokens; })
      .def_prop_ro("n_text", [](const StaticSam& s) { return s.header().n_text; })
      .def_prop_ro("n_docs", [](const StaticSam& s) { return s.header().n_docs; })
      .def_prop_ro("n_states", [](const StaticSam& s) { return s.header().n_states; })
      .def_prop_ro("n_edges", [](const StaticSam& s) { return s.header().n_edges; })
      .def_prop_ro("max_doc_len", [](const StaticSam& s) { return s.header().max_doc_len; })
      .def_prop_ro("file_bytes", [](const StaticSam& s) { return s.header().file_bytes; })
      .def_prop_ro("payload_hash", [](const StaticSam& s) { return s.header().payload_hash; })
      .def_prop_ro("fingerprint",
                   [](const StaticSam& s) {
                     const char* f = s.header().fingerprint;
                     return std::string(f, strnlen(f, kFingerprintBytes));
                   })
      .def_prop_ro("metadata",
                   [](const StaticSam& s) {
                     const char* f = s.header().metadata;
                     return std::string(f, strnlen(f, kMetadataBytes));
                   })
      .def_prop_ro("token_bytes", [](const StaticSam& s) { return s.header().token_bytes; })
      // Zero-copy view of the stored text: tokens, all-ones separator after each document;
      // uint16 for vocabularies < 65535 ids, else uint32.
      .def("text", [](nb::handle self) -> nb::object {
        const StaticSam& s = nb::cast<const StaticSam&>(self);
        const size_t n = s.text_size();
        if (s.narrow())
          return nb::cast(nb::ndarray<nb::numpy, const uint16_t, nb::ndim<1>>(
              static_cast<const uint16_t*>(s.text_data()), {n}, self));
        return nb::cast(nb::ndarray<nb::numpy, const uint32_t, nb::ndim<1>>(
            static_cast<const uint32_t*>(s.text_data()), {n}, self));
      });
  bind_cursor<StaticSam>(m, "StaticCursor");

  nb::class_<DynamicSam>(m, "DynamicSam")
      .def(nb::init<>())
      .def("extend",
           [](DynamicSam& d, U32In toks) {
             for (size_t i = 0, n = toks.shape(0); i < n; ++i) d.extend(toks.data()[i]);
           })
      // Same as extend, also writing the self-match length after every token.
      .def("extend_lengths",
           [](DynamicSam& d, U32In toks, I64Out out) {
             if (out.shape(0) != toks.shape(0)) throw std::invalid_argument("out must have len(tokens) entries");
             for (size_t i = 0, n = toks.shape(0); i < n; ++i) {
               d.extend(toks.data()[i]);
               out.data()[i] = d.self_cursor().length;
             }
           })
      .def_prop_ro("size", &DynamicSam::size)
      .def_prop_ro("n_states", &DynamicSam::n_states)
      .def_prop_ro("self_length", [](const DynamicSam& d) { return d.self_cursor().length; })
      .def("self_draft_chain",
           [](const DynamicSam& d, I64Out out) {
             return d.draft_chain(d.self_cursor(), int64_t(out.shape(0)), out.data());
           })
      .def("self_draft_tree",
           [](const DynamicSam& d, int64_t max_depth, I64Out tokens, I64Out parents, I64Out counts) {
             const size_t n = tokens.shape(0);
             if (parents.shape(0) != n || counts.shape(0) != n)
               throw std::invalid_argument("tokens, parents and counts must have the same length");
             return draft_tree(d, d.self_cursor(), int64_t(n), max_depth, tokens.data(), parents.data(),
                               counts.data());
           })
      .def("text", [](const DynamicSam& d) {
        const auto& t = d.text();
        auto* copy = new uint32_t[t.size() ? t.size() : 1];
        std::memcpy(copy, t.data(), t.size() * 4);
        nb::capsule owner(copy, [](void* p) noexcept { delete[] static_cast<uint32_t*>(p); });
        return nb::ndarray<nb::numpy, uint32_t, nb::ndim<1>>(copy, {t.size()}, owner);
      });
  bind_cursor<DynamicSam>(m, "DynamicCursor");
}
