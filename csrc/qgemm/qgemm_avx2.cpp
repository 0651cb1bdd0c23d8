// AVX2 (+FMA, F16C) quantized product without VNNI. Compiled with -mavx2 -mfma -mf16c.
#define QK_VNNI 0
#define QK_GEMM gemm_avx2
#include "qgemm/qgemm_avx2.inc"
