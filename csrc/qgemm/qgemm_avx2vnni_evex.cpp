// The AVX-VNNI product of qgemm_avxvnni.cpp, the same source compiled with AVX-512 VL +
// VNNI (EVEX-encoded vpdpbusd on ymm): CPUs with AVX-512 VNNI but no AVX-VNNI (Zen 4) run
// it, so that tests check that code there (kernel_common.h, kAvx2VnniEvex). Compiled with
// -mavx2 -mfma -mf16c -mavx512f -mavx512vl -mavx512vnni.
#define QK_VNNI 1
#define QK_GEMM gemm_avx2vnni_evex
#define QK_DPBUSD _mm256_dpbusd_epi32
#include "qgemm/qgemm_avx2.inc"
