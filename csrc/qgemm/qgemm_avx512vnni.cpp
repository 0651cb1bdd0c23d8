// AVX-512 VNNI quantized product (vpdpbusd: u8 weights x s8 activations, 4 per lane).
#define QK_VNNI 1
#define QK_GEMM gemm_avx512vnni
#include "qgemm/qgemm_avx512.inc"
