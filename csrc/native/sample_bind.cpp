// One sampling distribution as unnormalised weights (decoding/sampling.py `Weights`),
// registered into recallspec._kernels: a sampled step's softmax, residuals and draw in
// three calls instead of ~8 torch operations over the vocabulary (which run cold right
// after a forward has streamed the weights: ~0.4 ms a step on SmolLM2's 49,152 entries).
//
// Layout: w [n] float32 weights (native_ops.h "sampling weights"), chunks [ceil(n / 64)]
// float64, chunk c = Ops::chunk_sum of w[64 c, 64 c + 64); the total = the chunk sums
// added in increasing c from +0. Every value is a fixed sequence
// of IEEE operations, so every path gives the same bits and a draw is reproducible.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "common/kernel_common.h"
#include "native/native_ops.h"

namespace nb = nanobind;

namespace {

constexpr int64_t kChunk = 64;

using FIn = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using FOut = nb::ndarray<float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using DOut = nb::ndarray<double, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

void need(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("sampling: " + what);
}

double total_of(const double* chunks, int64_t nc) {
  double s = 0.0;
  for (int64_t c = 0; c < nc; ++c) s += chunks[c];
  return s;
}

void check_shapes(int64_t n, int64_t nw, int64_t nc) {
  need(n > 0 && nw == n && nc == (n + kChunk - 1) / kChunk,
       "need logits [n > 0], weights [n] and chunks [ceil(n / 64)]");
}

// Fills w and chunks from logits x at temperature t; returns the total. Refuses NaN
// logits (no distribution) and a maximum that overflows at this temperature (x / t
// infinite): the caller falls back to its reference softmax for that case.
double fill(FIn x, double t, FOut w, DOut chunks, int isa) {
  rs::require_isa(isa);
  const int64_t n = int64_t(x.shape(0)), nc = int64_t(chunks.shape(0));
  check_shapes(n, int64_t(w.shape(0)), nc);
  need(t > 0.0 && std::isfinite(float(t)), "temperature must be a positive finite number");
  const nf::Ops& op = nf::ops_for(isa);
  bool nan = false;
  const float tf = float(t);
  const float m = op.max(x.data(), n, &nan) / tf;
  if (nan) throw std::domain_error("sampling: the logits hold a NaN");
  if (!std::isfinite(m)) throw std::overflow_error("sampling: the largest logit / t is not finite");
  op.sample_weights(x.data(), n, tf, m, w.data(), chunks.data());
  return total_of(chunks.data(), nc);
}

// Sets w[i] = 0 (a rejected draft token leaves the residual) and returns the new total.
double zero_entry(FOut w, DOut chunks, int64_t i, int isa) {
  rs::require_isa(isa);
  const int64_t n = int64_t(w.shape(0)), nc = int64_t(chunks.shape(0));
  check_shapes(n, n, nc);
  need(i >= 0 && i < n, "token id out of range");
  w.data()[i] = 0.0f;
  const int64_t c = i / kChunk;
  chunks.data()[c] = nf::ops_for(isa).chunk_sum(w.data() + c * kChunk, std::min(kChunk, n - c * kChunk));
  return total_of(chunks.data(), nc);
}

// The index whose cumulative interval holds u * total (u in [0, 1)): the first chunk
// whose running sum (the total's own additions) exceeds the target, then the first
// entry with weight whose running sum inside it does. A running sum that rounds short
// of the target at the chunk's end (or u * total rounding up to the total) gives the
// last entry with weight there: zero-weight entries are never returned.
int64_t draw_index(FIn w, DOut chunks, double u) {
  const int64_t n = int64_t(w.shape(0)), nc = int64_t(chunks.shape(0));
  check_shapes(n, n, nc);
  need(u >= 0.0 && u < 1.0, "u must be in [0, 1)");
  const float* wp = w.data();
  const double* cs = chunks.data();
  const double total = total_of(cs, nc);
  if (!(total > 0.0)) throw std::domain_error("sampling: no token has weight");
  const double target = u * total;
  double run = 0.0;
  int64_t c = 0;
  for (; c < nc; ++c) {
    if (run + cs[c] > target) break;
    run += cs[c];
  }
  if (c == nc) {  // u * total rounded up to the total: the last entry with weight
    for (int64_t i = n - 1; i >= 0; --i)
      if (wp[i] > 0.0f) return i;
  }
  // (Here run <= target < run + cs[c], so chunk c has weight.)
  const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
  int64_t last = -1;
  for (int64_t i = lo; i < hi; ++i) {
    if (wp[i] <= 0.0f) continue;
    run += double(wp[i]);
    last = i;
    if (run > target) return i;
  }
  need(last >= 0, "chunk sums do not match the weights");
  return last;
}

}  // namespace

void register_sampling(nb::module_& m) {
  m.def("sample_weights", &fill, nb::arg("logits").noconvert(), nb::arg("t"),
        nb::arg("w").noconvert(), nb::arg("chunks").noconvert(), nb::arg("isa"));
  m.def("sample_remove", &zero_entry, nb::arg("w").noconvert(), nb::arg("chunks").noconvert(),
        nb::arg("i"), nb::arg("isa"));
  m.def("sample_draw", &draw_index, nb::arg("w").noconvert(), nb::arg("chunks").noconvert(),
        nb::arg("u"));
}
