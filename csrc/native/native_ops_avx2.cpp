// The native forward's float kernels (native_ops.h), avx2 path.
#define NF_OPS ops_avx2
#include "native/native_ops.inc"
