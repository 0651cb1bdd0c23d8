# Batch-invariant small-M dense and quantized kernels (csrc/dense/kernels.cpp, csrc/qgemm/).
# isa: 0 scalar, 1 avx2, 2 avx512, 3 avx512 + VNNI (see recallspec.kernels.isa).
from typing import Any

def has_avx512() -> bool: ...
def has_avx512_bf16() -> bool: ...
def cpu_has_isa(isa: int) -> bool: ...
def max_threads() -> int: ...
def stream_read(buf: Any, threads: int) -> int: ...
def linear_f32(x: Any, w: Any, out: Any, threads: int, isa: int) -> None: ...
def linear_bf16(x: Any, w: Any, out: Any, threads: int = 1) -> None: ...
class QSeg:
    def __init__(
        self, qs: Any, scale: Any, mins: Any, zero: Any, n: int, k: int, sb: int, bits: int,
        sfmt: int, lut: bool = False,
    ) -> None: ...
    @property
    def u6(self) -> bool: ...

def qgemm(
    seg: QSeg, x_addr: int, m: int, out_addr: int, ldo: int, n_off: int, threads: int, isa: int,
) -> None: ...
def qrows(seg: QSeg, ids: Any, out: Any, threads: int = 1) -> None: ...
def qquantize(x: Any, q: Any, d: Any, xs: Any, dxs: Any, sb: int, isa: int) -> None: ...
# Rows [row_off, row_off + len(raw)) of a segment of n rows (k columns) from their GGUF
# block bytes raw (uint8 [rows, bytes per row]) of GGML type `type`, written in the
# kernel layout into the segment's arrays (qs, scale and mins as uint8 views, zero
# int32; mins and zero empty where the type has none), in `bits` storage (the type's
# own 4 or 8, or 6 for types whose values are below 64). csrc/qgemm/qrepack.cpp.
def qrepack(
    raw: Any, type: int, n: int, k: int, row_off: int, qs: Any, scale: Any, mins: Any,
    zero: Any, bits: int, threads: int = 1,
) -> None: ...

# The native forward of a quantized CausalLM (csrc/native/; models/native.py).
# A matrix is a list of (segment, first row) pairs or a dense float32 [n, k] tensor.
Matrix = list[tuple[QSeg, int]] | Any

class NativeModel:
    def __init__(
        self, hidden: int, intermediate: int, vocab: int, layers: int, heads: int,
        kv_heads: int, head_dim: int, rotary_dim: int, eps: float, embed_scale: float,
        attn_scale: float, softcap: float, attn_softcap: float, residual_scale: float,
        logit_divisor: float, gelu: bool, experts: int = 0, experts_used: int = 0,
        norm_topk: bool = True, swiglu_oai: bool = False, swiglu_alpha: float = 1.702,
        swiglu_limit: float = 7.0,
    ) -> None: ...
    def set_embed(self, segs: Matrix) -> None: ...
    def set_head(self, segs: Matrix, final_norm: Any) -> None: ...
    def set_layer(
        self, index: int, window: int, rope: int, qkv: Matrix, o: Matrix,
        gate_up: Matrix | None, down: Matrix | None, qkv_b: Any, o_b: Any, attn_norm: Any,
        ffn_norm: Any, q_norm: Any, k_norm: Any, post_attn_norm: Any, post_ffn_norm: Any,
        sinks: Any = None,
    ) -> None: ...
    # router_b: float32 [experts] or None; gate_up_b / down_b: one float32 vector per
    # expert ([2 intermediate], [hidden]) or None (gpt-oss's biases).
    def set_experts(
        self, index: int, router: Matrix, gate_ups: list[Matrix], downs: list[Matrix],
        router_b: Any = None, gate_up_b: list[Any] | None = None,
        down_b: list[Any] | None = None,
    ) -> None: ...
    def set_profiling(self, on: bool) -> None: ...
    def profile(self, reset: bool = False) -> dict[str, float]: ...
    # The last forward call's own (expert_runs, expert_rows) (counted with profiling off).
    def last_experts(self) -> tuple[int, int]: ...
    def forward(
        self, ids: int, positions: int, parents: int, t: int, logits_rows: int, r: int,
        query_start: Any, slots: Any, cache_lens: Any, valid: list[int], k: int, v: int,
        cache_shape: list[int], cos: list[int], sin: list[int], rope_rows: int,
        num_layers: int, out: int, threads: int, isa: int, argmax: int = 0,
        half_cache: bool = False,
    ) -> None: ...

# The forward's row argmax (first maximum, NaN first) on its own, each row of x
# (float32 [R, n]) in chunks of `chunk` columns merged last first, into out (int64 [R]).
def argmax_rows(x: Any, out: Any, chunk: int, isa: int) -> None: ...

# The native forward's binary16 conversions (a 16-bit KV cache) on their own: bits
# (uint16 [n]) = x (float32 [n], n % 16 == 0) rounded to nearest even, back = bits widened.
def half_convert(x: Any, bits: Any, back: Any, isa: int) -> None: ...

# One sampling distribution as unnormalised weights (csrc/native/sample_bind.cpp): logits
# (float32 [n]) at temperature t into w (float32 [n]) and chunk sums (float64
# [ceil(n / 64)]), returning the total (ValueError on NaN, OverflowError where the
# largest logit / t overflows float32); sample_remove zeroes w[i] and returns the new
# total; sample_draw returns the index whose cumulative interval holds u * total.
def sample_weights(logits: Any, t: float, w: Any, chunks: Any, isa: int) -> float: ...
def sample_remove(w: Any, chunks: Any, i: int, isa: int) -> float: ...
def sample_draw(w: Any, chunks: Any, u: float) -> int: ...
