// AVX2 quantized product with AVX-VNNI (VEX-encoded vpdpbusd). Compiled with -mavx2 -mfma
// -mf16c -mavxvnni: runs on CPUs that report avxvnni (kernel_common.h, kAvx2Vnni).
#define QK_VNNI 1
#define QK_GEMM gemm_avxvnni
#define QK_DPBUSD _mm256_dpbusd_avx_epi32
#include "qgemm/qgemm_avx2.inc"
