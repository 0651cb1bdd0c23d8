// The float work of the native forward outside the weight products (native_forward.cpp):
// RMSNorm, RoPE, attention of one (row, head), the gated activations, soft-capping.
// One set per instruction-set path (native_ops.inc compiled three times); every set
// gives the same bits, because the arithmetic of each output is fixed here and written
// once, in GCC vector code whose semantics are lane-wise IEEE operations (the files are
// compiled with -ffp-contract=off and without -ffast-math: no contraction, no
// reassociation, no approximate reciprocals), with fma explicit.
//
// Canonical arithmetic (u = a 16-lane vector; reduce16 = the tree of kernels.cpp:
// pairs (l, l+8), then (l, l+4), (l, l+2), (0, 1)):
//   dot(a, b), n % 16 == 0: lane l = fma chain over a[16i+l]*b[16i+l] in increasing i,
//     from +0; then reduce16.
//   rms_norm: ss = dot(x, x); r = 1 / sqrt(ss / n + eps); y = (x * r) * w.
//   rope (rotate-half, the reference's own three operations per element):
//     y[i] = x[i]*cos[i] - x[i+h]*sin[i], y[i+h] = x[i+h]*cos[i+h] + x[i]*sin[i].
//   exp: our polynomial (exp_v below), 0 below -86, clamped at 88: the same on every path.
//   attention of one query row q and one head over its visible keys k_0..k_{n-1}, in
//     increasing cache position (the order defines j): s_j = dot(q, k_j) * scale, then
//     with a soft-cap c > 0 s_j = tanh(s_j / c) * c (tanh as below);
//     m = max s_j (exact); p_j = exp(s_j - m); l = reduce16 of lanes l = sum of p_j over
//     j = l mod 16 in increasing j; o[d] = fma chain of p_j * v_j[d] in increasing j;
//     out[d] = o[d] * (1 / l). Only visible keys enter (a masked key contributes
//     nothing), so a row's result depends on its own keys only, never on the batch,
//     the tree around it, the thread that runs it or the path.
//     With a sink logit g for the head (gpt-oss): m = max(max s_j, g) (exact), and
//     l = reduce16(...) + exp(g - m), the sink's term added last: it takes probability
//     mass and adds no value (o[d] unchanged).
//   silu(g) * u = (g / (1 + exp(-g))) * u;
//   swiglu_oai (gpt-oss; alpha, limit L as fp32): g' = min(g, L), u' = min(max(u, -L), L)
//     (a NaN stays NaN, as torch.clamp), (g' * (1 / (1 + exp(-(g' * alpha))))) * (u' + 1);
//   gelu_tanh(g) * u = ((0.5 * g) * (1 + tanh(c * (g + 0.044715 * (g * g * g))))) * u,
//     c = sqrt(2/pi) as fp32; tanh(a) = sign(a) * (1 - e) / (1 + e), e = exp(-2|a|).
//   softcap: x = tanh(x / cap) * cap.
//   sampling weights: w[i] = exp(x[i] / t - m), m = (max of x) / t (= the max of the
//     x[i] / t: division by t > 0 keeps the order), in the same exp; sums of weights in
//     float64 (Ops::chunk_sum).
#pragma once

#include <cstdint>

namespace nf {

// The keys one query row sees, as cache positions of its sequence's slot: the range
// [lo, hi) and then list[0, cnt) (increasing, all >= hi).
struct Keys {
  int32_t lo, hi;
  const int32_t* list;
  int32_t cnt;
  int64_t size() const { return int64_t(hi - lo) + cnt; }
  int32_t at(int64_t j) const { return j < hi - lo ? lo + int32_t(j) : list[j - (hi - lo)]; }
};

// A block of attention work: rows (<= kMaxAttnRows) of one sequence whose visible keys
// all start at the same lo, and `heads` (<= 4) query heads sharing one kv head. Row r,
// head h: query at q + r * q_stride + h * d, result at out + r * out_stride + h * d.
constexpr int64_t kMaxAttnRows = 8;
struct AttnBlock {
  const float* q;
  int64_t q_stride;
  float* out;
  int64_t out_stride;
  const Keys* keys;  // [rows]
  int64_t rows, heads;
  const void *k, *v;  // position 0 of the kv head's [N, d] cache rows
  int64_t d;
  float scale;
  float softcap;  // > 0: scores soft-capped, tanh(s / softcap) * softcap (Gemma 2)
  bool half;  // k and v hold IEEE binary16 bits (else float32)
  // The sink logits of the block's heads (sinks[h] for head h of the block), or null:
  // none. Each joins its head's softmax denominator (canonical arithmetic above).
  const float* sinks = nullptr;
};

// Keys per block of attention's value pass: their values (<= 32 KB as floats) stay in L1
// while every row of the block uses them.
constexpr int64_t attn_value_block(int64_t d) { return 8192 / d > 16 ? 8192 / d : 16; }

// Floats of scratch Ops::attend needs for a block: per (row, head) pair the scores of its
// keys (+ 16) and d value accumulators, then one tile of widened 16-bit keys (16 of them)
// or values (a value block).
constexpr int64_t attn_scratch(int64_t rows, int64_t heads, int64_t most_keys, int64_t d) {
  return rows * heads * (most_keys + 16 + d) + attn_value_block(d) * d;
}

struct Ops {
  // y = rms_norm(x) * w over n (n % 16 == 0); y may be x.
  void (*rms_norm)(const float* x, const float* w, float* y, int64_t n, float eps);
  // Rotate-half RoPE of one head of d values (d % 32 == 0) in place.
  void (*rope)(float* x, const float* cos, const float* sin, int64_t d);
  // Attention of a block of rows x heads (AttnBlock); scratch holds attn_scratch(rows,
  // heads, the most keys of a row, d) floats. Each (row, head)'s result is the one it
  // would get alone: the block only shares loads and hides latencies.
  void (*attend)(const AttnBlock& block, float* scratch);
  // out[i] = act(gu[i]) * gu[n + i] for i < n (n % 16 == 0); gelu: tanh GELU, else SiLU.
  void (*glu)(const float* gu, float* out, int64_t n, bool gelu);
  // out[i] = swiglu_oai(gu[i], gu[n + i]) for i < n (n % 16 == 0): gpt-oss's clamped
  // SwiGLU with slope alpha and limit (canonical arithmetic above).
  void (*glu_oai)(const float* gu, float* out, int64_t n, float alpha, float limit);
  // x = tanh(x / cap) * cap for n values (any n).
  void (*softcap)(float* x, int64_t n, float cap);
  // out[m * ldo + n] = dot(x[m], w[n]) for m < M and n in [n0, n1), x [M, k], w [N, k]
  // (k % 16 == 0): the arithmetic of linear_f32 (kernels.cpp), so dense fp32 weights give
  // the fp32 reference model's own bits (the native forward's tight parity oracle).
  void (*dense)(const float* x, int64_t M, int64_t k, const float* w, int64_t n0, int64_t n1,
                float* out, int64_t ldo);
  // h += o; x *= s (n % 16 == 0).
  void (*add)(float* h, const float* o, int64_t n);
  void (*scale)(float* x, int64_t n, float s);
  // The index of the first largest of x[0, n) (n >= 1), a NaN counting as larger than
  // every number (the first NaN if there is one): numpy's and torch's argmax. Only exact
  // comparisons (-0 == +0), so every path gives the same index.
  int64_t (*argmax)(const float* x, int64_t n);
  // The largest number in x[0, n) (n >= 1; -inf if there is none) and whether x holds a
  // NaN: a cheaper first pass that tells when argmax can be skipped.
  float (*max)(const float* x, int64_t n, bool* has_nan);
  // Sampling weights of n logits at temperature t > 0 (canonical arithmetic above),
  // m = max(x) / t computed by the caller; -inf logits get weight 0. chunks[c] =
  // chunk_sum of w[64 c, min(n, 64 c + 64)).
  void (*sample_weights)(const float* x, int64_t n, float t, float m, float* w, double* chunks);
  // The float64 sum of w[0, len) (len <= 64): lane l of 8 adds w[8 j + l] in increasing j
  // from +0, then the tree (l, l+4), (l, l+2), (0, 1).
  double (*chunk_sum)(const float* w, int64_t len);
  // IEEE binary16 conversions of n values (n % 16 == 0): to_half rounds to nearest even
  // (overflow to +-inf, a NaN stays a quiet NaN), from_half is exact; both are what the
  // F16C instructions do, so every path gives the same bits (and torch's .half()).
  void (*to_half)(const float* x, uint16_t* y, int64_t n);
  void (*from_half)(const uint16_t* x, float* y, int64_t n);
};

const Ops& ops_scalar();
const Ops& ops_avx2();
const Ops& ops_avx512();
// The table of a kernel_common.h path code (rs::Isa; VNNI runs the avx512 table),
// defined in native_forward.cpp (a baseline file: not inline here, where each path's
// file would compile its own copy).
const Ops& ops_for(int isa);

}  // namespace nf
