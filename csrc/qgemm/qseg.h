// One quantized weight segment as the Python side hands it to C++ (recallspec._kernels.QSeg):
// the kernel view qk::QW of the tensors that kernels/qlinear.py keeps, validated once,
// with the ndarray handles holding references so the memory stays alive (and no product
// converts a weight array per call: a torch tensor's DLPack conversion costs ~3 us). Shared by the
// per-product bindings (qbind.cpp) and the native forward (native_forward.cpp), which
// both receive the same Python objects (a named, non-anonymous class, so that the two
// translation units agree on its type).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "qgemm/qkernels.h"

namespace qk {

class QSeg {
 public:
  template <class T>
  using Vec = nanobind::ndarray<T, nanobind::ndim<1>, nanobind::c_contig, nanobind::device::cpu>;

  QSeg(Vec<const uint8_t> qs, Vec<const uint8_t> scale, Vec<const uint8_t> mins,
       Vec<const int32_t> zero, int64_t n, int64_t k, int sb, int bits, int sfmt, bool lut)
      : qs_(qs), scale_(scale), mins_(mins), zero_(zero) {
    if (sb != 32 && sb != 16) throw std::invalid_argument("QSeg: sb must be 32 or 16");
    if (bits != 4 && bits != 6 && bits != 8) throw std::invalid_argument("QSeg: bits must be 4, 6 or 8");
    if (bits == 4 && sb != 32) throw std::invalid_argument("QSeg: 4-bit storage needs sb = 32");
    if (n <= 0 || k <= 0 || k % 32 != 0) throw std::invalid_argument("QSeg: need n > 0 and K % 32 == 0");
    if (sfmt != kF32 && sfmt != kF16 && sfmt != kKS && sfmt != kE8)
      throw std::invalid_argument("QSeg: unknown scale format");
    if (sfmt == kKS && k % 256 != 0) throw std::invalid_argument("QSeg: K-quant scales need K % 256 == 0");
    if (lut && bits != 4) throw std::invalid_argument("QSeg: MXFP4 codes (lut) need 4-bit storage");
    // E8M0 bytes are unsigned powers of two: no format of mins.
    if (sfmt == kE8 && mins.size() != 0) throw std::invalid_argument("QSeg: E8M0 scales take no mins");
    w_ = QW{};
    w_.n = n;
    w_.k = k;
    w_.groups = (n + 15) / 16;
    w_.sb = sb;
    w_.u4 = bits == 4;
    w_.lut = lut;
    w_.p6 = bits == 6;
    w_.sfmt = sfmt;
    const size_t scale_bytes = size_t(w_.scale_bytes());
    if (qs.size() != size_t(w_.groups * w_.nsb() * w_.sb_bytes()) || scale.size() != scale_bytes ||
        (mins.size() != 0 && mins.size() != scale_bytes) ||
        (zero.size() != 0 && zero.size() != size_t(w_.groups * 16)))
      throw std::invalid_argument("QSeg: weight arrays do not match n, k, sb and the storage");
    // u8 storage with every u < 64 (Q5_*, Q6_K; Q8_0's q + 128 is not): byte products
    // fit vpmaddubsw (the AVX2 path without VNNI takes it). One pass over the bytes in
    // 4 KB pieces, stopping at the first piece with a larger byte (Q8_0: the first).
    // 6-bit storage holds nothing else.
    w_.u6 = w_.p6;
    if (bits == 8) {
      const uint8_t* b = qs.data();
      bool small = true;
      for (size_t i = 0; i < qs.size() && small; i += 4096) {
        uint8_t any = 0;
        for (size_t j = i, e = std::min(qs.size(), i + 4096); j < e; ++j) any |= b[j];
        small = any < 64;
      }
      w_.u6 = small;
    }
    for (size_t i = 0; i < zero.size(); ++i)
      if (zero.data()[i] <= -32768 || zero.data()[i] >= 32768)
        throw std::invalid_argument("QSeg: zero points must fit int16");
    w_.qs = qs.data();
    w_.scale = scale.data();
    w_.mins = mins.size() ? mins.data() : nullptr;
    w_.zero = zero.size() ? zero.data() : nullptr;
  }
  const QW& w() const { return w_; }

 private:
  Vec<const uint8_t> qs_, scale_, mins_;
  Vec<const int32_t> zero_;
  QW w_;
};

}  // namespace qk
