// Python bindings of the quantized kernels (registered into recallspec._kernels):
// argument checks, the activation quantization, the split over threads (the ISA
// dispatch: qdispatch.cpp). Weight arrays arrive as flat byte views of the tensors that
// kernels/qlinear.py keeps (layout: qkernels.h).
#include <cstdint>
#include <stdexcept>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "common/kernel_common.h"
#include "qgemm/qkernels.h"
#include "qgemm/qseg.h"

namespace nb = nanobind;

namespace {

using qk::QSeg;

template <class T>
using Mat = nb::ndarray<T, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
template <class T>
using Vec = nb::ndarray<T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// Activation rows below which quantization runs in the calling thread only.
constexpr int64_t kParallelQuantRows = 32;

// Buffers of the calling thread, reused across calls (no page faults per call).
struct Work {
  std::vector<int8_t> q;
  std::vector<int16_t> qw;
  std::vector<float> d, dxs;
  std::vector<int32_t> xs;
};

qk::QXBuf prepare(Work& ws, int64_t M, int64_t K, int sb, bool widened) {
  ws.q.resize(size_t(M * K));
  if (widened) ws.qw.resize(size_t(M * K));
  ws.d.resize(size_t(M * K / 32));
  ws.xs.resize(size_t(M * K / sb));
  ws.dxs.resize(size_t(M * K / sb));
  return {ws.q.data(), widened ? ws.qw.data() : nullptr, ws.d.data(), ws.xs.data(), ws.dxs.data()};
}

using rs::split;

// out[m * ldo + n_off + n] = sum_k x[m * K + k] w[n, k] for m < M, n < seg.n.
// x and out are raw addresses (torch data_ptr): the Python wrapper (kernels/qlinear.py)
// checks dtype float32, contiguity and shapes; here only the sizes are checked.
void qgemm(const QSeg& seg, uintptr_t x_addr, int64_t M, uintptr_t out_addr, int64_t ldo,
           int64_t n_off, unsigned threads, int isa) {
  const qk::QW& w = seg.w();
  if (M < 0 || n_off < 0 || n_off + w.n > ldo) throw std::invalid_argument("qgemm: bad M, n_off or ldo");
  rs::require_isa(isa);
  if (M == 0) return;  // (torch gives empty tensors a null address)
  if (!x_addr || !out_addr) throw std::invalid_argument("qgemm: null address");
  const int64_t K = w.k;
  const int sb = w.sb;
  const float* xp = reinterpret_cast<const float*>(x_addr);
  float* op = reinterpret_cast<float*>(out_addr) + n_off;
  nb::gil_scoped_release release;
  static thread_local Work ws;
  const bool widened = rs::isa_widened(isa);
  const qk::QXBuf buf = prepare(ws, M, K, sb, widened);
  if (M >= kParallelQuantRows)
    split(M, threads, [&](int64_t m0, int64_t m1) { qk::quantize_isa(isa, xp, K, K, sb, m0, m1, buf); });
  else
    qk::quantize_isa(isa, xp, K, K, sb, 0, M, buf);
  const qk::QX qx{buf.q, buf.qw, buf.d, buf.xs, buf.dxs, M, K, sb};
  split(w.groups, threads, [&](int64_t g0, int64_t g1) { qk::gemm_isa(isa, w, qx, op, ldo, g0, g1); });
}

void qrows(const QSeg& seg, Vec<const int64_t> ids, Mat<float> out, unsigned threads) {
  const qk::QW& w = seg.w();
  const int64_t len = int64_t(ids.size()), k = w.k;
  if (int64_t(out.shape(0)) != len || int64_t(out.shape(1)) != k)
    throw std::invalid_argument("qrows: out must be [len(ids), k]");
  const int64_t* ip = ids.data();
  for (int64_t i = 0; i < len; ++i)
    if (ip[i] < 0 || ip[i] >= w.n) throw std::out_of_range("qrows: row id out of range");
  float* op = out.data();
  nb::gil_scoped_release release;
  split(len, threads, [&](int64_t a, int64_t b) { qk::dequant_rows(w, ip + a, b - a, op + a * k); });
}

// The activation quantizer alone (tests compare it across paths and with Python).
void qquantize(Mat<const float> x, Mat<int8_t> q, Mat<float> d, Mat<int32_t> xs, Mat<float> dxs,
               int sb, int isa) {
  const int64_t M = int64_t(x.shape(0)), K = int64_t(x.shape(1));
  if ((sb != 32 && sb != 16) || K % 32 != 0) throw std::invalid_argument("qquantize: K % 32, sb 16|32");
  auto is = [](const auto& a, int64_t r, int64_t c) {
    return int64_t(a.shape(0)) == r && int64_t(a.shape(1)) == c;
  };
  if (!is(q, M, K) || !is(d, M, K / 32) || !is(xs, M, K / sb) || !is(dxs, M, K / sb))
    throw std::invalid_argument("qquantize: output shapes");
  rs::require_isa(isa);
  const qk::QXBuf buf{q.data(), nullptr, d.data(), xs.data(), dxs.data()};
  qk::quantize_isa(isa, x.data(), K, K, sb, 0, M, buf);
}

}  // namespace

void register_qkernels(nb::module_& m) {
  nb::class_<QSeg>(m, "QSeg", "one quantized weight segment in the kernel layout (qkernels.h)")
      .def(nb::init<Vec<const uint8_t>, Vec<const uint8_t>, Vec<const uint8_t>, Vec<const int32_t>,
                    int64_t, int64_t, int, int, int, bool>(),
           nb::arg("qs"), nb::arg("scale"), nb::arg("mins"), nb::arg("zero"), nb::arg("n"),
           nb::arg("k"), nb::arg("sb"), nb::arg("bits"), nb::arg("sfmt"), nb::arg("lut") = false)
      .def_prop_ro("u6", [](const QSeg& s) { return s.w().u6; },
                   "every u < 64 (6-bit storage, or u8 found so): AVX2 without VNNI multiplies it by vpmaddubsw");
  m.def("qgemm", &qgemm, nb::arg("seg"), nb::arg("x_addr"), nb::arg("m"), nb::arg("out_addr"),
        nb::arg("ldo"), nb::arg("n_off"), nb::arg("threads"), nb::arg("isa"),
        "out[:, n_off:n_off+n] = x @ W^T for fp32 x [m, k] and out [m, ldo] at raw addresses");
  m.def("qrows", &qrows, nb::arg("seg"), nb::arg("ids"), nb::arg("out").noconvert(),
        nb::arg("threads") = 1, "dequantized rows ids of one quantized weight segment");
  m.def("qquantize", &qquantize, nb::arg("x").noconvert(), nb::arg("q").noconvert(),
        nb::arg("d").noconvert(), nb::arg("xs").noconvert(), nb::arg("dxs").noconvert(),
        nb::arg("sb"), nb::arg("isa"), "the activation quantizer of the quantized kernels");
}
