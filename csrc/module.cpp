// recallspec._core: the thin C++ core. Bindings only; algorithms live in their own files.
#include <nanobind/nanobind.h>

namespace nb = nanobind;

NB_MODULE(_core, m) {
  m.doc() = "recallspec C++ core";
  m.attr("ABI_VERSION") = 1;
}
