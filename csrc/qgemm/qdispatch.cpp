// The instruction-set dispatch of the quantized kernels (qkernels.h), one place for the
// Python bindings (qbind.cpp) and the native forward (native_forward.cpp). Portable code:
// it only calls the path the code names, which the callers have checked (require_isa).
#include "common/kernel_common.h"
#include "qgemm/qkernels.h"

namespace qk {

void quantize_isa(int isa, const float* x, int64_t ldx, int64_t k, int sb, int64_t m0, int64_t m1,
                  const QXBuf& buf) {
  if (rs::isa_avx512(isa)) quantize_avx512(x, ldx, k, sb, m0, m1, buf);
  else if (rs::isa_avx2(isa)) quantize_avx2(x, ldx, k, sb, m0, m1, buf);
  else quantize_scalar(x, ldx, k, sb, m0, m1, buf);
  if (buf.qw) widen_pairs(buf, k, m0, m1);
}

void gemm_isa(int isa, const QW& w, const QX& x, float* out, int64_t ldo, int64_t g0, int64_t g1) {
  // 6-bit storage (qkernels.h): the VNNI products read it; the AMX tiles do not (their
  // loads keep u8), so that path's VNNI product takes it; AVX-512 without VNNI has no
  // 6-bit product and takes AVX2's.
  if (w.p6 && (isa == rs::kAvx512 || isa == rs::kAvx512Amx)) {
    if (isa == rs::kAvx512Amx) gemm_avx512vnni(w, x, out, ldo, g0, g1);
    else gemm_avx2(w, x, out, ldo, g0, g1);
    return;
  }
  switch (isa) {
    case rs::kAvx512Vnni: gemm_avx512vnni(w, x, out, ldo, g0, g1); break;
    case rs::kAvx512Amx: gemm_avx512amx(w, x, out, ldo, g0, g1); break;
    case rs::kAvx512: gemm_avx512(w, x, out, ldo, g0, g1); break;
    case rs::kAvx2: gemm_avx2(w, x, out, ldo, g0, g1); break;
    case rs::kAvx2Vnni: gemm_avxvnni(w, x, out, ldo, g0, g1); break;
    case rs::kAvx2VnniEvex: gemm_avx2vnni_evex(w, x, out, ldo, g0, g1); break;
    default: gemm_scalar(w, x, out, ldo, g0, g1); break;
  }
}

}  // namespace qk
