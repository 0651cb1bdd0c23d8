"""The shapes of the models people run (1-8B dense, and the mixtures of experts
Qwen3-30B-A3B and gpt-oss-20b; from each one's config.json) and the tensors llama.cpp
builds for each: what ``recallspec bench scale`` measures at.

A ``Shape`` is what llama.cpp and our loader need to build a decoder-only model;
``tensor_plan`` lists its GGUF tensors in file order, as llama.cpp's
``convert_hf_to_gguf.py`` writes these architectures: first the RoPE tensors its
``generate_extra_tensors`` computes from the config (``rope_freqs.weight`` of Llama 3's
scaling; ``rope_factors_long/short.weight`` of Phi-3's LongRoPE), then
``token_embd.weight``; per block ``attn_norm``, ``attn_q/k/v`` (+ ``.bias`` for qwen2; one
``attn_qkv`` for phi3), ``attn_output``, ``attn_q_norm``/``attn_k_norm`` (qwen3, gemma3),
``post_attention_norm`` (gemma3), ``ffn_norm``, ``ffn_gate`` (not phi3's), ``ffn_up``
(phi3's: gate and up rows), ``ffn_down``, ``post_ffw_norm`` (gemma3); qwen3moe's in place
of the three FFN matrices: ``ffn_gate_inp`` (the router) and the experts' matrices stacked,
``ffn_gate_exps``, ``ffn_up_exps``, ``ffn_down_exps``; gpt-oss's block (llama.cpp's
src/models/openai-moe.cpp): ``attn_norm``, ``attn_q/k/v`` and their biases,
``attn_output`` and its bias, ``attn_sinks`` (one logit per head), ``post_attention_norm``
(the pre-FFN norm, under that name), the router and its bias, the stacked experts'
matrices, then their biases stacked over the experts (2-D); ``output_norm.weight``;
``output.weight`` when untied. Matrices are F16 (``llama-quantize``'s usual input), the
stacked experts too; 1-D tensors F32, the experts' stacked biases F32 (llama-quantize
quantizes no bias), and the router F32 (llama-quantize never quantizes it, and the
converter writes it F32).

A published shape with fewer layers (``with_layers``; ``get_shape("<name>-L<n>")``) keeps
every per-layer size: a 30B shape's F16 intermediate (61 GB) does not fit every machine,
and per-layer costs are the same at 8 layers as at 48.

Their random-weight GGUF files (written, quantized, cached): ``bench/common/shapes_gguf.py``.
Light on purpose (numpy, no torch at import): the CLI validates ``bench scale``'s
settings against ``SHAPES`` and ``QUANTS``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from recallspec.errors import UnknownNameError

ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "phi3", "smollm3", "qwen3moe", "gpt-oss")
_MOE_ARCHS = ("qwen3moe", "gpt-oss")  # mixtures of experts: experts, experts_used, expert_ffn
_QKV_BIAS_ARCHS = ("qwen2", "gpt-oss")  # llama.cpp builds them with q/k/v biases
_QK_NORM_ARCHS = ("qwen3", "gemma3", "qwen3moe")  # llama.cpp requires their q/k norms
# RoPE scalings a shape may state, as llama.cpp's converter writes them: "linear" as
# rope.scaling.type/factor, "llama3" as the rope_freqs tensor (no type key), "longrope" as
# rope_factors_long/short and rope.scaling.original_context_length/attn_factor, "yarn" as
# rope.scaling.type/factor/original_context_length/yarn_beta_fast/yarn_beta_slow.
ROPE_SCALINGS = ("none", "linear", "llama3", "longrope", "yarn")
# The scalings each architecture's file may hold (the converter's and llama.cpp's: Llama
# 3's rope_freqs only in llama files, LongRoPE only in Phi-3's, YaRN only in gpt-oss's).
_ARCH_SCALINGS = {"llama": ("none", "linear", "llama3"), "phi3": ("none", "longrope"),
                  "gpt-oss": ("none", "yarn")}
# attention.sliding_window is theirs (gguf_arch's keys); gpt-oss's is required (llama.cpp's
# openai-moe reads it without a default).
_SLIDING_ARCHS = ("gemma3", "phi3", "gpt-oss")
# llama-quantize's type names (MXFP4_MOE: a mixture's stacked experts in MXFP4, every
# other matrix Q8_0, as gpt-oss is published).
QUANTS = ("F16", "Q8_0", "Q4_0", "Q4_K_M", "MXFP4_MOE")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
# A reduced shape's name: the registry name, "-L", its layers (no leading zero, so one
# name per reduction).
_REDUCED = re.compile(r"^(?P<base>[a-z0-9][a-z0-9._-]*)-L(?P<layers>[1-9][0-9]*)$")
_MOE_FIELDS = ("experts", "experts_used", "expert_ffn")

MATRIX, BIAS, NORM, FACTORS, ROUTER = "matrix", "bias", "norm", "factors", "router"


@dataclass(frozen=True)
class Shape:
    """A decoder-only model's shape: what llama.cpp and our loader need to build it.

    Per architecture (llama.cpp builds each with exactly these tensors): qwen2 has q/k/v
    biases, qwen3 and gemma3 q/k norms, gemma3 post-attention and post-FFN norms too (all
    its norms stored as 1 + w, as its converter writes them), phi3 one fused ``attn_qkv``
    and an ``ffn_up`` of 2 * ffn rows (gate, then up) with no ``ffn_gate``; smollm3 is
    llama's layout (llama.cpp leaves RoPE out of every 4th layer, which no key states);
    qwen3moe is qwen3's attention (q/k norms) with a mixture of ``experts`` gated MLPs of
    ``expert_ffn`` in every layer, ``experts_used`` of them per token (``ffn`` is still
    stated: feed_forward_length, which llama.cpp and our loader read); gpt-oss is a
    mixture too, with q/k/v and output biases, a sink logit per head, a router bias and
    the experts' biases, a ``sliding_window`` on every other layer (required) and
    ``ffn == expert_ffn`` (its config has one size), YaRN its one RoPE scaling."""

    name: str  # registry key and file-name stem, e.g. "llama-3.1-8b"
    arch: str  # GGUF architecture: one of ARCHS
    hidden: int  # embedding_length
    layers: int  # block_count
    heads: int  # attention.head_count
    kv_heads: int  # attention.head_count_kv
    head_dim: int  # attention.key_length (Qwen3-4B: 128, not hidden / heads = 80)
    ffn: int  # feed_forward_length
    vocab: int  # token ids (embedding and head rows); >= the tokenizer's 49152
    tied: bool  # the head reuses token_embd (no output.weight)
    rope_theta: float
    context: int  # context_length (the published max_position_embeddings)
    qkv_bias: bool = False  # qwen2, gpt-oss: biases on q, k and v (llama.cpp's qwen2
    #                         requires them; gpt-oss's o, sink, router and expert
    #                         biases follow from the arch)
    qk_norm: bool = False  # qwen3, gemma3: RMSNorm over head_dim on q and k
    rms_eps: float = 1e-5
    rope_dim: int = 0  # rope.dimension_count: rotated dims of a head (0: head_dim; phi3's
    #                    partial rotary: Phi-4-mini's 0.75 of 128 = 96)
    rope_scaling: str = "none"  # one of ROPE_SCALINGS
    rope_factor: float = 1.0  # linear, llama3, yarn: the factor; longrope: context / original
    rope_original_context: int = 0  # llama3, longrope, yarn: original_max_position_embeddings
    rope_low_freq_factor: float = 1.0  # llama3 (the converter's defaults: 1 and 4)
    rope_high_freq_factor: float = 4.0
    rope_theta_swa: float = 0.0  # gemma3: rope.freq_base_swa, the sliding layers' base
    sliding_window: int = 0  # gemma3, phi3, gpt-oss: attention.sliding_window (0: none)
    # qwen3moe, gpt-oss (0 for the dense architectures): expert_count, expert_used_count
    # and expert_feed_forward_length.
    experts: int = 0
    experts_used: int = 0
    expert_ffn: int = 0

    def __post_init__(self) -> None:
        n = self.name
        if not (_NAME.match(n) or _REDUCED.match(n)):
            raise ValueError(f"shape name {n!r}: lower-case letters, digits, '.-_' (and a "
                             "reduced shape's -L<layers>)")
        if self.arch not in ARCHS:
            raise ValueError(f"{n}: arch must be one of {', '.join(ARCHS)}")
        sizes = ("hidden", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab", "context")
        if any(getattr(self, f) < 1 for f in sizes) or self.rope_theta <= 0 or self.rms_eps <= 0:
            raise ValueError(f"{n}: sizes, rope_theta and rms_eps must be positive")
        if self.heads % self.kv_heads or self.head_dim % 2:
            raise ValueError(f"{n}: heads must be a multiple of kv_heads and "
                             "head_dim even (RoPE rotates pairs)")
        # llama.cpp builds each architecture with exactly these tensors.
        if self.qkv_bias != (self.arch in _QKV_BIAS_ARCHS):
            raise ValueError(f"{n}: qkv_bias must be set exactly for "
                             f"{', '.join(_QKV_BIAS_ARCHS)} (llama.cpp builds them with the "
                             "biases, the others have none)")
        if self.qk_norm != (self.arch in _QK_NORM_ARCHS):
            raise ValueError(f"{n}: qk_norm must be set exactly for "
                             f"{', '.join(_QK_NORM_ARCHS)} (llama.cpp requires their q/k "
                             "norms, the others have none)")
        self._check_experts()
        if self.arch in ("qwen2", "phi3") and self.heads * self.head_dim != self.hidden:
            raise ValueError(f"{n}: llama.cpp's {self.arch} needs heads * head_dim == hidden")
        self._check_rope()
        if self.sliding_window < 0 or (self.sliding_window and
                                       self.arch not in _SLIDING_ARCHS):
            raise ValueError(f"{n}: sliding_window is gemma3's, phi3's and gpt-oss's "
                             "(>= 0)")
        if self.arch == "gpt-oss" and self.sliding_window < 1:
            raise ValueError(f"{n}: a gpt-oss needs sliding_window > 0 (llama.cpp's "
                             "openai-moe requires attention.sliding_window)")
        swa = self.arch == "gemma3" and self.sliding_window > 0
        if (self.rope_theta_swa != 0) != swa or self.rope_theta_swa < 0:
            raise ValueError(f"{n}: rope_theta_swa (> 0, the sliding layers' RoPE base) must "
                             "be given exactly for gemma3 with a sliding_window")

    def _check_experts(self) -> None:
        n, sizes = self.name, [getattr(self, f) for f in _MOE_FIELDS]
        if self.arch not in _MOE_ARCHS:
            if any(sizes):
                raise ValueError(f"{n}: experts, experts_used and expert_ffn are "
                                 f"{', '.join(_MOE_ARCHS)}'s (0 for a dense {self.arch})")
        elif min(sizes) < 1 or self.experts_used > self.experts:
            # (llama.cpp's qwen3moe refuses n_expert or n_expert_used 0)
            raise ValueError(f"{n}: a {self.arch} needs experts, experts_used and expert_ffn "
                             "positive, experts_used <= experts")
        elif self.arch == "gpt-oss" and self.ffn != self.expert_ffn:
            # (our loader refuses such a file: GptOssConfig has one intermediate_size)
            raise ValueError(f"{n}: a gpt-oss needs ffn == expert_ffn (its config has one "
                             f"intermediate size), not {self.ffn} and {self.expert_ffn}")

    def _check_rope(self) -> None:
        n, kind = self.name, self.rope_scaling
        if self.rope_dim < 0 or self.rope_dim % 2 or self.rope_dim > self.head_dim:
            raise ValueError(f"{n}: rope_dim must be even, in [0, head_dim]")
        if self.rotary_dim != self.head_dim and self.arch != "phi3":
            raise ValueError(f"{n}: partial rotary (rope_dim {self.rope_dim} of "
                             f"{self.head_dim}) is phi3's only")
        if kind not in ROPE_SCALINGS:
            raise ValueError(f"{n}: rope_scaling must be one of {', '.join(ROPE_SCALINGS)}")
        allowed = _ARCH_SCALINGS.get(self.arch, ("none", "linear"))
        if kind not in allowed:
            raise ValueError(f"{n}: a {self.arch} file holds rope_scaling "
                             f"{' or '.join(allowed)}, not {kind!r}")
        if (kind == "none") != (self.rope_factor == 1.0) or self.rope_factor < 1.0:
            raise ValueError(f"{n}: rope_factor > 1 with a rope_scaling, 1.0 without")
        needs_orig = kind in ("llama3", "longrope", "yarn")
        if needs_orig != (self.rope_original_context > 0) or self.rope_original_context < 0:
            raise ValueError(f"{n}: rope_original_context (> 0) is llama3's, longrope's and "
                             "yarn's (and each of them needs it)")
        if kind == "longrope" and self.rope_factor != self.context / self.rope_original_context:
            raise ValueError(f"{n}: longrope's rope_factor must be context / "
                             f"rope_original_context = "
                             f"{self.context / self.rope_original_context:g}")
        low, high = self.rope_low_freq_factor, self.rope_high_freq_factor
        if kind == "llama3" and not 0 < low < high:
            raise ValueError(f"{n}: llama3 needs 0 < rope_low_freq_factor < "
                             "rope_high_freq_factor")
        if kind != "llama3" and (low, high) != (1.0, 4.0):
            raise ValueError(f"{n}: rope_low/high_freq_factor are llama3's")

    @property
    def rotary_dim(self) -> int:
        """The rotated dims of a head (rope.dimension_count)."""
        return self.rope_dim or self.head_dim

    def parameters(self) -> int:
        """Parameters of the model (a tied head counted once), from its tensors (the
        RoPE factor tensors, computed from the config, are none); every expert's."""
        return sum(t.numel for t in tensor_plan(self) if t.kind != FACTORS)

    def active_parameters(self) -> int:
        """Parameters one token reads: ``parameters()`` with each layer's stacked experts
        (their matrices, and gpt-oss's stacked biases) counted at ``experts_used`` of
        ``experts`` (the dense shapes: all of them). Every other tensor counts whole,
        token_embd too (a token reads one row of it, the head all of it): the convention
        of a published "activated" count (Qwen3-30B-A3B's 3.3B; gpt-oss-20b's published
        3.6B leaves the embedding out, which this counts: 4.19B)."""
        return sum(t.numel // t.shape[0] * self.experts_used if t.stacked else t.numel
                   for t in tensor_plan(self) if t.kind != FACTORS)

    def to_dict(self) -> dict[str, Any]:
        """The fields by name; a dense shape's MoE fields (all 0) are left out, so its
        dict, and with it its cached files' manifests, is what it was before they
        existed (``Shape(**d)`` gives the same shape either way)."""
        d = asdict(self)
        if not self.experts:
            for f in _MOE_FIELDS:
                del d[f]
        return d


def _tiny(name: str, arch: str, **kw: Any) -> Shape:
    """A test shape: 2 layers of width 256, built in a second."""
    base: dict[str, Any] = dict(hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64,
                                ffn=512, vocab=49152, tied=True, rope_theta=1e6,
                                context=2048, rms_eps=1e-6)
    return Shape(name, arch, **{**base, **kw})


# Llama 3.x's "llama3" RoPE scaling (config.json's rope_scaling: factor, low_freq_factor 1,
# high_freq_factor 4, original_max_position_embeddings 8192), which llama.cpp's converter
# writes as the rope_freqs tensor.
_LLAMA3: dict[str, Any] = dict(rope_scaling="llama3", rope_original_context=8192)

# From each model's config.json on the Hugging Face hub (the text model's, for Gemma 3).
SHAPES: dict[str, Shape] = {s.name: s for s in (
    Shape("smollm2-360m", "llama", hidden=960, layers=32, heads=15, kv_heads=5, head_dim=64,
          ffn=2560, vocab=49152, tied=True, rope_theta=1e5, context=8192),
    Shape("smollm2-1.7b", "llama", hidden=2048, layers=24, heads=32, kv_heads=32,
          head_dim=64, ffn=8192, vocab=49152, tied=True, rope_theta=1.3e5, context=8192),
    # meta-llama/Llama-3.2-1B: rope_scaling llama3, factor 32.
    Shape("llama-3.2-1b", "llama", hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64,
          ffn=8192, vocab=128256, tied=True, rope_theta=5e5, context=131072,
          rope_factor=32.0, **_LLAMA3),
    # meta-llama/Llama-3.2-3B: rope_scaling llama3, factor 32.
    Shape("llama-3.2-3b", "llama", hidden=3072, layers=28, heads=24, kv_heads=8,
          head_dim=128, ffn=8192, vocab=128256, tied=True, rope_theta=5e5, context=131072,
          rope_factor=32.0, **_LLAMA3),
    Shape("qwen2.5-1.5b", "qwen2", hidden=1536, layers=28, heads=12, kv_heads=2,
          head_dim=128, ffn=8960, vocab=151936, tied=True, rope_theta=1e6, context=32768,
          qkv_bias=True, rms_eps=1e-6),
    Shape("qwen3-4b", "qwen3", hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128,
          ffn=9728, vocab=151936, tied=True, rope_theta=1e6, context=40960, qk_norm=True,
          rms_eps=1e-6),
    # HuggingFaceTB/SmolLM3-3B (no rope_scaling; RoPE left out of every 4th layer).
    Shape("smollm3-3b", "smollm3", hidden=2048, layers=36, heads=16, kv_heads=4,
          head_dim=128, ffn=11008, vocab=128256, tied=True, rope_theta=5e6, context=65536,
          rms_eps=1e-6),
    # microsoft/Phi-4-mini-instruct: partial_rotary_factor 0.75, rope_scaling longrope
    # (48 long and 48 short factors, original_max_position_embeddings 4096), sliding_window
    # 262144 (llama.cpp disables Phi-3's window; larger than the context anyway).
    Shape("phi-4-mini", "phi3", hidden=3072, layers=32, heads=24, kv_heads=8, head_dim=128,
          ffn=8192, vocab=200064, tied=True, rope_theta=1e4, context=131072, rope_dim=96,
          rope_scaling="longrope", rope_factor=32.0, rope_original_context=4096,
          sliding_window=262144),
    # google/gemma-3-4b-it's text_config: rope_theta 1e6 (global layers, rope_scaling
    # linear 8), rope_local_base_freq 1e4, sliding_window 1024 (5 of every 6 layers),
    # vocab_size 262208 of which the converter keeps the tokenizer's 262144.
    Shape("gemma-3-4b", "gemma3", hidden=2560, layers=34, heads=8, kv_heads=4, head_dim=256,
          ffn=10240, vocab=262144, tied=True, rope_theta=1e6, context=131072, qk_norm=True,
          rms_eps=1e-6, rope_scaling="linear", rope_factor=8.0, rope_theta_swa=1e4,
          sliding_window=1024),
    # meta-llama/Llama-3.1-8B: rope_scaling llama3, factor 8.
    Shape("llama-3.1-8b", "llama", hidden=4096, layers=32, heads=32, kv_heads=8,
          head_dim=128, ffn=14336, vocab=128256, tied=False, rope_theta=5e5, context=131072,
          rope_factor=8.0, **_LLAMA3),
    # Qwen/Qwen3-30B-A3B: 128 experts of moe_intermediate_size 768, 8 per token
    # (norm_topk_prob true, every layer sparse); intermediate_size 6144 (no dense layer
    # uses it; the converter writes it as feed_forward_length).
    Shape("qwen3-30b-a3b", "qwen3moe", hidden=2048, layers=48, heads=32, kv_heads=4,
          head_dim=128, ffn=6144, vocab=151936, tied=False, rope_theta=1e6, context=40960,
          qk_norm=True, rms_eps=1e-6, experts=128, experts_used=8, expert_ffn=768),
    # openai/gpt-oss-20b: 32 experts of intermediate_size 2880, 4 per token (every layer
    # sparse), sliding_window 128 on every other layer, rope_scaling yarn (factor 32,
    # original_max_position_embeddings 4096, beta_fast 32, beta_slow 1: the writer's),
    # attention_bias true, vocab_size 201088, an untied head.
    Shape("gpt-oss-20b", "gpt-oss", hidden=2880, layers=24, heads=64, kv_heads=8,
          head_dim=64, ffn=2880, vocab=201088, tied=False, rope_theta=150000.0,
          context=131072, qkv_bias=True, rms_eps=1e-5, rope_scaling="yarn", rope_factor=32.0,
          rope_original_context=4096, sliding_window=128, experts=32, experts_used=4,
          expert_ffn=2880),
    # Tests: one per architecture (and per RoPE scaling); the qwen ones pad the vocabulary
    # (to a multiple of 256 and to a round number), tiny-qwen3 has heads * head_dim !=
    # hidden and an untied head; tiny-gemma3 (6 layers: 5 sliding ones, then a global one)
    # and tiny-smollm3 (4: the last without RoPE) have each kind of layer; tiny-phi3 rotates
    # Phi-4-mini's 96 of 128 dims (our native forward rotates multiples of 32).
    _tiny("tiny-llama", "llama", rope_theta=1e5, rms_eps=1e-5),
    _tiny("tiny-llama3", "llama", rope_theta=5e5, rope_factor=32.0, **_LLAMA3),
    _tiny("tiny-qwen2", "qwen2", vocab=49408, qkv_bias=True),
    _tiny("tiny-qwen3", "qwen3", vocab=50000, head_dim=128, tied=False, qk_norm=True),
    _tiny("tiny-gemma3", "gemma3", layers=6, head_dim=128, qk_norm=True,
          rope_scaling="linear", rope_factor=8.0, rope_theta_swa=1e4, sliding_window=8),
    _tiny("tiny-phi3", "phi3", hidden=512, head_dim=128, rope_theta=1e4, rms_eps=1e-5,
          rope_dim=96, rope_scaling="longrope", rope_factor=4.0, rope_original_context=512,
          sliding_window=4096),
    _tiny("tiny-smollm3", "smollm3", layers=4, rope_theta=5e6),
    # Qwen3-30B-A3B's layout at width 256: 8 experts of 256, 2 per token, an untied head,
    # heads * head_dim != hidden and a padded vocabulary.
    _tiny("tiny-qwen3moe", "qwen3moe", vocab=50000, head_dim=128, tied=False, qk_norm=True,
          experts=8, experts_used=2, expert_ffn=256),
    # gpt-oss-20b's layout at width 256: 8 experts of 256 (= ffn), 2 per token, 4 layers
    # (two sliding ones, window 8, two global), YaRN, an untied head, heads * head_dim
    # (8 * 64) != hidden and a padded vocabulary.
    _tiny("tiny-gptoss", "gpt-oss", layers=4, heads=8, kv_heads=2, ffn=256, vocab=50000,
          tied=False, rope_theta=150000.0, qkv_bias=True, rms_eps=1e-5,
          rope_scaling="yarn", rope_factor=8.0, rope_original_context=256, sliding_window=8,
          experts=8, experts_used=2, expert_ffn=256),
)}


def with_layers(shape: Shape, layers: int) -> Shape:
    """``shape`` with its first ``layers`` layers only (1 <= layers < its own): every
    per-layer size, the embedding, head and config kept, so a layer costs what it costs
    in the full model, on a machine that cannot hold the full file. It is labelled as
    reduced: its name is the full shape's + ``-L<layers>`` (so are its files and their
    manifests), ``reduced_from`` names the full one, and whatever is measured on it is
    the reduced model's (per-token totals scale with the layers; the head does not). A
    reduced shape reduced again is cut from the same full shape."""
    full = reduced_from(shape) or shape
    if not 1 <= layers < shape.layers:
        raise ValueError(f"{shape.name}: a reduction keeps 1 to {shape.layers - 1} of its "
                         f"{shape.layers} layers, not {layers}")
    return dataclasses.replace(full, name=f"{full.name}-L{layers}", layers=layers)


def reduced_from(shape: Shape) -> Shape | None:
    """The registry's full shape that ``shape`` is a ``with_layers`` reduction of (None:
    ``shape`` is not one)."""
    m = _REDUCED.match(shape.name)
    full = SHAPES.get(m["base"]) if m else None
    if full is None or not shape.layers < full.layers or dataclasses.replace(
            full, name=shape.name, layers=shape.layers) != shape:
        return None
    return full


def get_shape(name: str) -> Shape:
    """The registry's shape ``name``, or ``<name>-L<n>``: that shape with its first n
    layers (``with_layers``, labelled as reduced by its name)."""
    s = SHAPES.get(name)
    if s is not None:
        return s
    m = _REDUCED.match(name)
    full = SHAPES.get(m["base"]) if m else None
    if m is None or full is None:
        raise UnknownNameError(f"unknown shape {name!r} (known: {', '.join(SHAPES)}, each "
                               "also as NAME-L<n>: its first n layers)")
    try:
        return with_layers(full, int(m["layers"]))
    except ValueError as e:
        raise UnknownNameError(f"shape {name!r}: {e}") from None


def canonical_quant(quant: str) -> str:
    for q in QUANTS:
        if q.lower() == quant.lower():
            return q
    raise UnknownNameError(f"unknown quantization {quant!r} (known: {', '.join(QUANTS)})")


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the file."""

    name: str  # llama.cpp's name, e.g. "blk.3.attn_q.weight"
    # numpy order: (rows = outputs, cols = inputs), (n,), a stack of experts'
    # matrices, (experts, rows, cols): the only 3-D tensors, or (gpt-oss) a stack of
    # experts' biases, (experts, rows): 2-D, a BIAS.
    shape: tuple[int, ...]
    kind: str  # MATRIX (F16, random) | BIAS, ROUTER (F32, random) | NORM (F32, ones) |
    #            FACTORS (F32, ``values``: RoPE factors computed from the shape)
    values: tuple[float, ...] = ()

    @property
    def stacked(self) -> bool:
        """One tensor of every expert's (experts the outermost dim): a token reads
        ``experts_used`` of its ``experts`` slices."""
        return self.name.endswith(("_exps.weight", "_exps.bias"))

    @property
    def dtype(self) -> type[np.floating[Any]]:
        return np.float16 if self.kind == MATRIX else np.float32

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * np.dtype(self.dtype).itemsize


def llama3_rope_freqs(shape: Shape) -> list[float]:
    """Llama 3's ``rope_freqs.weight``: the divisor of each rotary frequency, computed
    exactly as llama.cpp's converter does (``conversion/llama.py``,
    ``LlamaModel.generate_extra_tensors``: float32 frequencies, its comparisons)."""
    # torch here, not at the top: the CLI reads SHAPES while building its parsers, and
    # only a Llama 3 shape's tensor plan needs the converter's torch arithmetic.
    import torch

    base, dim = shape.rope_theta, shape.head_dim
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = shape.rope_factor
    low_freq_factor, high_freq_factor = shape.rope_low_freq_factor, shape.rope_high_freq_factor
    old_context_len = shape.rope_original_context
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    rope_factors: list[Any] = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            rope_factors.append(1)
        elif wavelen > low_freq_wavelen:
            rope_factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (
                high_freq_factor - low_freq_factor)
            rope_factors.append(1 / ((1 - smooth) / factor + smooth))
    return [float(x) for x in torch.tensor(rope_factors, dtype=torch.float32).tolist()]


def longrope_factors(shape: Shape) -> tuple[list[float], list[float]]:
    """LongRoPE's (long, short) factors, one per rotated pair: a random-weight file has no
    trained ones, so plausible values stand in (what a forward costs does not depend on
    them): short 1.0 (plain RoPE within the original context, as Phi-4-mini's), long a
    geometric ramp from 1 to the scaling factor over the pairs, fastest to slowest (the
    shape of Phi-4-mini's ramp to 32)."""
    n = shape.rotary_dim // 2
    ramp = np.float32(shape.rope_factor) ** (np.arange(n, dtype=np.float32)
                                              / np.float32(max(n - 1, 1)))
    return [float(x) for x in ramp], [1.0] * n


def longrope_attn_factor(shape: Shape) -> float:
    """``rope.scaling.attn_factor``, as the converter computes it for LongRoPE
    (``conversion/phi.py``): sqrt(1 + ln(scale) / ln(original)), scale = context /
    original (1 when not scaled)."""
    scale = shape.context / shape.rope_original_context
    if scale <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(scale) / math.log(shape.rope_original_context))


@functools.lru_cache(maxsize=64)
def _rope_tensors(shape: Shape) -> tuple[TensorSpec, ...]:
    """The RoPE tensors the converter computes from the config (once per shape)."""
    if shape.rope_scaling == "llama3":
        freqs = llama3_rope_freqs(shape)
        return (TensorSpec("rope_freqs.weight", (len(freqs),), FACTORS, tuple(freqs)),)
    if shape.rope_scaling == "longrope":
        long, short = longrope_factors(shape)
        return (TensorSpec("rope_factors_long.weight", (len(long),), FACTORS, tuple(long)),
                TensorSpec("rope_factors_short.weight", (len(short),), FACTORS, tuple(short)))
    return ()


def _expert_tensors(shape: Shape, b: str) -> list[TensorSpec]:
    """A mixture's block FFN (llama.cpp's src/models/qwen3moe.cpp and openai-moe.cpp; its
    ggml dims are these reversed): the router ``{hidden, experts}``, F32 (gpt-oss's with
    its bias ``{experts}``); each expert's gate and up ``{hidden, expert_ffn}`` and down
    ``{expert_ffn, hidden}``, stacked over the experts (experts the outermost dim), F16;
    gpt-oss's then their biases, stacked too: gate and up ``{expert_ffn, experts}``, down
    ``{hidden, experts}``, F32."""
    h, e, ef = shape.hidden, shape.experts, shape.expert_ffn
    oss = shape.arch == "gpt-oss"
    return [TensorSpec(b + "ffn_gate_inp.weight", (e, h), ROUTER),
            *([TensorSpec(b + "ffn_gate_inp.bias", (e,), BIAS)] if oss else []),
            TensorSpec(b + "ffn_gate_exps.weight", (e, ef, h), MATRIX),
            TensorSpec(b + "ffn_up_exps.weight", (e, ef, h), MATRIX),
            TensorSpec(b + "ffn_down_exps.weight", (e, h, ef), MATRIX),
            *([TensorSpec(b + "ffn_gate_exps.bias", (e, ef), BIAS),
               TensorSpec(b + "ffn_up_exps.bias", (e, ef), BIAS),
               TensorSpec(b + "ffn_down_exps.bias", (e, h), BIAS)] if oss else [])]


def tensor_plan(shape: Shape) -> list[TensorSpec]:
    """Every tensor of ``shape``'s GGUF, in file order."""
    h, hd, ffn, arch = shape.hidden, shape.head_dim, shape.ffn, shape.arch
    q, kv = shape.heads * hd, shape.kv_heads * hd
    plan = [*_rope_tensors(shape), TensorSpec("token_embd.weight", (shape.vocab, h), MATRIX)]
    for i in range(shape.layers):
        b = f"blk.{i}."
        plan.append(TensorSpec(b + "attn_norm.weight", (h,), NORM))
        if arch == "phi3":  # q, k and v rows in one matrix
            plan.append(TensorSpec(b + "attn_qkv.weight", (q + 2 * kv, h), MATRIX))
        else:
            for part, rows in (("q", q), ("k", kv), ("v", kv)):
                plan.append(TensorSpec(f"{b}attn_{part}.weight", (rows, h), MATRIX))
                if shape.qkv_bias:
                    plan.append(TensorSpec(f"{b}attn_{part}.bias", (rows,), BIAS))
        plan.append(TensorSpec(b + "attn_output.weight", (h, q), MATRIX))
        if arch == "gpt-oss":  # the output's bias; each head's sink logit
            plan.append(TensorSpec(b + "attn_output.bias", (h,), BIAS))
            plan.append(TensorSpec(b + "attn_sinks.weight", (shape.heads,), BIAS))
        if shape.qk_norm:
            plan.append(TensorSpec(b + "attn_q_norm.weight", (hd,), NORM))
            plan.append(TensorSpec(b + "attn_k_norm.weight", (hd,), NORM))
        if arch == "gemma3":
            plan.append(TensorSpec(b + "post_attention_norm.weight", (h,), NORM))
        # (gpt-oss's pre-FFN norm is named post_attention_norm: its converter maps HF's
        # post_attention_layernorm there, and llama.cpp's openai-moe reads no ffn_norm)
        plan.append(TensorSpec(b + ("post_attention_norm.weight" if arch == "gpt-oss"
                                    else "ffn_norm.weight"), (h,), NORM))
        if shape.experts:  # the router's logits, then each expert's gated MLP, stacked
            plan.extend(_expert_tensors(shape, b))
        else:
            if arch == "phi3":  # gate rows, then up rows, in one matrix
                plan.append(TensorSpec(b + "ffn_up.weight", (2 * ffn, h), MATRIX))
            else:
                plan.append(TensorSpec(b + "ffn_gate.weight", (ffn, h), MATRIX))
                plan.append(TensorSpec(b + "ffn_up.weight", (ffn, h), MATRIX))
            plan.append(TensorSpec(b + "ffn_down.weight", (h, ffn), MATRIX))
        if arch == "gemma3":
            plan.append(TensorSpec(b + "post_ffw_norm.weight", (h,), NORM))
    plan.append(TensorSpec("output_norm.weight", (h,), NORM))
    if not shape.tied:
        plan.append(TensorSpec("output.weight", (shape.vocab, h), MATRIX))
    return plan


__all__ = ["ARCHS", "BIAS", "FACTORS", "MATRIX", "NORM", "QUANTS", "ROPE_SCALINGS", "ROUTER",
           "SHAPES", "Shape", "TensorSpec", "canonical_quant", "get_shape", "llama3_rope_freqs",
           "longrope_attn_factor", "longrope_factors", "reduced_from", "tensor_plan",
           "with_layers"]
