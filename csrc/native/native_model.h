// The native forward of a quantized CausalLM (models/transformer.py): one call runs the
// whole model over a flat ragged batch (runtime/batch.py): embeddings, per layer RMSNorm,
// the fused QKV product, q/k norms, RoPE, the KV-cache write, attention of every row over
// its own sequence's keys with the tree / window / padding mask, the output product, the
// gated MLP, residuals, and the final norm and head for the requested rows only.
// models/native.py builds it from the model's weights (native_bind.cpp) and marshals
// each call; native_forward.cpp computes. The Python forward stays the readable
// reference, which native_forward.cpp follows step by step.
//
// Invariant (batch invariance by construction): every output of a row is computed by a
// fixed sequence of float operations that depends only on that row's inputs and its own
// visible keys: the weight products are the kernels of qkernels.h (row-local activation
// quantization, exact integer dots, fixed accumulation), the rest the kernels of
// native_ops.h (fixed lane/tree orders, attention of one (row, head) in increasing key
// position, masked keys skipped). The split of rows, groups and (row, heads) items over
// threads varies with the thread count; what one output computes never does, and every
// instruction-set path computes the same bits.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>

#include "native/native_ops.h"
#include "native/native_plan.h"
#include "qgemm/qkernels.h"

namespace nf {

// A weight matrix [n, k]: quantized segments (rows [off, off + seg.n) of the output
// each), or dense fp32 rows (a float32 model's weights: the tests' tight parity oracle).
struct Matrix {
  std::vector<const qk::QW*> segs;
  std::vector<int64_t> offs;
  const float* dense = nullptr;
  int64_t n = 0, k = 0;
  bool empty() const { return segs.empty() && !dense; }
};

struct Layer {
  Matrix qkv, o, gate_up, down;  // (gate_up and down empty in a mixture of experts)
  // A mixture of experts: the router [experts, hidden] and each expert's gate-up and
  // down (NativeModel::experts computes it).
  Matrix router;
  std::vector<Matrix> expert_gate_up, expert_down;
  // gpt-oss: the router's logit biases [experts] (or null) and each expert's gate-up
  // [2 inter] (gate rows first, as its matrix) and down [hidden] biases (empty: none),
  // each added to its product's output as `out += bias` (the down's before the routing
  // weight); the sink logit of every query head [heads] (or null: no sinks).
  const float* router_b = nullptr;
  std::vector<const float*> expert_gate_up_b, expert_down_b;
  const float* sinks = nullptr;
  const float *qkv_b = nullptr, *o_b = nullptr, *attn_norm = nullptr, *ffn_norm = nullptr;
  const float *q_norm = nullptr, *k_norm = nullptr, *post_attn = nullptr, *post_ffn = nullptr;
  int32_t window = 0;  // 0: global attention
  int32_t rope = 0;    // which RoPE table (one per distinct RoPE), -1: none (NoPE layer)
  bool ready = false;
};

// Quantized activations for one sub-block length (qkernels.h), reused across calls.
struct QBuf {
  bool fresh = true;  // (per-thread buffers: not yet quantized for the current product)
  std::vector<int8_t> q;
  std::vector<int16_t> qw;
  std::vector<float> d, dxs;
  std::vector<int32_t> xs;
  qk::QXBuf prepare(int64_t M, int64_t K, int sb, bool widened) {
    q.resize(size_t(M * K));
    if (widened) qw.resize(size_t(M * K));
    d.resize(size_t(M * K / 32));
    xs.resize(size_t(M * K / sb));
    dxs.resize(size_t(M * K / sb));
    return {q.data(), widened ? qw.data() : nullptr, d.data(), xs.data(), dxs.data()};
  }
};

// A running argmax over a row's columns, offered candidates (a value and its column) in
// any order: it keeps the first NaN, else the largest value at its first column, so the
// result never depends on how the columns were split or in which order parts report.
// (Here, not in native_ops.h: that header is compiled for every instruction set too.)
struct ArgmaxAcc {
  float v = 0.0f;
  int64_t at = -1;  // -1: nothing offered yet
  // Whether a range starting at column `first`, whose largest number is m (has_nan: it
  // holds a NaN), may hold a candidate that offer() would take: when not, its argmax
  // need not be looked for.
  bool may_take(float m, bool has_nan, int64_t first) const {
    if (at < 0) return true;
    if (v != v) return has_nan && first < at;
    return has_nan || m > v || (m == v && first < at);
  }
  void offer(float cv, int64_t c) {
    const bool cn = cv != cv, bn = v != v;
    const bool better = at < 0 || (cn ? (!bn || c < at) : (!bn && (cv > v || (cv == v && c < at))));
    if (better) {
      v = cv;
      at = c;
    }
  }
};

enum Counter { kQuant, kGemm, kAttn, kOther, kTotal, kCounters };

struct Config {
  int64_t hidden, inter, vocab, layers, heads, kv_heads, head_dim;
  int64_t rot;                                  // dims of a head that RoPE rotates (<= head_dim)
  float eps, embed_scale, attn_scale, softcap;  // softcap 0: none
  float attn_softcap;                           // > 0: soft-capped attention scores (Gemma 2)
  float residual_scale;                         // each branch's output times this (Granite)
  float logit_div;                              // logits divided by this (Granite)
  bool gelu;                                    // tanh GELU, else SiLU (or swiglu_oai)
  // A mixture of experts in every layer (experts 0: a dense MLP; inter is then each
  // expert's size): each row's experts_used largest router logits, ties to the lower
  // expert; weights exp(l - l_max) / s, s over the chosen (norm_topk) or all experts.
  int64_t experts = 0, experts_used = 0;
  bool norm_topk = true;
  // gpt-oss's clamped SwiGLU (Ops::glu_oai) in place of gelu / SiLU, with its slope and
  // limit as fp32 (as the reference's float32 tensors compute with them).
  bool swiglu_oai = false;
  float swiglu_alpha = 1.702f, swiglu_limit = 7.0f;
};

class NativeModel {
 public:
  explicit NativeModel(const Config& cfg);

  // Weights (native_bind.cpp): matrices as lists of (QSeg, first row) or dense float32
  // [n, k] tensors; vectors as float32 tensors; None for absent optional ones.
  void set_embed(nanobind::object w);
  void set_head(nanobind::object w, nanobind::object final_norm);
  void set_layer(int64_t index, int32_t window, int32_t rope, nanobind::object qkv,
                 nanobind::object o, nanobind::object gate_up, nanobind::object down,
                 nanobind::object qkv_b, nanobind::object o_b, nanobind::object attn_norm,
                 nanobind::object ffn_norm, nanobind::object q_norm, nanobind::object k_norm,
                 nanobind::object post_attn, nanobind::object post_ffn,
                 nanobind::object sinks);

  // Runs the first n_layers layers, then the head for a.logits_rows into out [R, vocab]
  // and, unless argmax is null, each of those rows' argmax (Ops::argmax over the whole
  // row) into argmax [R]; releases the GIL. threads: parts of the pool to use; isa:
  // kernel_common.h's code.
  void forward(const BatchArgs& a, const CacheArgs& c, const RopeArgs& r, int64_t n_layers,
               float* out, int64_t* argmax, unsigned threads, int isa);

  // A mixture of experts' weights of a layer (set_layer first, gate_up and down None):
  // the router as a matrix, and lists of each expert's gate-up and down matrices; the
  // router's bias (None: none) and lists of each expert's gate-up and down biases
  // (None: none; gpt-oss).
  void set_experts(int64_t index, nanobind::object router, nanobind::list gate_ups,
                   nanobind::list downs, nanobind::object router_b,
                   nanobind::object gate_up_b, nanobind::object down_b);

  // Seconds per counter since the last reset (a clock read between the parts of a
  // forward while profiling is on), and the number of calls (counted whether or not
  // profiling is on, as the work below).
  void set_profiling(bool on) { profiling_ = on; }
  std::vector<double> seconds(bool reset, int64_t* calls);
  // A mixture of experts' work, counted by every forward (integer increments, no clock:
  // profiling need not be on): (layer, expert) products run (each expert once per layer
  // and forward for all the rows that chose it) and (layer, row) routings. expert_*():
  // since the last reset of seconds(); last_experts(): (runs, rows) of the last forward
  // call alone (zeroed as each call starts, so a call refused before its layers ran
  // counts none; read under the calls' lock, after that call returned).
  int64_t expert_runs() const { return expert_runs_; }
  int64_t expert_rows() const { return expert_rows_; }
  std::pair<int64_t, int64_t> last_experts() {
    std::lock_guard<std::mutex> lock(mu_);
    return {last_expert_runs_, last_expert_rows_};
  }

 private:
  Matrix matrix(nanobind::object w, int64_t n, int64_t k);
  const float* vec(nanobind::object v, int64_t n, bool optional);
  // Work on output columns [n0, n1) of every row, run by thread p right after computing
  // them (the head's soft-cap and argmax).
  using Epilogue = std::function<void(unsigned p, int64_t n0, int64_t n1)>;
  void matmul(const Matrix& m, const float* x, int64_t M, float* out, const float* bias,
              const Epilogue* epi = nullptr);
  // The mixture of experts of layer l over the T rows of x into out [T, hidden]: the
  // router's product; each row's experts and weights (row-local); each chosen expert's
  // gated MLP once over the rows that chose it (gathered in row order: its products are
  // row-local, so a row's result never depends on which rows share its experts); each
  // row's sum of its experts' outputs times their weights, in rank order.
  void experts(const Layer& l, const float* x, int64_t T, float* out);
  // The gated activation of one row: gu [2 inter] (gate, then up) into out [inter].
  void activation(const float* gu, float* out) const;
  // Adds the time since t0 to counter c and restarts t0; a product's quantization is
  // timed inside matmul and taken out of the gemm counter.
  void tick(Counter c, std::chrono::steady_clock::time_point& t0);

  const Config cfg_;
  std::vector<Layer> layers_;
  Matrix embed_, head_;
  const float* final_norm_ = nullptr;
  std::vector<nanobind::object> keep_;  // the Python objects whose memory the pointers use

  // Per-call state (the mutex serializes calls; buffers grow and are reused).
  std::mutex mu_;
  unsigned parts_ = 1;
  int isa_ = 0;
  const Ops* ops_ = nullptr;
  QBuf q32_, q16_;
  std::vector<QBuf> own_;  // [parts][sub-block 32, 16]: each thread's own (NativeModel::matmul)
  std::vector<float> h_, x_, qkv_, att_, o_, gu_, act_, fin_;
  // Experts: router logits [T, E]; each row's experts [T, K] and weights [T, K]; the
  // gathered rows of one expert and their outputs; every (row, rank) output [T, K, hid].
  std::vector<float> route_, weight_, xe_, gue_, acte_, ye_, ys_;
  std::vector<int64_t> chosen_, members_;
  std::vector<int64_t> member_count_;
  std::vector<ArgmaxAcc> best_;  // [parts][R, padded]: each thread's running argmax of each row
  Plan plan_;
  bool profiling_ = false;
  int64_t counters_[kCounters] = {};
  int64_t quant_in_gemm_ = 0;  // quantization time inside the interval the next tick closes
  int64_t calls_ = 0;
  int64_t expert_runs_ = 0, expert_rows_ = 0;
  int64_t last_expert_runs_ = 0, last_expert_rows_ = 0;
};

}  // namespace nf
