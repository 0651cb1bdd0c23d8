// recallspec._core: the thin C++ core. Bindings only; algorithms live in their own files.
// Array arguments are validated (dtype, 1-D, C-contiguous, CPU) by nanobind; the
// Python wrapper (recallspec.index) adds friendly messages and value checks.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstring>
#include <stdexcept>

#include "sam/index_file.h"
#include "sam/sam_common.h"
#include "sam/sam_dynamic.h"
#include "sam/sam_static.h"

namespace nb = nanobind;
using namespace recallspec;

using U32In = nb::ndarray<const uint32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I64In = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I64Out = nb::ndarray<int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

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

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "recallspec C++ core";
  m.attr("ABI_VERSION") = 1;
  m.attr("INDEX_FORMAT_VERSION") = kIndexVersion;
  m.attr("HEADER_BYTES") = kHeaderBytes;
  nb::exception<IndexFormatError>(m, "IndexFormatError");

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
