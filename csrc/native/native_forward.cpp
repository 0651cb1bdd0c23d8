// The computation of the native forward (native_model.h: what and the invariant).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <vector>

#include <nanobind/nanobind.h>

#include "common/kernel_common.h"
#include "native/native_model.h"
#include "qgemm/qkernels.h"

namespace nf {

namespace {

using ns_clock = std::chrono::steady_clock;

// Rows below which the row-wise steps (norms, RoPE, activations, residuals) run in the
// calling thread: each fork-join is a point where a descheduled worker stalls the step on
// a busy machine, and one costs ~0.15 us on an idle one. From 8 rows the split pays: a
// k = 16 forward's row-wise steps 0.67-0.70 -> 0.45-0.47 ms on two threads, k = 8 0.36-0.39
// -> 0.27-0.29 (benchmarks/experiments/exp_verify_profile.py, 200 cached; from 4 rows: within 0.05 ms).
constexpr int64_t kParallelRowSteps = 8;
// Rows from which the activations are quantized once into a shared buffer, split over
// the threads (below: each thread quantizes all rows into its own, NativeModel::matmul).
constexpr int64_t kParallelRows = 32;
// Attention below this many (key x head_dim) products runs in the calling thread.
constexpr int64_t kParallelAttn = 1 << 15;
// Keys x head size per row block from which attention streams its keys and values from
// memory rather than cache (512 keys of a 64-wide head: 128 KB of keys and as much of
// values per kv head and layer; see the attention split below).
constexpr int64_t kStreamKeyFloats = 1 << 15;

using rs::split;
using rs::split_parts;

// Output groups of 16 columns a thread computes before it runs a product's epilogue
// over them (NativeModel::matmul): 1024 columns, 4 KB a row, still in its L1 or L2.
constexpr int64_t kEpilogueGroups = 64;

}  // namespace

const Ops& ops_for(int isa) {
  return rs::isa_avx512(isa) ? ops_avx512() : rs::isa_avx2(isa) ? ops_avx2() : ops_scalar();
}

void NativeModel::tick(Counter c, ns_clock::time_point& t0) {
  if (!profiling_) return;
  const ns_clock::time_point t1 = ns_clock::now();
  counters_[c] += (t1 - t0).count();
  if (c == kGemm) counters_[c] -= quant_in_gemm_;
  quant_in_gemm_ = 0;
  t0 = t1;
}

void NativeModel::matmul(const Matrix& m, const float* x, int64_t M, float* out, const float* bias,
                         const Epilogue* epi) {
  // Without an epilogue a thread computes its whole part at once; with one, in chunks of
  // kEpilogueGroups groups (each output's arithmetic is the same however the columns are
  // cut), running epi on each chunk's columns right after computing them.
  auto chunks = [&](unsigned p, int64_t a, int64_t b, int64_t first, int64_t last, auto&& gemm) {
    const int64_t step = epi ? kEpilogueGroups : b - a;
    for (int64_t c = a; c < b; c += step) {
      const int64_t e = std::min(b, c + step);
      gemm(c, e);
      if (epi) (*epi)(p, first + 16 * c, std::min(last, first + 16 * e));
    }
  };
  if (m.dense) {
    split_parts((m.n + 15) / 16, parts_, [&](unsigned p, int64_t a, int64_t b) {
      chunks(p, a, b, 0, m.n, [&](int64_t c, int64_t e) {
        ops_->dense(x, M, m.k, m.dense, 16 * c, std::min(m.n, 16 * e), out, m.n);
      });
    });
  }
  const bool widened = rs::isa_widened(isa_);
  auto quantize = [&](const qk::QXBuf& buf, int sb, int64_t a, int64_t b) {
    qk::quantize_isa(isa_, x, m.k, m.k, sb, a, b, buf);
  };
  auto timed = [&](auto&& fn) {  // fn(), its time counted as quantization (calling thread)
    ns_clock::time_point q0;
    if (profiling_) q0 = ns_clock::now();
    fn();
    if (profiling_) {
      const int64_t dt = (ns_clock::now() - q0).count();
      counters_[kQuant] += dt;
      quant_in_gemm_ += dt;
    }
  };
  // The activations are quantized once per sub-block length for every segment. Below
  // kParallelRows rows (decode, verification) each thread quantizes all of them into
  // its own buffer when it first needs them: a shared buffer, written by one thread (or
  // by both, half each), must take back cache lines that the other core read in the
  // previous product. A k = 16 forward (benchmarks/experiments/exp_verify_profile.py, 200 cached) spent
  // 0.25 ms quantizing on one thread, 0.70 ms with two (0.47 ms split over both), and
  // 0.27 ms with a buffer per thread. Same values either way (the quantizer is row-local).
  const bool own = M < kParallelRows;
  if (own) {
    own_.resize(size_t(2 * parts_));
    for (QBuf& qb : own_) qb.fresh = true;
  }
  bool done32 = false, done16 = false;
  for (size_t i = 0; i < m.segs.size(); ++i) {
    const qk::QW& w = *m.segs[i];
    qk::QX shared{};
    if (!own) {
      QBuf& qb = w.sb == 32 ? q32_ : q16_;
      bool& done = w.sb == 32 ? done32 : done16;
      const qk::QXBuf buf = qb.prepare(M, m.k, w.sb, widened);
      if (!done) timed([&] { split(M, parts_, [&](int64_t a, int64_t b) { quantize(buf, w.sb, a, b); }); });
      done = true;
      shared = qk::QX{buf.q, buf.qw, buf.d, buf.xs, buf.dxs, M, m.k, w.sb};
    }
    auto operand = [&](unsigned p) {  // (runs in part p's thread)
      if (!own) return shared;
      QBuf& qb = own_[size_t(2 * p + (w.sb == 32 ? 0 : 1))];
      const qk::QXBuf buf = qb.prepare(M, m.k, w.sb, widened);
      if (qb.fresh) {
        if (p == 0) timed([&] { quantize(buf, w.sb, 0, M); });
        else quantize(buf, w.sb, 0, M);
        qb.fresh = false;
      }
      return qk::QX{buf.q, buf.qw, buf.d, buf.xs, buf.dxs, M, m.k, w.sb};
    };
    float* o = out + m.offs[i];
    split_parts(w.groups, parts_, [&](unsigned p, int64_t a, int64_t b) {
      const qk::QX qx = operand(p);
      chunks(p, a, b, m.offs[i], m.offs[i] + w.n,
             [&](int64_t g0, int64_t g1) { qk::gemm_isa(isa_, w, qx, o, m.n, g0, g1); });
    });
  }
  if (bias)
    for (int64_t r = 0; r < M; ++r)
      for (int64_t j = 0; j < m.n; ++j) out[r * m.n + j] += bias[j];  // as `out += bias`
}

void NativeModel::activation(const float* gu, float* out) const {
  if (cfg_.swiglu_oai) ops_->glu_oai(gu, out, cfg_.inter, cfg_.swiglu_alpha, cfg_.swiglu_limit);
  else ops_->glu(gu, out, cfg_.inter, cfg_.gelu);
}

void NativeModel::experts(const Layer& l, const float* x, int64_t T, float* out) {
  const int64_t E = cfg_.experts, K = cfg_.experts_used, hid = cfg_.hidden, I = cfg_.inter;
  route_.resize(size_t(T * E));
  chosen_.resize(size_t(T * K));
  weight_.resize(size_t(T * K));
  ys_.resize(size_t(T * K * hid));
  matmul(l.router, x, T, route_.data(), l.router_b);
  // Each row's experts: K passes, each taking the largest logit not yet taken (a NaN is
  // never larger, so it is taken only after every number; ties: the lower expert).
  std::vector<uint8_t> taken(static_cast<size_t>(E), uint8_t(0));
  for (int64_t t = 0; t < T; ++t) {
    const float* lg = route_.data() + t * E;
    int64_t* ch = chosen_.data() + t * K;
    std::fill(taken.begin(), taken.end(), uint8_t(0));
    for (int64_t r = 0; r < K; ++r) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e)
        if (!taken[size_t(e)] && (best < 0 || lg[e] > lg[best])) best = e;
      taken[size_t(best)] = 1;
      ch[r] = best;
    }
    // Weights: exp(l - l_max) / s, s summed in rank order (over the chosen) or in expert
    // order (over all); one std::exp, the same on every instruction-set path.
    const float m = lg[ch[0]];
    float* w = weight_.data() + t * K;
    float s = 0.0f;
    for (int64_t r = 0; r < K; ++r) w[r] = std::exp(lg[ch[r]] - m);
    if (cfg_.norm_topk) {
      for (int64_t r = 0; r < K; ++r) s += w[r];
    } else {
      for (int64_t e = 0; e < E; ++e) s += std::exp(lg[e] - m);
    }
    for (int64_t r = 0; r < K; ++r) w[r] = w[r] / s;
  }
  // The (row, rank) pairs of each expert in row order (a counting sort).
  member_count_.assign(size_t(E + 1), 0);
  for (int64_t i = 0; i < T * K; ++i) ++member_count_[size_t(chosen_[size_t(i)] + 1)];
  for (int64_t e = 0; e < E; ++e) member_count_[size_t(e + 1)] += member_count_[size_t(e)];
  members_.resize(size_t(T * K));
  {
    std::vector<int64_t> at(member_count_.begin(), member_count_.end() - 1);
    for (int64_t i = 0; i < T * K; ++i) members_[size_t(at[size_t(chosen_[size_t(i)])]++)] = i;
  }
  last_expert_rows_ += T;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t first = member_count_[size_t(e)], n = member_count_[size_t(e + 1)] - first;
    if (n == 0) continue;
    ++last_expert_runs_;
    const int64_t* mem = members_.data() + first;
    xe_.resize(size_t(n * hid));
    gue_.resize(size_t(n * 2 * I));
    acte_.resize(size_t(n * I));
    ye_.resize(size_t(n * hid));
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(xe_.data() + i * hid, x + mem[i] / K * hid, size_t(hid) * sizeof(float));
    // (gpt-oss: each product's bias added to its output, the down's before the routing
    // weight, as the reference's products do.)
    const float* gu_b = l.expert_gate_up_b.empty() ? nullptr : l.expert_gate_up_b[size_t(e)];
    const float* down_b = l.expert_down_b.empty() ? nullptr : l.expert_down_b[size_t(e)];
    matmul(l.expert_gate_up[size_t(e)], xe_.data(), n, gue_.data(), gu_b);
    for (int64_t i = 0; i < n; ++i) activation(gue_.data() + i * 2 * I, acte_.data() + i * I);
    matmul(l.expert_down[size_t(e)], acte_.data(), n, ye_.data(), down_b);
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(ys_.data() + mem[i] * hid, ye_.data() + i * hid, size_t(hid) * sizeof(float));
  }
  // Each row: its experts' outputs times their weights, summed in rank order (each
  // product rounded, then added: -ffp-contract=off).
  for (int64_t t = 0; t < T; ++t) {
    float* o = out + t * hid;
    const float* y = ys_.data() + t * K * hid;
    const float* w = weight_.data() + t * K;
    for (int64_t j = 0; j < hid; ++j) o[j] = y[j] * w[0];
    for (int64_t r = 1; r < K; ++r)
      for (int64_t j = 0; j < hid; ++j) o[j] = o[j] + y[r * hid + j] * w[r];
  }
}

void NativeModel::forward(const BatchArgs& a, const CacheArgs& c, const RopeArgs& r, int64_t n_layers,
                          float* out, int64_t* argmax, unsigned threads, int isa) {
  const int64_t H = cfg_.heads, Hkv = cfg_.kv_heads, D = cfg_.head_dim, hid = cfg_.hidden;
  const int64_t I = cfg_.inter, nq = H * D, nkv = Hkv * D, nqkv = nq + 2 * nkv, group = H / Hkv;
  const float eps = cfg_.eps;
  nanobind::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(mu_);
  // The last call's own counts start here, before any check may refuse it: a refused
  // call leaves none of an earlier call's behind.
  last_expert_runs_ = last_expert_rows_ = 0;
  if (n_layers < 0 || n_layers > cfg_.layers) throw std::invalid_argument("forward: num_layers out of range");
  if (embed_.empty() || head_.empty()) throw std::logic_error("forward: weights not set");
  std::vector<int32_t> windows, ropes;
  for (int64_t li = 0; li < n_layers; ++li) {
    if (!layers_[size_t(li)].ready) throw std::logic_error("forward: a layer's weights are not set");
    windows.push_back(layers_[size_t(li)].window);
    ropes.push_back(layers_[size_t(li)].rope);
  }
  // (A cache may hold fewer layers than the model: a self-draft's own cache for the
  // first layers it runs.)
  if (c.layers < n_layers || c.kv_heads != Hkv || c.head_dim != D)
    throw std::invalid_argument("forward: the KV cache does not match the model");
  rs::require_isa(isa);
  ns_clock::time_point t0 = ns_clock::now();
  const ns_clock::time_point start = t0;
  plan_.build(a, c, r, windows, ropes, cfg_.vocab);  // validates every index used below
  parts_ = std::max(1u, std::min(threads, rs::pool().parts()));
  isa_ = isa;
  ops_ = &ops_for(isa);
  const Ops& op = *ops_;
  const int64_t T = a.T, R = a.R;
  for (auto* v : {&h_, &x_, &o_}) v->resize(size_t(T * hid));
  qkv_.resize(size_t(T * nqkv));
  att_.resize(size_t(T * nq));
  gu_.resize(size_t(T * 2 * I));
  act_.resize(size_t(T * I));
  float *h = h_.data(), *x = x_.data(), *qkv = qkv_.data(), *att = att_.data(), *o = o_.data();
  float *gu = gu_.data(), *act = act_.data();
  // fn(t) for every row, split over the threads when there are enough rows.
  auto rows = [&](auto&& fn) {
    auto range = [&](int64_t t0_, int64_t t1_) {
      for (int64_t t = t0_; t < t1_; ++t) fn(t);
    };
    if (T >= kParallelRowSteps) split(T, parts_, range);
    else range(0, T);
  };

  // Embeddings: the dequantized rows (QuantizedWeight.rows), times Gemma's scale.
  rows([&](int64_t t) {
    const int64_t id = a.ids[t];
    if (embed_.dense) {
      std::memcpy(h + t * hid, embed_.dense + id * hid, size_t(hid) * sizeof(float));
    } else {
      size_t s = 0;
      while (s + 1 < embed_.segs.size() && id >= embed_.offs[s + 1]) ++s;
      const int64_t local = id - embed_.offs[s];
      qk::dequant_rows(*embed_.segs[s], &local, 1, h + t * hid);
    }
    if (cfg_.embed_scale != 1.0f) op.scale(h + t * hid, hid, cfg_.embed_scale);
  });
  tick(kOther, t0);

  for (int64_t li = 0; li < n_layers; ++li) {
    const Layer& l = layers_[size_t(li)];
    rows([&](int64_t t) { op.rms_norm(h + t * hid, l.attn_norm, x + t * hid, hid, eps); });
    tick(kOther, t0);
    matmul(l.qkv, x, T, qkv, l.qkv_b);
    tick(kGemm, t0);
    // q/k norms and RoPE (of the first rot dims of each head; none in a NoPE layer) per
    // head; keys and values into the cache at (slot, cache_pos).
    const int64_t rot = cfg_.rot;
    const float* cos_t = l.rope >= 0 ? r.cos[size_t(l.rope)] : nullptr;
    const float* sin_t = l.rope >= 0 ? r.sin[size_t(l.rope)] : nullptr;
    rows([&](int64_t t) {
      float* row = qkv + t * nqkv;
      for (int64_t hh = 0; hh < H + Hkv; ++hh) {
        const float* nw = hh < H ? l.q_norm : l.k_norm;
        if (nw) op.rms_norm(row + hh * D, nw, row + hh * D, D, eps);
        if (cos_t) op.rope(row + hh * D, cos_t + a.positions[t] * rot, sin_t + a.positions[t] * rot, rot);
      }
      for (int64_t g = 0; g < Hkv; ++g) {
        const int64_t at = c.offset(li, plan_.slot(t), g, plan_.cache_pos(t));
        if (c.half) {
          op.to_half(row + nq + g * D, static_cast<uint16_t*>(c.k) + at, D);
          op.to_half(row + nq + nkv + g * D, static_cast<uint16_t*>(c.v) + at, D);
        } else {
          std::memcpy(static_cast<float*>(c.k) + at, row + nq + g * D, size_t(D) * sizeof(float));
          std::memcpy(static_cast<float*>(c.v) + at, row + nq + nkv + g * D, size_t(D) * sizeof(float));
        }
      }
    });
    tick(kOther, t0);
    // Attention: items (block of rows, group of hb query heads of one kv head), split by
    // their key counts; an item runs in one thread. hb: the largest divisor of the kv
    // group (<= 4) that still spreads the items evenly over the threads (a SmolLM2
    // decode row at a short context: 9 single heads, not 3 groups of 3, for two
    // threads); the heads of an item share key and value loads. Once a row block's keys
    // per head reach kStreamKeyFloats, the keys and values stream from memory, and
    // splitting a kv head's query heads over threads makes each thread stream that kv
    // head: then hb is the largest divisor with at least one item per thread, balanced
    // or not (SmolLM2 decode at 1,024 cached, two threads: attention 2.6 -> 1.8 ms,
    // benchmarks/experiments/exp_verify_profile.py). Nothing of this changes a head's arithmetic.
    const Plan::Kind& kind = plan_.kind(l.window);
    const int64_t nb = int64_t(kind.blocks.size()), np = int64_t(parts_);
    int64_t hb = std::min<int64_t>(group, 4);
    // (nb >= 1: build_batch refuses a batch without rows, and every row opens or joins a
    // block.)
    const bool stream = kind.total_keys / nb * D >= kStreamKeyFloats;
    for (; hb > 1; --hb) {
      const int64_t items = nb * Hkv * (group / hb);
      if (group % hb == 0 && items >= np && (stream || items % np == 0 || items >= 2 * np)) break;
    }
    const int64_t groups = H / hb;  // items per row block
    // A 16-bit cache: a decode row's attention converts each key and value as it loads
    // them (it streams half the bytes); blocks of more rows (verification, prefill)
    // widen tiles of them once and share those (native_attention.inc). Either way the
    // same arithmetic on the same (exactly converted) values.
    auto attend = [&](int64_t i0, int64_t i1) {
      static thread_local std::vector<float> scratch;
      for (int64_t i = i0; i < i1; ++i) {
        const Plan::RowBlock& b = kind.blocks[size_t(i / groups)];
        const int64_t h0 = (i % groups) * hb;
        Keys keys[kMaxAttnRows];
        int64_t most = 0;
        for (int64_t r = 0; r < b.rows; ++r) {
          keys[r] = kind.keys(b.t + r);
          most = std::max(most, keys[r].size());
        }
        scratch.resize(size_t(attn_scratch(b.rows, hb, most, D)));
        const int64_t slot = plan_.slot(b.t), g = h0 / group;
        const size_t elem = c.half ? sizeof(uint16_t) : sizeof(float);
        const size_t base = size_t(c.offset(li, slot, g, 0)) * elem;
        const AttnBlock ab{qkv + b.t * nqkv + h0 * D, nqkv, att + b.t * nq + h0 * D, nq, keys,
                           b.rows, hb, static_cast<const char*>(c.k) + base,
                           static_cast<const char*>(c.v) + base, D, cfg_.attn_scale,
                           cfg_.attn_softcap, c.half, l.sinks ? l.sinks + h0 : nullptr};
        op.attend(ab, scratch.data());
      }
    };
    if (parts_ > 1 && kind.total_keys * H * D >= kParallelAttn) {
      const std::vector<int64_t> cuts = kind.cuts(groups, parts_);
      rs::pool().run(parts_, [&](unsigned p) { attend(cuts[p], cuts[p + 1]); });
    } else {
      attend(0, nb * groups);
    }
    tick(kAttn, t0);
    matmul(l.o, att, T, o, l.o_b);
    tick(kGemm, t0);
    rows([&](int64_t t) {
      if (l.post_attn) op.rms_norm(o + t * hid, l.post_attn, o + t * hid, hid, eps);
      if (cfg_.residual_scale != 1.0f) op.scale(o + t * hid, hid, cfg_.residual_scale);
      op.add(h + t * hid, o + t * hid, hid);
      op.rms_norm(h + t * hid, l.ffn_norm, x + t * hid, hid, eps);
    });
    tick(kOther, t0);
    if (cfg_.experts) {
      experts(l, x, T, o);  // (its row-wise steps are counted as products)
      tick(kGemm, t0);
    } else {
      matmul(l.gate_up, x, T, gu, nullptr);
      tick(kGemm, t0);
      rows([&](int64_t t) { activation(gu + t * 2 * I, act + t * I); });
      tick(kOther, t0);
      matmul(l.down, act, T, o, nullptr);
      tick(kGemm, t0);
    }
    rows([&](int64_t t) {
      if (l.post_ffn) op.rms_norm(o + t * hid, l.post_ffn, o + t * hid, hid, eps);
      if (cfg_.residual_scale != 1.0f) op.scale(o + t * hid, hid, cfg_.residual_scale);
      op.add(h + t * hid, o + t * hid, hid);
    });
    tick(kOther, t0);
  }

  // The final norm and the head for the requested rows only.
  if (R > 0) {
    fin_.resize(size_t(R * hid));
    for (int64_t i = 0; i < R; ++i)
      op.rms_norm(h + a.logits_rows[i] * hid, final_norm_, fin_.data() + i * hid, hid, eps);
    tick(kOther, t0);
    // The soft-cap (elementwise) and each row's argmax run as the product's epilogue, by
    // the thread that computed the columns, while they are in its cache (the argmax
    // saves greedy verification a pass over every row's vocabulary; issue 18); both are
    // timed as part of the product. Each thread keeps one ArgmaxAcc per row, merged at
    // the end (ArgmaxAcc's choice does not depend on how the columns were split).
    const int64_t V = cfg_.vocab;
    const float cap = cfg_.softcap, div = cfg_.logit_div;
    const int64_t stride = (R + 3) / 4 * 4;  // threads' accumulators a cache line apart
    if (argmax) best_.assign(size_t(parts_ * stride), ArgmaxAcc{});
    const Epilogue epi = [&](unsigned p, int64_t n0, int64_t n1) {
      for (int64_t i = 0; i < R; ++i) {
        float* row = out + i * V;
        if (div != 1.0f)  // (an IEEE division: the same bits on every path)
          for (int64_t j = n0; j < n1; ++j) row[j] = row[j] / div;
        if (cap > 0.0f) op.softcap(row + n0, n1 - n0, cap);
        if (argmax) {  // the chunk's argmax only when it may beat the part's so far
          ArgmaxAcc& acc = best_[size_t(p * stride + i)];
          bool nan = false;
          const float m = op.max(row + n0, n1 - n0, &nan);
          if (acc.may_take(m, nan, n0)) {
            const int64_t j = n0 + op.argmax(row + n0, n1 - n0);
            acc.offer(row[j], j);
          }
        }
      }
    };
    matmul(head_, fin_.data(), R, out, nullptr, cap > 0.0f || div != 1.0f || argmax ? &epi : nullptr);
    if (argmax) {
      for (int64_t i = 0; i < R; ++i) {
        ArgmaxAcc acc;
        for (unsigned p = 0; p < parts_; ++p) {
          const ArgmaxAcc& b = best_[size_t(p * stride + i)];
          if (b.at >= 0) acc.offer(b.v, b.at);
        }
        argmax[i] = acc.at;
      }
    }
    tick(kGemm, t0);
  }
  if (profiling_) counters_[kTotal] += (ns_clock::now() - start).count();
  ++calls_;
  expert_runs_ += last_expert_runs_;
  expert_rows_ += last_expert_rows_;
}

}  // namespace nf
