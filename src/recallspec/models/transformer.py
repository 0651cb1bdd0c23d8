"""Our decoder-only transformer over a flat ragged batch (Llama/Mistral, Qwen2, Qwen3 and
Qwen3-MoE, Phi-3, Gemma 2/3, SmolLM3, Granite).

One forward processes the T new tokens of B sequences (``BatchMetadata``): all dense work
(norms, projections, MLP) runs once over the T flat rows; only attention is per sequence,
reading its keys/values as a view of its KV-cache slot. Weights are stored as ``[out, in]``
with Q/K/V and gate/up fused at load time so each layer does 4 matmuls. They are either
dense tensors for ``kernels.linear.linear`` (the fp32 reference: a batch-invariant C++
kernel for few rows, torch otherwise) or ``QuantizedWeight``s for ``kernels.qlinear``
(the GGUF's own blocks; batch-invariant integer kernel at every row count, activations
quantized per row to 8-bit blocks); activations, norms and the KV cache stay float32.

Conventions (those of the HF checkpoints the weights come from):
  * RoPE uses the rotate-half layout (GGUF llama weights are un-permuted by the loader);
  * norm weights are stored as the *effective* scale (Gemma's ``1 + w`` already added) and
    in float32, and norms are computed in float32 then cast to the model dtype;
  * Gemma scales embeddings by ``sqrt(hidden)`` rounded to the weight dtype, like HF.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from recallspec.errors import ContextLengthError, ModelLoadError
from recallspec.kernels.linear import linear
from recallspec.kernels.qlinear import QuantizedWeight, qlinear
from recallspec.models.config import ModelConfig
from recallspec.models.layer import DecoderLayer, Weight
from recallspec.models.native import NativeModel
from recallspec.models.native import enabled_by_default as native_enabled_by_default
from recallspec.models.rope import RopeTables
from recallspec.runtime.attention import build_attention_masks
from recallspec.runtime.batch import BatchMetadata
from recallspec.runtime.kv_cache import KVCache


def _matmul(x: torch.Tensor, w: Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ w^T -> [M, N] (+ bias), in the kernel that owns w's format."""
    if isinstance(w, QuantizedWeight):
        return qlinear(x, w, bias)
    return linear(x, w, bias)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in float32 (weight is float32), result in x's dtype."""
    y = F.rms_norm(x.float(), (x.shape[-1],), weight, eps)
    return y.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of the first ``cos.shape[-1]`` dims of each head (partial rotary:
    the rest pass through). x: [T, H, D]; cos/sin: [T, 1, rotary dims] in x's dtype."""
    rd = cos.shape[-1]
    if rd < x.shape[-1]:
        return torch.cat((_rotate(x[..., :rd], cos, sin), x[..., rd:]), dim=-1)
    half = rd // 2
    x1, x2 = x[..., :half], x[..., half:]
    rot = torch.cat((-x2, x1), dim=-1)
    return x * cos + rot * sin


def _vector(t: Weight | None) -> torch.Tensor:
    """A bias vector (never quantized)."""
    if not isinstance(t, torch.Tensor) or t.ndim != 1:
        raise ModelLoadError("a bias must be a float vector")
    return t


def _need(w: Weight | None) -> Weight:
    assert w is not None  # (get() raises for a missing required tensor)
    return w


def _top_experts(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's k largest logits and their experts, largest first, ties to the lower
    index (a stable descending sort: torch.topk leaves the order of ties unstated)."""
    values, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    return values[:, :k], order[:, :k]


class CausalLM(nn.Module):
    """Decoder-only LM. ``forward(meta, cache)`` -> float32 logits for ``meta.logits_indices``."""

    embed_w: Weight
    lm_head_w: Weight
    final_norm: torch.Tensor

    def __init__(
        self, config: ModelConfig, weights: Mapping[str, Weight],
        dtype: torch.dtype = torch.float32, *, quantized: bool = False,
        native: bool | None = None, kv_dtype: torch.dtype | None = None,
    ) -> None:
        """``weights`` use our internal names (see ``weights.internal_weights``); with
        ``quantized`` the matrices are ``QuantizedWeight``s and ``dtype`` is float32.
        ``native``: run ``forward`` in the native C++ forward (``models.native``); None =
        yes for quantized models unless ``RECALLSPEC_NATIVE=0``, no for dense ones (True
        on a float32 model: the dense native path, a test oracle, slow). ``kv_dtype``: what
        ``new_cache`` stores keys and values in (None: ``dtype``), float32 or float16 as
        the loader resolves ``params.KV_DTYPES``; float16 halves the bytes attention
        reads (the native forward converts them back exactly, the reference attends in
        ``dtype`` after the same rounding)."""
        super().__init__()
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ModelLoadError(f"unsupported dtype {dtype}")
        if quantized and dtype != torch.float32:
            raise ModelLoadError("quantized weights compute with float32 activations")
        self.config = config
        self.dtype = dtype
        self.kv_dtype = kv_dtype or dtype
        self.quantized = quantized
        # "quantized" | "float32" | "bfloat16": the arithmetic, for cache keys and reports.
        self.weight_format = "quantized" if quantized else str(dtype).removeprefix("torch.")
        # The thread writing this model's repack cache after its first load (the loader
        # sets it; ``models/gguf/quantized.py``); join it before timing anything.
        self.repack_cache_writer: threading.Thread | None = None
        c = config

        def get(name: str, *, norm: bool = False, optional: bool = False,
                router: bool = False) -> Weight | None:
            t = weights.get(name)
            if t is None:
                if optional:
                    return None
                raise ModelLoadError(f"checkpoint lacks tensor {name!r}")
            if isinstance(t, QuantizedWeight):
                if not quantized:
                    raise ModelLoadError(f"tensor {name!r} is quantized; the model is not")
                return t
            if quantized and t.ndim == 2 and not router:  # (a float router stays float)
                raise ModelLoadError(f"tensor {name!r} is dense in a quantized model")
            return t.to(torch.float32 if norm or quantized or router else dtype).contiguous()

        embed = get("embed")
        assert embed is not None
        head = embed if c.tie_embeddings else get("lm_head")
        assert head is not None
        if isinstance(embed, QuantizedWeight) or isinstance(head, QuantizedWeight):
            self.embed_w, self.lm_head_w = embed, head
        else:
            self.register_buffer("embed_w", embed)
            self.register_buffer("lm_head_w", head)
        final_norm = get("final_norm", norm=True)
        assert isinstance(final_norm, torch.Tensor)  # norms are never quantized
        self.register_buffer("final_norm", final_norm)
        layers = []
        for i in range(c.num_layers):
            p = f"layers.{i}."
            t: dict[str, Weight | None] = {
                k: get(p + k, optional=k.endswith("_b")) for k in ("qkv_w", "qkv_b", "o_w", "o_b")
            }
            experts: tuple[tuple[Weight, Weight], ...] = ()
            biases: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()
            if c.moe:
                t["router_w"] = get(p + "router_w", router=True)
                experts = tuple(
                    (_need(get(f"{p}experts.{e}.gate_up_w")), _need(get(f"{p}experts.{e}.down_w")))
                    for e in range(c.num_experts))
            else:
                t["gate_up_w"], t["down_w"] = get(p + "gate_up_w"), get(p + "down_w")
            if c.expert_bias:
                t["router_b"] = get(p + "router_b", norm=True)
                biases = tuple(
                    (_vector(get(f"{p}experts.{e}.gate_up_b", norm=True)),
                     _vector(get(f"{p}experts.{e}.down_b", norm=True)))
                    for e in range(c.num_experts))
            if c.attention_sinks:
                t["sinks"] = get(p + "sinks", norm=True)
            for k in ("attn_norm", "ffn_norm"):
                t[k] = get(p + k, norm=True)
            for k in ("q_norm", "k_norm"):
                t[k] = get(p + k, norm=True) if c.qk_norm else None
            for k in ("post_attn_norm", "post_ffn_norm"):
                t[k] = get(p + k, norm=True) if c.sandwich_norms else None
            layers.append(DecoderLayer(t, experts, biases))
        self.layers = nn.ModuleList(layers)
        # sqrt(hidden) rounded to the weight dtype, as HF Gemma does.
        self._embed_scale = float(torch.tensor(c.embed_scale, dtype=dtype).item())
        self._act = F.silu if c.activation == "silu" else (
            lambda x: F.gelu(x, approximate="tanh")
        )
        self._oai_glu = c.activation == "swiglu_oai"
        self._q_size = c.num_heads * c.head_dim
        self._kv_size = c.num_kv_heads * c.head_dim
        # RoPE cos/sin tables, one per distinct layer RoPE (models/rope.py).
        self.rope = RopeTables(c, dtype)
        # The native forward, built once over these weights; None: the Python forward.
        if native and dtype != torch.float32:
            raise ModelLoadError("the native forward runs quantized or float32 models")
        use_native = (quantized and native_enabled_by_default()) if native is None else native
        self.native: NativeModel | None = NativeModel(self) if use_native else None

    # ---- helpers ---------------------------------------------------------------
    def weight_bytes(self) -> int:
        """Resident bytes of the weights (a tied head counted once)."""
        seen: set[int] = set()
        total = 0
        objs: list[object] = [self.embed_w, self.lm_head_w, self.final_norm]
        for layer in self.layers:
            objs.extend(cast(DecoderLayer, layer).matrices())
        for o in objs:
            if o is None or id(o) in seen:
                continue
            seen.add(id(o))
            total += o.nbytes if isinstance(o, QuantizedWeight) else o.numel() * o.element_size()  # type: ignore[attr-defined]
        return total

    def new_cache(self, num_slots: int, max_len: int, dtype: torch.dtype | None = None) -> KVCache:
        """A KV cache for this model (``dtype``: default ``kv_dtype``), refused with a
        ``ResourceError`` when one sequence of ``max_len`` positions does not fit in the
        free memory (its memory is taken as rows are written: ``runtime/kv_memory.py``)."""
        c, kv = self.config, dtype or self.kv_dtype
        KVCache.check_fits(num_layers=c.num_layers, num_slots=1, max_len=max_len,
                           num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, dtype=kv)
        return KVCache(num_layers=c.num_layers, num_slots=num_slots, max_len=max_len,
                       num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, dtype=kv)

    # ---- forward ---------------------------------------------------------------
    @torch.inference_mode()
    def forward(
        self, meta: BatchMetadata, cache: KVCache, *, num_layers: int | None = None
    ) -> torch.Tensor:
        """Logits of ``meta.logits_indices`` (float32); writes the batch's keys and values
        into ``cache``. ``num_layers``: run only the first layers (early exit), then the
        final norm and head. The native forward when the model has one, else
        ``forward_reference``."""
        if self.native is None:
            return self.forward_reference(meta, cache, num_layers=num_layers)
        n_layers, max_pos = self._check_batch(meta, cache, num_layers)
        rope = self.rope.for_cache(max_pos, cache.max_len)
        return self.native.forward(meta, cache, n_layers, rope)

    def _check_batch(
        self, meta: BatchMetadata, cache: KVCache, num_layers: int | None
    ) -> tuple[int, int]:
        """(layers to run, largest position + 1 in the batch), or the error."""
        c = self.config
        n_layers = c.num_layers if num_layers is None else num_layers
        if not 0 <= n_layers <= c.num_layers:
            raise ValueError(f"num_layers={n_layers} outside [0, {c.num_layers}]")
        max_pos = max(cl + (meta.query_start[b + 1] - meta.query_start[b])
                      for b, cl in enumerate(meta.cache_lens))
        if max_pos > c.max_position:
            raise ContextLengthError(
                f"sequence of {max_pos} tokens exceeds the model context ({c.max_position})"
            )
        if max_pos > cache.max_len:
            raise ContextLengthError(
                f"batch needs {max_pos} cache positions, the KV cache holds {cache.max_len}"
            )
        return n_layers, max_pos

    @torch.inference_mode()
    def forward_reference(
        self, meta: BatchMetadata, cache: KVCache, *, num_layers: int | None = None
    ) -> torch.Tensor:
        """The Python forward: the readable reference and the native forward's parity
        oracle (the only forward of dense models)."""
        c = self.config
        n_layers, max_pos = self._check_batch(meta, cache, num_layers)
        T = meta.num_tokens
        H, Hkv, D = c.num_heads, c.num_kv_heads, c.head_dim
        positions = meta.positions

        # RoPE cos/sin gathered once per distinct layer RoPE: [T, 1, rotary dims].
        rope = [(cos_t[positions][:, None, :], sin_t[positions][:, None, :])
                for cos_t, sin_t in self.rope.for_cache(max_pos, cache.max_len)]
        masks = build_attention_masks(meta, c.windows or None)
        # One (slot, kv_len, rows) triple per sequence; python ints, no syncs in the loop.
        seqs = [(meta.cache_slots[b], meta.kv_len(b), meta.rows(b)) for b in range(meta.num_seqs)]
        single = len(seqs) == 1

        if isinstance(self.embed_w, QuantizedWeight):
            h = self.embed_w.rows(meta.input_ids)
        else:
            h = F.embedding(meta.input_ids, self.embed_w)
        if self._embed_scale != 1.0:
            h = h * self._embed_scale
        eps = c.rms_norm_eps
        for li in range(n_layers):
            layer: DecoderLayer = self.layers[li]  # type: ignore[assignment]
            x = _rms_norm(h, layer.attn_norm, eps)
            qkv = _matmul(x, layer.qkv_w, layer.qkv_b)
            q = qkv[:, : self._q_size].view(T, H, D)
            k = qkv[:, self._q_size : self._q_size + self._kv_size].view(T, Hkv, D)
            v = qkv[:, self._q_size + self._kv_size :].view(T, Hkv, D)
            if layer.q_norm is not None and layer.k_norm is not None:
                q = _rms_norm(q, layer.q_norm, eps)
                k = _rms_norm(k, layer.k_norm, eps)
            kind = self.rope.kind(li)
            if kind >= 0:  # (-1: a layer without RoPE)
                cos, sin = rope[kind]
                q = _rotate(q, cos, sin)
                k = _rotate(k, cos, sin)
            cache.write(li, meta.cache_slot_per_row, meta.cache_pos, k, v)
            layer_masks = masks.for_layer(c.window(li))
            if single:
                slot, kv_len, rows = seqs[0]
                attn = self._attend(q, cache, li, slot, kv_len, layer_masks[0], layer.sinks)
            else:
                attn = torch.empty(T, H * D, dtype=h.dtype)
                for b, (slot, kv_len, rows) in enumerate(seqs):
                    attn[rows] = self._attend(q[rows], cache, li, slot, kv_len, layer_masks[b],
                                              layer.sinks)
            o = _matmul(attn, layer.o_w, layer.o_b)
            if layer.post_attn_norm is not None:
                o = _rms_norm(o, layer.post_attn_norm, eps)
            if c.residual_scale != 1.0:
                o = o * c.residual_scale
            h = h + o
            x = _rms_norm(h, layer.ffn_norm, eps)
            m = self._experts(x, layer) if c.moe else self._mlp(x, layer.gate_up_w, layer.down_w)
            if layer.post_ffn_norm is not None:
                m = _rms_norm(m, layer.post_ffn_norm, eps)
            if c.residual_scale != 1.0:
                m = m * c.residual_scale
            h = h + m

        h = _rms_norm(h[meta.logits_indices], self.final_norm, eps)
        logits = _matmul(h, self.lm_head_w).float()
        if c.logit_divisor != 1.0:
            logits = logits / c.logit_divisor
        if c.final_logit_softcap is not None:
            cap = c.final_logit_softcap
            logits = torch.tanh(logits / cap) * cap
        return logits

    def _mlp(self, x: torch.Tensor, gate_up_w: Weight, down_w: Weight,
             gate_up_b: torch.Tensor | None = None,
             down_b: torch.Tensor | None = None) -> torch.Tensor:
        gate, up = _matmul(x, gate_up_w, gate_up_b).chunk(2, dim=-1)
        if self._oai_glu:
            # gpt-oss's clamped SwiGLU, in GptOssExperts._apply_gate's steps: the gate
            # clamped from above only, the up branch both ways, and (up + 1).
            lim, alpha = self.config.swiglu_limit, self.config.swiglu_alpha
            gate = gate.clamp(max=lim)
            up = up.clamp(min=-lim, max=lim)
            return _matmul((up + 1) * (gate * torch.sigmoid(gate * alpha)), down_w, down_b)
        return _matmul(self._act(gate) * up, down_w, down_b)

    def _experts(self, x: torch.Tensor, layer: DecoderLayer) -> torch.Tensor:
        """A mixture of experts over rows x [T, hidden] (the native forward's arithmetic,
        step by step): router logits in float32; each row's experts_per_token largest
        (ties: the lower index); their weights exp(l - l_max) / s, s summed over the chosen
        (norm_topk_prob: the renormalised top-k softmax) or over all experts; each expert
        runs once over the rows that chose it (its products row-local: a row's result
        never depends on which rows share its experts); a row sums its experts' outputs,
        times their weights, in rank order."""
        c = self.config
        assert layer.router_w is not None
        logits = _matmul(x, layer.router_w, layer.router_b).float()  # [T, E]
        top, chosen = _top_experts(logits, c.experts_per_token)
        e_top = torch.exp(top - top[:, :1])
        if c.norm_topk_prob:
            denom = e_top.sum(dim=-1, keepdim=True)
        else:
            denom = torch.exp(logits - top[:, :1]).sum(dim=-1, keepdim=True)
        weights = (e_top / denom).to(x.dtype)  # [T, k]
        out = torch.empty(x.shape[0], c.experts_per_token, x.shape[1], dtype=x.dtype)
        flat = chosen.reshape(-1)
        for e in torch.unique(flat).tolist():
            hits = (flat == e).nonzero().squeeze(1)  # (row, rank) pairs in row order
            rows = hits // c.experts_per_token
            gu_b, d_b = ((layer.expert_gate_up_b[e], layer.expert_down_b[e])
                         if layer.expert_gate_up_b else (None, None))
            y = self._mlp(x[rows], layer.expert_gate_up[e], layer.expert_down[e], gu_b, d_b)
            out[rows, hits % c.experts_per_token] = y
        m = out[:, 0] * weights[:, :1]
        for r in range(1, c.experts_per_token):
            m = m + out[:, r] * weights[:, r : r + 1]
        return m

    def _attend(
        self, q: torch.Tensor, cache: KVCache, layer: int, slot: int, kv_len: int,
        mask: torch.Tensor | None, sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q: [n, H, D] -> [n, H*D]. Keys/values are views of the slot (no copy).
        ``sinks``: each head's sink logit (gpt-oss)."""
        n = q.shape[0]
        k = cache.k[layer, slot, :, :kv_len]  # [Hkv, kv_len, D]
        v = cache.v[layer, slot, :, :kv_len]
        if k.dtype != q.dtype:  # a 16-bit cache: attend in the model's dtype
            k, v = k.to(q.dtype), v.to(q.dtype)
        cap = self.config.attn_logit_softcap
        if cap is not None or sinks is not None:
            # Gemma 2's soft-capped scores and gpt-oss's sinks: SDPA computes neither.
            return self._attend_explicit(q, k, v, mask, cap, sinks)
        # Note: a hand-written bmm/softmax path for single-token decode was tried and dropped:
        # with real text, peaked softmax rows underflow to denormals and the probs @ V matmul
        # slowed by an order of magnitude and more; the SDPA kernel does not suffer from it.
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
            attn_mask=mask, scale=self.config.attn_scale, enable_gqa=True,
        )  # [1, H, n, D]
        return out[0].transpose(0, 1).reshape(n, -1)

    def _attend_explicit(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         mask: torch.Tensor | None, cap: float | None,
                         sinks: torch.Tensor | None) -> torch.Tensor:
        """Attention as transformers' eager Gemma 2 and gpt-oss compute it: scores
        s = q k * scale (soft-capped, tanh(s / cap) * cap, with a cap), masked; with sinks,
        each head's sink logit joins the scores as one more column, which the softmax (in
        float32) counts and the product with v drops; times v."""
        n, heads = q.shape[0], q.shape[1]
        group = heads // k.shape[0]
        kk = k.repeat_interleave(group, dim=0)  # [H, kv_len, D]
        vv = v.repeat_interleave(group, dim=0)
        s = torch.matmul(q.transpose(0, 1), kk.transpose(1, 2)) * self.config.attn_scale
        if cap is not None:
            s = torch.tanh(s / cap) * cap  # [H, n, kv_len]
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        if sinks is not None:
            sink = sinks.to(s.dtype)[:, None, None].expand(heads, n, 1)
            p = torch.softmax(torch.cat([s, sink], dim=-1).float(), dim=-1)[..., :-1]
            return torch.matmul(p.to(q.dtype), vv).transpose(0, 1).reshape(n, -1)
        p = torch.softmax(s.float(), dim=-1).to(q.dtype)
        return torch.matmul(p, vv).transpose(0, 1).reshape(n, -1)
