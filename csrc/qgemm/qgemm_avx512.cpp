// AVX-512 (F/BW/VL) quantized product without VNNI. Compiled with -mavx512f -mavx512bw
// -mavx512vl -mfma -mf16c only: never with -mavx512vnni, so the compiler cannot form
// vpdpbusd/vpdpwssd here for CPUs that lack them.
#define QK_VNNI 0
#define QK_GEMM gemm_avx512
#include "qgemm/qgemm_avx512.inc"
