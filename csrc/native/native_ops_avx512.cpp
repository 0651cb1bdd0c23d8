// The native forward's float kernels (native_ops.h), avx512 path.
#define NF_OPS ops_avx512
#include "native/native_ops.inc"
