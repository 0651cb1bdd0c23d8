"""The native forward of quantized models: one C++ call per forward.

``NativeModel(model)`` is built once from a quantized ``CausalLM`` (it hands the C++ side
the weight segments' kernel handles and the norm vectors, whose memory the model keeps;
a float32 model's dense weights work too, through a plain kernel with the fp32
reference's own product arithmetic: the tight parity oracle of the tests, not tuned);
``forward(meta, cache, num_layers, rope)`` then runs the whole model over a ragged batch
(``runtime.batch``) in ``recallspec._kernels`` (csrc/native/native_forward.cpp), writing the
KV cache and returning float32 logits for ``meta.logits_indices``, like
``CausalLM.forward_reference``, the Python forward it is checked against. It also writes
each returned row's argmax into ``meta.argmax`` (exactly ``torch.argmax`` of the row,
computed by each thread over the head's columns it has just produced), so greedy
verification reads no logits.

Every output row is bit-identical whatever else is in the batch, whatever the tree
around it (given its own visible keys), the thread count and the instruction-set path:
the weight products are the batch-invariant quantized kernels, and attention, norms and
activations follow one fixed float order per output (csrc/native/native_ops.h). Against the
reference the logits differ only by that float order (and the activation roundings it
moves), within the bound tests/models/test_native_forward.py states.

gpt-oss's parts are computed too: each head's attention sink (in the softmax's
denominator), the router's and experts' biases and the clamped SwiGLU (``swiglu_oai``);
a layer without the tensors its config names is refused (``ModelLoadError``), as is an
activation the C++ side does not have.

``RECALLSPEC_NATIVE=0`` makes quantized models use the Python forward (for debugging).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol, cast

import torch

from recallspec import _kernels
from recallspec.errors import ModelLoadError
from recallspec.kernels import isa as _isa
from recallspec.kernels.qlinear import QuantizedWeight
from recallspec.kernels.threads import kernel_threads
from recallspec.models.config import ModelConfig
from recallspec.models.layer import DecoderLayer, Weight
from recallspec.models.rope import RopeTables as ModelRope
from recallspec.runtime.batch import BatchMetadata
from recallspec.runtime.kv_cache import KVCache

ENV_VAR = "RECALLSPEC_NATIVE"

RopeTables = Sequence[tuple[torch.Tensor, torch.Tensor]]
# A weight as the C++ side takes it: (segment handle, first row) pairs, or a dense tensor.
_Matrix = list[tuple[_kernels.QSeg, int]] | torch.Tensor


class NativeSource(Protocol):
    """What the native forward reads of a model (``CausalLM`` has it): its config, RoPE
    kinds and weights, which stay the model's (the C++ side keeps handles, not copies)."""

    @property
    def config(self) -> ModelConfig: ...
    @property
    def quantized(self) -> bool: ...
    @property
    def dtype(self) -> torch.dtype: ...
    @property
    def rope(self) -> ModelRope: ...
    @property
    def embed_w(self) -> Weight: ...
    @property
    def lm_head_w(self) -> Weight: ...
    @property
    def final_norm(self) -> torch.Tensor: ...
    @property
    def layers(self) -> torch.nn.ModuleList: ...


def _vector(t: torch.Tensor | None) -> torch.Tensor | None:
    """A bias or sink vector as the C++ side reads it: float32, contiguous, 1-D (the
    model's own tensor when it already is; the C++ side keeps a reference)."""
    if t is None:
        return None
    return t.detach().to(torch.float32).contiguous().reshape(-1)


# The C++ forward's switches (gelu, swiglu_oai) for each activation of
# ``config.ACTIVATIONS`` it computes; neither switch is SiLU (csrc/native/native_model.h).
# A key outside that list fails tests/models/test_native_gptoss.py.
_NATIVE_ACTIVATIONS: dict[str, tuple[bool, bool]] = {
    "silu": (False, False), "gelu_tanh": (True, False), "swiglu_oai": (False, True),
}


def _activation_switches(activation: str) -> tuple[bool, bool]:
    """The (gelu, swiglu_oai) switches of a config's activation (``ModelConfig`` has
    refused a name outside ``config.ACTIVATIONS``); one the C++ side does not compute
    is a ``ModelLoadError``."""
    switches = _NATIVE_ACTIVATIONS.get(activation)
    if switches is None:
        raise ModelLoadError(
            f"the native forward has no {activation!r} activation (load with "
            "RECALLSPEC_NATIVE=0 for the Python forward)")
    return switches


def _check_gpt_oss_tensors(c: ModelConfig, layer: DecoderLayer, i: int) -> None:
    """gpt-oss's vectors have the shapes the C++ side reads: with ``attention_sinks`` the
    sinks [heads], with ``expert_bias`` the router's bias [experts] and every expert's
    gate-up [2 x expert size] and down [hidden] biases. (``CausalLM`` refuses a
    checkpoint without them; a None is refused here too, since the C++ side reads None
    as the feature off and would silently compute another model.)"""
    p, gate_up, down = f"layers.{i}.", layer.expert_gate_up_b, layer.expert_down_b
    want: dict[str, tuple[torch.Tensor | None, int]] = {}
    if c.attention_sinks:
        want[p + "sinks"] = (layer.sinks, c.num_heads)
    if c.expert_bias:
        want[p + "router_b"] = (layer.router_b, c.num_experts)
        for e in range(c.num_experts):
            want[f"{p}experts.{e}.gate_up_b"] = (
                gate_up[e] if e < len(gate_up) else None, 2 * c.mlp_size)
            want[f"{p}experts.{e}.down_b"] = (down[e] if e < len(down) else None, c.hidden_size)
    for name, (t, n) in want.items():
        if t is None or tuple(t.shape) != (n,):
            got = "missing" if t is None else f"of shape {tuple(t.shape)}"
            raise ModelLoadError(f"tensor {name!r} {got}: the model's config needs [{n}]")


def enabled_by_default() -> bool:
    """Whether quantized models use the native forward unless told otherwise (read at
    model construction): yes, unless ``RECALLSPEC_NATIVE`` is 0 / false / no / off."""
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


class NativeModel:
    """The C++ forward of one quantized ``CausalLM`` (weights shared, not copied)."""

    def __init__(self, model: NativeSource) -> None:
        if not model.quantized and model.dtype != torch.float32:
            raise ValueError("the native forward runs quantized or float32 models")
        c = model.config
        self.config = c
        # (C++ rounds eps and the scales to fp32 as the reference does: Gemma's embedding
        # scale is sqrt(hidden) in fp32, eps the fp32 of the config's value.)
        self.num_layers = c.num_layers
        if c.rotary_dims % 32:
            raise ModelLoadError(
                f"the native forward rotates multiples of 32 dims of a head; this model "
                f"rotates {c.rotary_dims} (load with RECALLSPEC_NATIVE=0 for the Python "
                "forward)")
        gelu, swiglu_oai = _activation_switches(c.activation)
        h = _kernels.NativeModel(
            hidden=c.hidden_size, intermediate=c.mlp_size, vocab=c.vocab_size,
            layers=c.num_layers, heads=c.num_heads, kv_heads=c.num_kv_heads,
            head_dim=c.head_dim, rotary_dim=c.rotary_dims, eps=c.rms_norm_eps,
            embed_scale=c.embed_scale, attn_scale=c.attn_scale,
            softcap=c.final_logit_softcap or 0.0, attn_softcap=c.attn_logit_softcap or 0.0,
            residual_scale=c.residual_scale, logit_divisor=c.logit_divisor,
            gelu=gelu, experts=c.num_experts,
            experts_used=c.experts_per_token, norm_topk=c.norm_topk_prob,
            swiglu_oai=swiglu_oai, swiglu_alpha=c.swiglu_alpha,
            swiglu_limit=c.swiglu_limit,
        )

        def segs(w: QuantizedWeight | torch.Tensor | None) -> _Matrix | None:
            if w is None:
                return None
            if isinstance(w, QuantizedWeight):
                return [(s.handle, s.n_off) for s in w.segments]
            return w  # dense float32 [n, k] (contiguous, as the model stores it)

        h.set_embed(segs(model.embed_w))
        h.set_head(segs(model.lm_head_w), model.final_norm)
        for i in range(c.num_layers):
            layer = cast(DecoderLayer, model.layers[i])
            _check_gpt_oss_tensors(c, layer, i)
            h.set_layer(
                i, c.window(i) or 0, model.rope.kind(i),
                segs(layer.qkv_w), segs(layer.o_w), segs(layer.gate_up_w), segs(layer.down_w),
                layer.qkv_b, layer.o_b, layer.attn_norm, layer.ffn_norm,
                layer.q_norm, layer.k_norm, layer.post_attn_norm, layer.post_ffn_norm,
                sinks=_vector(layer.sinks),
            )
            if c.moe:
                h.set_experts(
                    i, segs(layer.router_w), [segs(w) for w in layer.expert_gate_up],
                    [segs(w) for w in layer.expert_down], router_b=_vector(layer.router_b),
                    gate_up_b=[_vector(b) for b in layer.expert_gate_up_b] or None,
                    down_b=[_vector(b) for b in layer.expert_down_b] or None,
                )
        self._h = h

    def forward(
        self, meta: BatchMetadata, cache: KVCache, num_layers: int, rope: RopeTables, *,
        threads: int | None = None, isa: str | None = None,
    ) -> torch.Tensor:
        """Logits [len(meta.logits_indices), vocab] float32; writes the rows' keys and
        values into ``cache``, and each returned row's argmax into ``meta.argmax`` (for
        greedy verification, which then needs no pass over the vocabulary). ``rope``: the
        (cos, sin) tables [N, rotary dims] of each of the model's RoPE kinds, N > every
        position (the model's own: ``model.rope.for_cache``). ``threads`` defaults to
        ``kernel_threads()``, ``isa`` to ``kernels.isa.ISA``."""
        k, v = cache.k, cache.v
        if k.dtype not in (torch.float32, torch.float16) or v.dtype != k.dtype or not (
                k.is_contiguous() and v.is_contiguous()):
            raise TypeError("the native forward needs a contiguous float32 or float16 KV cache")
        # Addresses into meta.ints (the layout of runtime.batch.BatchMetadata).
        t, r = meta.num_tokens, meta.num_logits
        base, n = meta.ints.buffer_info()  # (alive and never resized during the call)
        if meta.ints.typecode != "q" or meta.ints.itemsize != 8 or n != 6 * t + 2 * r:
            raise TypeError("BatchMetadata.ints must be int64 [6 T + 2 R]")
        ids, pos, par = base, base + 8 * t, base + 40 * t
        rows, argmax = base + 48 * t, base + 48 * t + 8 * r
        valid = meta.cache_valid
        kept: list[torch.Tensor] = []  # alive until the call returns
        addrs: list[int] = []
        if any(m is not None for m in valid):
            for m in valid:
                if m is None:
                    addrs.append(0)
                else:
                    kept.append(m.to(torch.bool).contiguous())
                    addrs.append(kept[-1].data_ptr())
        tables = [(cs.contiguous(), sn.contiguous()) for cs, sn in rope]
        d = self.config.rotary_dims
        for cs, sn in tables:
            if cs.dtype != torch.float32 or sn.shape != cs.shape or cs.shape[1] != d:
                raise ValueError("RoPE tables must be float32 [N, rotary dims]")
        out = torch.empty(r, self.config.vocab_size, dtype=torch.float32)
        self._h.forward(
            ids, pos, par, t, rows, r, meta.query_start, meta.cache_slots,
            meta.cache_lens, addrs, k.data_ptr(), v.data_ptr(), list(k.shape),
            [cs.data_ptr() for cs, _ in tables], [sn.data_ptr() for _, sn in tables],
            min(cs.shape[0] for cs, _ in tables), num_layers, out.data_ptr(),
            kernel_threads() if threads is None else threads, _isa.code(isa), argmax,
            k.dtype == torch.float16,
        )
        return out

    def set_profiling(self, on: bool) -> None:
        """Accumulate time per part of the forward (a clock read between parts)."""
        self._h.set_profiling(on)

    def profile(self, reset: bool = False) -> dict[str, float]:
        """Seconds spent since the last reset in ``quantize`` (activations to int8),
        ``gemm`` (weight products), ``attention``, ``other`` (embeddings, norms, RoPE,
        KV writes, activations, residuals) and ``total`` (while profiling); and, counted
        whether or not profiling is on, ``calls`` (forwards) and a mixture of experts'
        ``expert_runs`` ((layer, expert) products run: each chosen expert once per layer
        and forward, for all its rows) and ``expert_rows`` ((layer, row) routings):
        expert_runs / (layers x forwards) is the distinct experts a forward woke per
        layer."""
        return dict(self._h.profile(reset))

    def last_experts(self) -> tuple[int, int]:
        """(expert_runs, expert_rows) of the last forward call alone (as ``profile``'s;
        (0, 0) for a dense model, or a call refused before its layers ran)."""
        runs, rows = self._h.last_experts()
        return int(runs), int(rows)
