// Python side of the native forward (native_model.h), registered into recallspec._kernels:
// the weights handed over once (kept alive by references to their Python objects), and
// the per-call marshalling of models/native.py.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

#include "common/kernel_common.h"
#include "native/native_model.h"
#include "qgemm/qseg.h"

namespace nb = nanobind;

namespace nf {

namespace {

using FVec = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using FMat = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

void need(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("NativeModel: " + what);
}

}  // namespace

NativeModel::NativeModel(const Config& cfg) : cfg_(cfg), layers_(size_t(std::max<int64_t>(0, cfg.layers))) {
  // Multiples of 32 along the products' K (the activation blocks) and head_dim (RoPE's
  // halves are whole 16-lane vectors); the heads divide into kv-head groups.
  need(cfg.hidden > 0 && cfg.hidden % 32 == 0 && cfg.inter > 0 && cfg.inter % 32 == 0,
       "hidden and intermediate sizes must be multiples of 32");
  need(cfg.head_dim > 0 && cfg.head_dim % 32 == 0, "head_dim must be a multiple of 32");
  need(cfg.rot > 0 && cfg.rot % 32 == 0 && cfg.rot <= cfg.head_dim,
       "rotary dims must be a multiple of 32 within head_dim");
  need(cfg.logit_div != 0.0f && cfg.residual_scale != 0.0f && cfg.attn_softcap >= 0.0f,
       "logit divisor and residual scale must be non-zero, the attention soft-cap >= 0");
  need(cfg.heads > 0 && cfg.kv_heads > 0 && cfg.heads % cfg.kv_heads == 0,
       "heads must be a multiple of kv_heads");
  need(cfg.layers >= 0 && cfg.vocab > 0, "need layers >= 0 and vocab > 0");
  need(cfg.experts == 0 ? cfg.experts_used == 0 : cfg.experts_used > 0 && cfg.experts_used <= cfg.experts,
       "experts_used must be in [1, experts] for a mixture of experts (0 without)");
  need(!(cfg.swiglu_oai && cfg.gelu), "one activation: gelu or swiglu_oai, not both");
  need(!cfg.swiglu_oai || (cfg.swiglu_limit > 0.0f && std::isfinite(cfg.swiglu_limit) &&
                           std::isfinite(cfg.swiglu_alpha)),
       "swiglu_oai needs a finite positive limit and a finite slope");
}

Matrix NativeModel::matrix(nb::object w, int64_t n, int64_t k) {
  Matrix m;
  m.n = n;
  m.k = k;
  if (!nb::isinstance<nb::list>(w)) {  // a dense float32 [n, k] tensor
    FMat d = nb::cast<FMat>(w);
    need(int64_t(d.shape(0)) == n && int64_t(d.shape(1)) == k, "dense weight of the wrong shape");
    keep_.push_back(nb::cast(d));
    m.dense = d.data();
    return m;
  }
  int64_t covered = 0;
  for (nb::handle item : nb::cast<nb::list>(w)) {
    nb::tuple t = nb::cast<nb::tuple>(item);
    const qk::QSeg& s = nb::cast<const qk::QSeg&>(t[0]);
    need(s.w().k == k && nb::cast<int64_t>(t[1]) == covered, "weight segments do not tile the matrix");
    covered += s.w().n;
    m.segs.push_back(&s.w());
    m.offs.push_back(nb::cast<int64_t>(t[1]));
    keep_.push_back(nb::borrow<nb::object>(t[0]));
  }
  need(covered == n, "weight has " + std::to_string(covered) + " rows, expected " + std::to_string(n));
  return m;
}

const float* NativeModel::vec(nb::object v, int64_t n, bool optional) {
  if (v.is_none()) {
    need(optional, "a required vector is None");
    return nullptr;
  }
  FVec a = nb::cast<FVec>(v);
  need(int64_t(a.size()) == n, "vector of the wrong length");
  keep_.push_back(nb::cast(a));
  return a.data();
}

void NativeModel::set_embed(nb::object w) { embed_ = matrix(w, cfg_.vocab, cfg_.hidden); }

void NativeModel::set_head(nb::object w, nb::object final_norm) {
  head_ = matrix(w, cfg_.vocab, cfg_.hidden);
  final_norm_ = vec(final_norm, cfg_.hidden, false);
}

void NativeModel::set_layer(int64_t index, int32_t window, int32_t rope, nb::object qkv, nb::object o,
                            nb::object gate_up, nb::object down, nb::object qkv_b, nb::object o_b,
                            nb::object attn_norm, nb::object ffn_norm, nb::object q_norm,
                            nb::object k_norm, nb::object post_attn, nb::object post_ffn,
                            nb::object sinks) {
  need(index >= 0 && index < cfg_.layers, "layer index out of range");
  need(window >= 0 && rope >= -1, "window must be >= 0 and rope >= -1 (-1: no RoPE)");
  Layer& l = layers_[size_t(index)];
  const int64_t hid = cfg_.hidden, nq = cfg_.heads * cfg_.head_dim, nkv = cfg_.kv_heads * cfg_.head_dim;
  l.qkv = matrix(qkv, nq + 2 * nkv, hid);
  l.o = matrix(o, hid, nq);
  need(gate_up.is_none() == down.is_none() && gate_up.is_none() == (cfg_.experts > 0),
       "a dense layer has gate_up and down, a mixture of experts neither (set_experts)");
  if (!gate_up.is_none()) {
    l.gate_up = matrix(gate_up, 2 * cfg_.inter, hid);
    l.down = matrix(down, hid, cfg_.inter);
  }
  l.qkv_b = vec(qkv_b, nq + 2 * nkv, true);
  l.o_b = vec(o_b, hid, true);
  l.attn_norm = vec(attn_norm, hid, false);
  l.ffn_norm = vec(ffn_norm, hid, false);
  l.q_norm = vec(q_norm, cfg_.head_dim, true);
  l.k_norm = vec(k_norm, cfg_.head_dim, true);
  need(!l.q_norm == !l.k_norm, "q_norm and k_norm come together");
  l.post_attn = vec(post_attn, hid, true);
  l.post_ffn = vec(post_ffn, hid, true);
  l.sinks = vec(sinks, cfg_.heads, true);
  l.window = window;
  l.rope = rope;
  l.ready = cfg_.experts == 0;  // (a mixture of experts: once set_experts has run)
}

void NativeModel::set_experts(int64_t index, nb::object router, nb::list gate_ups, nb::list downs,
                              nb::object router_b, nb::object gate_up_b, nb::object down_b) {
  need(cfg_.experts > 0 && index >= 0 && index < cfg_.layers, "set_experts: not a mixture of experts, or no such layer");
  need(int64_t(nb::len(gate_ups)) == cfg_.experts && int64_t(nb::len(downs)) == cfg_.experts,
       "set_experts needs one gate_up and one down matrix per expert");
  Layer& l = layers_[size_t(index)];
  need(!l.qkv.empty(), "set_experts: set_layer first");
  l.router = matrix(router, cfg_.experts, cfg_.hidden);
  l.expert_gate_up.clear();
  l.expert_down.clear();
  for (int64_t e = 0; e < cfg_.experts; ++e) {
    l.expert_gate_up.push_back(matrix(gate_ups[size_t(e)], 2 * cfg_.inter, cfg_.hidden));
    l.expert_down.push_back(matrix(downs[size_t(e)], cfg_.hidden, cfg_.inter));
  }
  l.router_b = vec(router_b, cfg_.experts, true);
  // Per-expert biases: None, or a list of one float32 vector per expert.
  auto biases = [&](nb::object list, int64_t n, const char* what) {
    std::vector<const float*> out;
    if (list.is_none()) return out;
    nb::list items = nb::cast<nb::list>(list);
    need(int64_t(nb::len(items)) == cfg_.experts,
         std::string("set_experts needs one ") + what + " bias per expert (or None)");
    for (nb::handle item : items) out.push_back(vec(nb::borrow<nb::object>(item), n, false));
    return out;
  };
  l.expert_gate_up_b = biases(gate_up_b, 2 * cfg_.inter, "gate_up");
  l.expert_down_b = biases(down_b, cfg_.hidden, "down");
  l.ready = true;
}

std::vector<double> NativeModel::seconds(bool reset, int64_t* calls) {
  std::vector<double> out;
  for (int64_t c : counters_) out.push_back(double(c) * 1e-9);
  *calls = calls_;
  if (reset) {
    for (int64_t& c : counters_) c = 0;
    calls_ = 0;
    expert_runs_ = expert_rows_ = 0;
  }
  return out;
}

namespace {

template <class T>
const T* ptr(uintptr_t a) {
  return reinterpret_cast<const T*>(a);
}

// Small per-sequence arrays come as lists of ints (a few microseconds to convert);
// per-row arrays and the buffers as addresses of int64 / float32 / bool tensors that
// models/native.py checks (dtype, contiguity, shape) and keeps alive for the call.
void forward_py(NativeModel& m, uintptr_t ids, uintptr_t positions, uintptr_t parents, int64_t T,
                uintptr_t logits_rows, int64_t R, std::vector<int64_t> query_start,
                std::vector<int64_t> slots, std::vector<int64_t> cache_lens,
                std::vector<uintptr_t> valid, uintptr_t k, uintptr_t v,
                std::vector<int64_t> cache_shape, std::vector<uintptr_t> cos,
                std::vector<uintptr_t> sin, int64_t rope_rows, int64_t num_layers, uintptr_t out,
                unsigned threads, int isa, uintptr_t argmax, bool half_cache) {
  need(T > 0 && R >= 0 && ids && positions && parents && (R == 0 || (logits_rows && out)),
       "forward needs T > 0 rows and non-null arrays");
  need(cache_shape.size() == 5 && k && v, "the cache is [L, S, Hkv, N, D] K and V");
  need(cos.size() == sin.size() && !cos.empty() && rope_rows > 0, "RoPE tables");
  BatchArgs a{ptr<int64_t>(ids), ptr<int64_t>(positions), ptr<int64_t>(parents),
              ptr<int64_t>(logits_rows), T, R, std::move(query_start), std::move(slots),
              std::move(cache_lens), {}};
  for (uintptr_t p : valid) a.valid.push_back(ptr<bool>(p));
  CacheArgs c{reinterpret_cast<void*>(k), reinterpret_cast<void*>(v), cache_shape[0],
              cache_shape[1], cache_shape[2], cache_shape[3], cache_shape[4], half_cache};
  RopeArgs r;
  for (size_t i = 0; i < cos.size(); ++i) {
    r.cos.push_back(ptr<float>(cos[i]));
    r.sin.push_back(ptr<float>(sin[i]));
  }
  r.rows = rope_rows;
  m.forward(a, c, r, num_layers, reinterpret_cast<float*>(out), reinterpret_cast<int64_t*>(argmax),
            threads, isa);
}

using FRows = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using IOut = nb::ndarray<int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// The forward's argmax on its own, for the tests: each row of x cut into chunks of
// `chunk` columns, each scanned as the forward's epilogue does (Ops::max, then
// Ops::argmax where ArgmaxAcc::may_take), last chunk first (the forward's threads
// report in no fixed order).
void argmax_rows(FRows x, IOut out, int64_t chunk, int isa) {
  rs::require_isa(isa);
  const Ops& op = ops_for(isa);
  const int64_t R = int64_t(x.shape(0)), n = int64_t(x.shape(1));
  need(int64_t(out.shape(0)) == R && n > 0 && chunk > 0, "argmax_rows needs x [R, n > 0], out [R]");
  for (int64_t i = 0; i < R; ++i) {
    const float* row = x.data() + i * n;
    ArgmaxAcc acc;
    for (int64_t c = (n - 1) / chunk * chunk; c >= 0; c -= chunk) {
      const int64_t len = std::min(chunk, n - c);
      bool nan = false;
      const float m = op.max(row + c, len, &nan);
      if (acc.may_take(m, nan, c)) {
        const int64_t j = c + op.argmax(row + c, len);
        acc.offer(row[j], j);
      }
    }
    out.data()[i] = acc.at;
  }
}

using FIn1 = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using HOut1 = nb::ndarray<uint16_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using FOut1 = nb::ndarray<float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// The forward's binary16 conversions of a 16-bit KV cache on their own, for the tests:
// bits = Ops::to_half(x), back = Ops::from_half(bits).
void half_convert(FIn1 x, HOut1 bits, FOut1 back, int isa) {
  rs::require_isa(isa);
  const Ops& op = ops_for(isa);
  const int64_t n = int64_t(x.shape(0));
  need(n % 16 == 0 && int64_t(bits.shape(0)) == n && int64_t(back.shape(0)) == n,
       "half_convert needs x, bits, back of one length, a multiple of 16");
  op.to_half(x.data(), bits.data(), n);
  op.from_half(bits.data(), back.data(), n);
}

const char* const kCounterNames[kCounters] = {"quantize", "gemm", "attention", "other", "total"};

nb::dict profile(NativeModel& m, bool reset) {
  int64_t calls = 0;
  nb::dict d;
  d["expert_runs"] = m.expert_runs();  // (read before seconds() may reset them)
  d["expert_rows"] = m.expert_rows();
  const std::vector<double> s = m.seconds(reset, &calls);
  for (int i = 0; i < kCounters; ++i) d[kCounterNames[i]] = s[size_t(i)];
  d["calls"] = calls;
  return d;
}

// The last forward call's own (expert_runs, expert_rows) (NativeModel::last_experts).
nb::tuple last_experts(NativeModel& m) {
  const auto [runs, rows] = m.last_experts();
  return nb::make_tuple(runs, rows);
}

}  // namespace

}  // namespace nf

void register_native(nb::module_& m) {
  using nf::NativeModel;
  nb::class_<NativeModel>(m, "NativeModel", "the native forward of a quantized CausalLM")
      .def("__init__",
           [](NativeModel* self, int64_t hidden, int64_t inter, int64_t vocab, int64_t layers,
              int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t rotary_dim, double eps,
              double embed_scale, double attn_scale, double softcap, double attn_softcap,
              double residual_scale, double logit_divisor, bool gelu, int64_t experts,
              int64_t experts_used, bool norm_topk, bool swiglu_oai, double swiglu_alpha,
              double swiglu_limit) {
             // eps and the scales rounded to fp32, as the reference computes with them.
             new (self) NativeModel(nf::Config{
                 hidden, inter, vocab, layers, heads, kv_heads, head_dim, rotary_dim, float(eps),
                 float(embed_scale), float(attn_scale), float(softcap), float(attn_softcap),
                 float(residual_scale), float(logit_divisor), gelu, experts, experts_used,
                 norm_topk, swiglu_oai, float(swiglu_alpha), float(swiglu_limit)});
           },
           nb::arg("hidden"), nb::arg("intermediate"), nb::arg("vocab"), nb::arg("layers"),
           nb::arg("heads"), nb::arg("kv_heads"), nb::arg("head_dim"), nb::arg("rotary_dim"),
           nb::arg("eps"), nb::arg("embed_scale"), nb::arg("attn_scale"), nb::arg("softcap"),
           nb::arg("attn_softcap"), nb::arg("residual_scale"), nb::arg("logit_divisor"),
           nb::arg("gelu"), nb::arg("experts") = 0, nb::arg("experts_used") = 0,
           nb::arg("norm_topk") = true, nb::arg("swiglu_oai") = false,
           nb::arg("swiglu_alpha") = 1.702, nb::arg("swiglu_limit") = 7.0)
      .def("set_embed", &NativeModel::set_embed, nb::arg("segs"))
      .def("set_head", &NativeModel::set_head, nb::arg("segs"), nb::arg("final_norm"))
      .def("set_layer", &NativeModel::set_layer, nb::arg("index"), nb::arg("window"),
           nb::arg("rope"), nb::arg("qkv"), nb::arg("o"), nb::arg("gate_up").none(),
           nb::arg("down").none(),
           nb::arg("qkv_b").none(), nb::arg("o_b").none(), nb::arg("attn_norm"),
           nb::arg("ffn_norm"), nb::arg("q_norm").none(), nb::arg("k_norm").none(),
           nb::arg("post_attn_norm").none(), nb::arg("post_ffn_norm").none(),
           nb::arg("sinks").none() = nb::none())
      .def("set_experts", &NativeModel::set_experts, nb::arg("index"), nb::arg("router"),
           nb::arg("gate_ups"), nb::arg("downs"), nb::arg("router_b").none() = nb::none(),
           nb::arg("gate_up_b").none() = nb::none(), nb::arg("down_b").none() = nb::none())
      .def("set_profiling", &NativeModel::set_profiling, nb::arg("on"))
      .def("profile", &nf::profile, nb::arg("reset") = false)
      .def("last_experts", &nf::last_experts)
      .def("forward", &nf::forward_py, nb::arg("ids"), nb::arg("positions"), nb::arg("parents"),
           nb::arg("t"), nb::arg("logits_rows"), nb::arg("r"), nb::arg("query_start"),
           nb::arg("slots"), nb::arg("cache_lens"), nb::arg("valid"), nb::arg("k"), nb::arg("v"),
           nb::arg("cache_shape"), nb::arg("cos"), nb::arg("sin"), nb::arg("rope_rows"),
           nb::arg("num_layers"), nb::arg("out"), nb::arg("threads"), nb::arg("isa"),
           nb::arg("argmax") = 0, nb::arg("half_cache") = false);
  m.def("argmax_rows", &nf::argmax_rows, nb::arg("x").noconvert(), nb::arg("out").noconvert(),
        nb::arg("chunk"), nb::arg("isa"));
  m.def("half_convert", &nf::half_convert, nb::arg("x").noconvert(), nb::arg("bits").noconvert(),
        nb::arg("back").noconvert(), nb::arg("isa"));
}
