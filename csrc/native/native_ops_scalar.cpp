// The native forward's float kernels (native_ops.h), scalar path.
#define NF_OPS ops_scalar
#include "native/native_ops.inc"
