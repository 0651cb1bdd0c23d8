"""Random-weight GGUFs at published shapes (``bench/common/shapes.py``,
``bench/common/shapes_gguf.py``):
the registry's numbers, the file llama.cpp's way (the tensors and keys its converter
writes and its loader requires, against our loader's tables in ``models/gguf/arch.py``),
our loader on a tiny shape of each architecture and on the header of every published
shape, llama.cpp on the tiny ones, the mixtures of experts (qwen3moe: its stacked 3-D
expert matrices and F32 router; gpt-oss: its biases, sinks, YaRN and window too), shapes
reduced to fewer layers, the cache (reuse,
interrupted writes, disk check) and quantization (a fake ``llama-quantize`` always; the
real one when a binary is found).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from helpers import needs_model
from helpers.availability import native_peer_or_unavailable, unavailable

from recallspec.bench.common import shapes_gguf
from recallspec.bench.common.shapes import (
    ARCHS,
    BIAS,
    FACTORS,
    MATRIX,
    QUANTS,
    ROUTER,
    SHAPES,
    Shape,
    get_shape,
    llama3_rope_freqs,
    longrope_attn_factor,
    reduced_from,
    tensor_plan,
    with_layers,
)
from recallspec.bench.common.shapes_gguf import (
    UNUSED,
    _metadata,
    ensure_shape_gguf,
    find_quantize,
    write_shape_gguf,
)
from recallspec.errors import RecallspecError, ResourceError, UnknownNameError
from recallspec.models.gguf import arch as gguf_arch

BASE_VOCAB = 49152  # the default model's (SmolLM2) tokenizer
# Published parameter counts (model cards / safetensors totals; Gemma 3 4B's text model:
# the checkpoint's 4.30B less its SigLIP vision tower and projector, 0.42B).
PUBLISHED = {
    "smollm2-360m": 362e6, "smollm2-1.7b": 1.71e9, "llama-3.2-1b": 1.24e9,
    "llama-3.2-3b": 3.21e9, "qwen2.5-1.5b": 1.54e9, "qwen3-4b": 4.02e9,
    "llama-3.1-8b": 8.03e9, "smollm3-3b": 3.08e9, "phi-4-mini": 3.84e9,
    "gemma-3-4b": 3.88e9, "qwen3-30b-a3b": 30.5e9, "gpt-oss-20b": 20.91e9,
}
# Published "activated" parameter counts of the mixtures of experts (model cards), with
# the embedding, as ``active_parameters`` counts it: gpt-oss-20b's card states 3.61B
# without it (201088 * 2880 = 0.58B more).
PUBLISHED_ACTIVE = {"qwen3-30b-a3b": 3.3e9, "gpt-oss-20b": 3.61e9 + 201088 * 2880}
TINY = ("tiny-llama", "tiny-llama3", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3", "tiny-phi3",
        "tiny-smollm3", "tiny-qwen3moe", "tiny-gptoss")
PUBLISHED_SHAPES = tuple(n for n in SHAPES if not n.startswith("tiny-"))
# Per architecture, the tensor kinds of a block that llama.cpp's loader requires
# (src/models/<arch>.cpp: create_tensor without TENSOR_NOT_REQUIRED), and every one the
# converter writes for these models: the file holds exactly these.
_LLAMA_BLOCK = {"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
                "ffn_down.weight"}
_QK_NORM = {"attn_q_norm.weight", "attn_k_norm.weight"}
BLOCK_KINDS = {
    "llama": _LLAMA_BLOCK, "smollm3": _LLAMA_BLOCK,
    "qwen2": _LLAMA_BLOCK | {"attn_q.bias", "attn_k.bias", "attn_v.bias"},
    "qwen3": _LLAMA_BLOCK | _QK_NORM,
    "gemma3": _LLAMA_BLOCK | _QK_NORM | {"post_attention_norm.weight",
                                         "post_ffw_norm.weight"},
    "phi3": {"attn_norm.weight", "attn_qkv.weight", "attn_output.weight", "ffn_norm.weight",
             "ffn_up.weight", "ffn_down.weight"},
    # (src/models/qwen3moe.cpp: the router and the stacked experts, no dense FFN)
    "qwen3moe": (_LLAMA_BLOCK - {"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"})
    | _QK_NORM | {"ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight",
                  "ffn_down_exps.weight"},
    # (src/models/openai-moe.cpp: q/k/v biases (create_tensor_qkv), the output's bias, the
    # sinks, post_attention_norm as the pre-FFN norm, the router's bias and the experts'
    # stacked biases)
    "gpt-oss": {"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.weight",
                "attn_output.bias", "attn_sinks.weight", "post_attention_norm.weight",
                "ffn_gate_inp.weight", "ffn_gate_inp.bias", "ffn_gate_exps.weight",
                "ffn_up_exps.weight", "ffn_down_exps.weight", "ffn_gate_exps.bias",
                "ffn_up_exps.bias", "ffn_down_exps.bias"},
}
_MOE_KEYS = ("expert_count", "expert_used_count", "expert_feed_forward_length")
# The RoPE tensors of each scaling (outside the blocks).
ROPE_TENSORS = {"none": set(), "linear": set(), "llama3": {"rope_freqs.weight"},
                "longrope": {"rope_factors_long.weight", "rope_factors_short.weight"},
                "yarn": set()}


# ---- the registry --------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_the_published_sizes(name: str) -> None:
    shape = SHAPES[name]
    assert shape.parameters() == pytest.approx(PUBLISHED[name], rel=0.02)
    active = PUBLISHED_ACTIVE.get(name)
    if active is None:  # dense: a token reads every parameter
        assert shape.active_parameters() == shape.parameters()
    else:
        assert shape.active_parameters() == pytest.approx(active, rel=0.02)


def test_registry_spot_checks() -> None:
    q3, l8, q2 = SHAPES["qwen3-4b"], SHAPES["llama-3.1-8b"], SHAPES["qwen2.5-1.5b"]
    assert q3.heads * q3.head_dim == 4096 != q3.hidden and q3.qk_norm
    assert not l8.tied and "output.weight" in {t.name for t in tensor_plan(l8)}
    assert q2.qkv_bias and "blk.0.attn_v.bias" in {t.name for t in tensor_plan(q2)}
    assert {s.arch for s in SHAPES.values()} == set(ARCHS)
    assert set(ARCHS) <= set(gguf_arch.ARCHS)  # every one our loader reads
    assert set(QUANTS) >= {"F16", "Q4_K_M", "Q4_0", "Q8_0"}
    # Llama 3.x: llama3 RoPE scaling (low 1, high 4, original 8192), factor 32 or 8.
    for name, factor in (("llama-3.2-1b", 32.0), ("llama-3.2-3b", 32.0),
                         ("llama-3.1-8b", 8.0)):
        s = SHAPES[name]
        assert (s.rope_scaling, s.rope_factor, s.rope_original_context) == (
            "llama3", factor, 8192)
        assert (s.rope_low_freq_factor, s.rope_high_freq_factor) == (1.0, 4.0)
    g = SHAPES["gemma-3-4b"]
    assert (g.head_dim, g.vocab, g.rope_scaling, g.rope_factor, g.rope_theta,
            g.rope_theta_swa, g.sliding_window) == (256, 262144, "linear", 8.0, 1e6, 1e4, 1024)
    p = SHAPES["phi-4-mini"]
    assert (p.rotary_dim, p.rope_scaling, p.rope_factor, p.rope_original_context,
            p.sliding_window) == (96, "longrope", 32.0, 4096, 262144)
    assert p.rotary_dim / p.head_dim == 0.75 and p.heads * p.head_dim == p.hidden
    s3 = SHAPES["smollm3-3b"]
    assert (s3.rope_theta, s3.context, s3.rope_scaling) == (5e6, 65536, "none")
    m = SHAPES["qwen3-30b-a3b"]  # Qwen/Qwen3-30B-A3B's config.json
    assert (m.hidden, m.layers, m.heads, m.kv_heads, m.head_dim, m.ffn, m.vocab) == (
        2048, 48, 32, 4, 128, 6144, 151936)
    assert (m.experts, m.experts_used, m.expert_ffn) == (128, 8, 768)
    assert (m.tied, m.qk_norm, m.rope_theta, m.context, m.rms_eps) == (
        False, True, 1e6, 40960, 1e-6)
    # Active: the experts at 8 of 128, everything else whole.
    per_expert = 3 * m.expert_ffn * m.hidden * m.layers
    assert m.parameters() - m.active_parameters() == (m.experts - m.experts_used) * per_expert
    t = SHAPES["tiny-qwen3moe"]
    assert (t.experts, t.experts_used, t.expert_ffn, t.tied) == (8, 2, 256, False)
    o = SHAPES["gpt-oss-20b"]  # openai/gpt-oss-20b's config.json
    assert (o.hidden, o.layers, o.heads, o.kv_heads, o.head_dim, o.ffn, o.vocab) == (
        2880, 24, 64, 8, 64, 2880, 201088)
    assert (o.experts, o.experts_used, o.expert_ffn, o.sliding_window) == (32, 4, 2880, 128)
    assert (o.tied, o.qkv_bias, o.qk_norm, o.rope_theta, o.context, o.rms_eps) == (
        False, True, False, 150000.0, 131072, 1e-5)
    assert (o.rope_scaling, o.rope_factor, o.rope_original_context) == ("yarn", 32.0, 4096)
    # Active: the experts' matrices and stacked biases at 4 of 32, everything else whole.
    per_expert = (3 * o.expert_ffn * o.hidden + 2 * o.expert_ffn + o.hidden) * o.layers
    assert o.parameters() - o.active_parameters() == (o.experts - o.experts_used) * per_expert
    assert o.active_parameters() - o.vocab * o.hidden == 3_608_307_264  # the card's 3.6B
    t = SHAPES["tiny-gptoss"]
    assert (t.experts, t.experts_used, t.expert_ffn, t.ffn, t.sliding_window, t.layers) == (
        8, 2, 256, 256, 8, 4)


def test_shape_validation() -> None:
    base: dict[str, Any] = SHAPES["tiny-llama"].to_dict()
    moe: dict[str, Any] = SHAPES["tiny-qwen3moe"].to_dict()
    gemma: dict[str, Any] = SHAPES["tiny-gemma3"].to_dict()
    phi: dict[str, Any] = SHAPES["tiny-phi3"].to_dict()
    llama3: dict[str, Any] = SHAPES["tiny-llama3"].to_dict()
    oss: dict[str, Any] = SHAPES["tiny-gptoss"].to_dict()
    bad: list[tuple[dict[str, Any], str]] = [
        ({**base, "arch": "qwen2"}, "qkv_bias"),  # llama.cpp's qwen2 needs the biases
        ({**SHAPES["tiny-qwen2"].to_dict(), "head_dim": 128}, "qwen2 needs"),
        ({**base, "kv_heads": 3}, "multiple"),
        ({**base, "name": "../x"}, "name"),
        ({**base, "arch": "mistral"}, "arch must be one of"),
        ({**gemma, "qk_norm": False}, "qk_norm"),  # llama.cpp requires gemma3's
        ({**base, "qk_norm": True}, "qk_norm"),
        ({**phi, "head_dim": 128 * 2}, "phi3 needs"),
        ({**base, "rope_dim": 32}, "partial rotary"),
        ({**phi, "rope_dim": 97}, "rope_dim must be even"),
        ({**base, "rope_scaling": "ntk", "rope_factor": 4.0}, "rope_scaling must be"),
        ({**base, "rope_scaling": "yarn", "rope_factor": 4.0,
          "rope_original_context": 512}, "llama file holds"),  # (gpt-oss's only)
        ({**base, "rope_scaling": "longrope"}, "llama file holds"),
        ({**phi, "rope_scaling": "linear"}, "phi3 file holds"),
        ({**SHAPES["tiny-smollm3"].to_dict(), "rope_scaling": "llama3", "rope_factor": 8.0,
          "rope_original_context": 8192}, "smollm3 file holds"),
        ({**base, "rope_scaling": "linear"}, "rope_factor > 1"),
        ({**base, "rope_factor": 2.0}, "rope_factor > 1"),
        ({**llama3, "rope_original_context": 0}, "rope_original_context"),
        ({**gemma, "rope_original_context": 4096}, "rope_original_context"),
        ({**phi, "rope_factor": 8.0}, "context / rope_original_context = 4"),
        ({**llama3, "rope_low_freq_factor": 4.0}, "0 < rope_low_freq_factor"),
        ({**gemma, "rope_high_freq_factor": 2.0}, "llama3's"),
        ({**base, "sliding_window": 4096}, "sliding_window is gemma3's"),
        ({**gemma, "rope_theta_swa": 0.0}, "rope_theta_swa"),
        ({**gemma, "sliding_window": 0}, "rope_theta_swa"),
        ({**phi, "rope_theta_swa": 1e4}, "rope_theta_swa"),
        ({**moe, "experts": 0}, "experts_used <= experts"),
        ({**moe, "experts_used": 0}, "experts_used <= experts"),
        ({**moe, "expert_ffn": 0}, "experts_used <= experts"),
        ({**moe, "experts_used": 9}, "experts_used <= experts"),
        ({**moe, "qk_norm": False}, "qk_norm"),  # llama.cpp requires qwen3moe's
        ({**base, "experts": 8, "experts_used": 2, "expert_ffn": 256}, "dense llama"),
        ({**base, "expert_ffn": 256}, "dense llama"),
        ({**base, "name": "tiny-llama-L02"}, "name"),  # (a reduction: -L<n>, no 0 first)
        ({**oss, "qkv_bias": False}, "qkv_bias"),  # llama.cpp's gpt-oss has the biases
        ({**oss, "sliding_window": 0}, "gpt-oss needs sliding_window > 0"),
        ({**oss, "ffn": 512}, "ffn == expert_ffn"),
        ({**oss, "expert_ffn": 512}, "ffn == expert_ffn"),
        ({**oss, "rope_original_context": 0}, "rope_original_context"),  # yarn needs it
        ({**oss, "rope_factor": 1.0}, "rope_factor > 1"),
        ({**oss, "rope_scaling": "linear"}, "gpt-oss file holds"),
        ({**oss, "experts_used": 9}, "experts_used <= experts"),
        ({**oss, "qk_norm": True}, "qk_norm"),
    ]
    for kw, match in bad:
        with pytest.raises(ValueError, match=match):
            Shape(**kw)
    assert Shape(**{**gemma, "sliding_window": 0, "rope_theta_swa": 0.0}).sliding_window == 0
    # (gpt-oss without YaRN: plain RoPE, which its file may hold)
    assert Shape(**{**oss, "rope_scaling": "none", "rope_factor": 1.0,
                    "rope_original_context": 0}).rope_scaling == "none"
    # A dense shape's dict (its files' manifest identity) has no MoE fields, as before
    # they existed; every dict gives its shape back.
    assert not {"experts", "experts_used", "expert_ffn"} & set(base)
    assert {"experts", "experts_used", "expert_ffn"} <= set(moe)
    assert all(Shape(**s.to_dict()) == s for s in SHAPES.values())
    with pytest.raises(UnknownNameError):
        get_shape("gpt-5")
    with pytest.raises(UnknownNameError):
        ensure_shape_gguf("tiny-llama", "Q5_K_S")


def _block(shape: Shape, i: int) -> list[Any]:
    return [t for t in tensor_plan(shape) if t.name.startswith(f"blk.{i}.")]


def test_reduced_shapes(tmp_path: Path) -> None:
    """``<name>-L<n>``: the full shape's first n layers, all else kept, named as reduced."""
    full = SHAPES["qwen3-30b-a3b"]
    r = get_shape("qwen3-30b-a3b-L8")
    assert r == with_layers(full, 8) and (r.name, r.layers) == ("qwen3-30b-a3b-L8", 8)
    assert dataclasses.replace(r, name=full.name, layers=full.layers) == full
    assert r.to_dict() == {**full.to_dict(), "name": r.name, "layers": 8}  # its own manifest
    assert reduced_from(r) == full and reduced_from(full) is None
    assert reduced_from(Shape(**{**r.to_dict(), "vocab": 160000})) is None  # not a cut of it
    assert with_layers(r, 2) == get_shape("qwen3-30b-a3b-L2")  # cut from the full shape
    # The same layers and the same tensors outside them.
    assert _block(r, 7) == _block(full, 7) and not _block(r, 8)
    assert ([t for t in tensor_plan(r) if not t.name.startswith("blk.")]
            == [t for t in tensor_plan(full) if not t.name.startswith("blk.")])
    per_layer = sum(t.numel for t in _block(full, 0))
    active = sum(t.numel // full.experts * full.experts_used if len(t.shape) == 3 else t.numel
                 for t in _block(full, 0))
    assert full.parameters() - r.parameters() == 40 * per_layer
    assert full.active_parameters() - r.active_parameters() == 40 * active
    g = get_shape("tiny-gemma3-L3")  # any shape: a dense one keeps its dense dict
    assert g.layers == 3 and "experts" not in g.to_dict()
    for bad in ("qwen3-30b-a3b-L48", "qwen3-30b-a3b-L0", "qwen3-30b-a3b-L08",
                "qwen3-30b-a3b-l8", "gpt-5-L2", "qwen3-30b-a3b-L8-L4"):
        with pytest.raises(UnknownNameError):
            get_shape(bad)
    with pytest.raises(ValueError, match="1 to 47 of its 48 layers"):
        with_layers(full, 48)
    # The file says it is reduced, and from what.
    desc = _keys(r, tmp_path)["general.description"]
    assert "qwen3-30b-a3b reduced to 8 of its 48 layers (qwen3-30b-a3b-L8)" in desc
    assert "reduced" not in _keys(full, tmp_path)["general.description"]


# ---- the plan and the keys, against llama.cpp and our loader's tables -------------------
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_tensor_plan_is_llama_cpps(name: str) -> None:
    shape = SHAPES[name]
    plan = tensor_plan(shape)
    arch = gguf_arch.ARCHS[shape.arch]
    names = [t.name for t in plan]
    assert len(set(names)) == len(names)
    for t in plan:  # every tensor our loader knows for the architecture
        target = arch.tensor_name(t.name)
        assert (target is None) == (t.name in gguf_arch.CONFIG_TENSORS) == (t.kind == FACTORS)
        # Matrices (2-D, or 3-D stacked experts) F16; 1-D tensors, the router and the
        # experts' stacked biases (2-D, gpt-oss's) F32.
        assert (t.kind == ROUTER) == t.name.endswith("ffn_gate_inp.weight")
        assert (t.kind == MATRIX) == (len(t.shape) >= 2 and t.kind != ROUTER
                                      and not t.name.endswith(".bias"))
        assert t.dtype == (np.float16 if t.kind == MATRIX else np.float32)
        # (the stacked experts: the only 3-D tensors, and each of them 3-D; their stacked
        # biases the only 2-D biases)
        assert (len(t.shape) == 3) == t.name.endswith("_exps.weight")
        assert (len(t.shape) == 2 and t.kind == BIAS) == t.name.endswith("_exps.bias")
        assert t.stacked == t.name.endswith(("_exps.weight", "_exps.bias"))
    blocks = [{n.split(".", 2)[2] for n in names if n.startswith(f"blk.{i}.")}
              for i in range(shape.layers)]
    assert all(b == BLOCK_KINDS[shape.arch] for b in blocks)
    outside = {n for n in names if not n.startswith("blk.")}
    assert outside == ({"token_embd.weight", "output_norm.weight"}
                       | ({"output.weight"} if not shape.tied else set())
                       | ROPE_TENSORS[shape.rope_scaling])
    # The converter yields its computed RoPE tensors first.
    assert names[:len(ROPE_TENSORS[shape.rope_scaling])] == sorted(
        ROPE_TENSORS[shape.rope_scaling])
    dims = {t.name: t.shape for t in plan}
    h, hd, ffn = shape.hidden, shape.head_dim, shape.ffn
    q, kv = shape.heads * hd, shape.kv_heads * hd
    assert dims["blk.0.attn_output.weight"] == (h, q)
    if shape.arch == "phi3":  # Q|K|V rows, and gate|up rows (llama.cpp's {n_embd, 2 n_ff})
        assert dims["blk.0.attn_qkv.weight"] == (q + 2 * kv, h)
        assert dims["blk.0.ffn_up.weight"] == (2 * ffn, h)
    elif shape.experts:  # llama.cpp's {n_embd, n_expert}, {n_embd, n_ff_exp, n_expert} ...
        e, ef = shape.experts, shape.expert_ffn
        assert dims["blk.0.attn_k.weight"] == dims["blk.0.attn_v.weight"] == (kv, h)
        assert dims["blk.0.ffn_gate_inp.weight"] == (e, h)
        assert dims["blk.0.ffn_gate_exps.weight"] == dims["blk.0.ffn_up_exps.weight"] == (
            e, ef, h)
        assert dims["blk.0.ffn_down_exps.weight"] == (e, h, ef)  # ... {n_ff_exp, n_embd, ...}
        if shape.arch == "gpt-oss":  # {n_embd}, {n_head}, {n_expert}, {n_ff_exp, n_expert} ...
            assert dims["blk.0.attn_q.bias"] == (q,)
            assert dims["blk.0.attn_k.bias"] == dims["blk.0.attn_v.bias"] == (kv,)
            assert dims["blk.0.attn_output.bias"] == dims[
                "blk.0.post_attention_norm.weight"] == (h,)
            assert dims["blk.0.attn_sinks.weight"] == (shape.heads,)
            assert dims["blk.0.ffn_gate_inp.bias"] == (e,)
            assert dims["blk.0.ffn_gate_exps.bias"] == dims["blk.0.ffn_up_exps.bias"] == (
                e, ef)
            assert dims["blk.0.ffn_down_exps.bias"] == (e, h)  # ... {n_embd, n_expert}
    else:
        assert dims["blk.0.attn_k.weight"] == dims["blk.0.attn_v.weight"] == (kv, h)
        assert dims["blk.0.ffn_gate.weight"] == dims["blk.0.ffn_up.weight"] == (ffn, h)
    for t in plan:
        if t.kind == FACTORS:  # llama.cpp's {n_rot / 2}
            assert t.shape == (shape.rotary_dim // 2,) == (len(t.values),)
        elif t.name.endswith(("q_norm.weight", "k_norm.weight")):
            assert t.shape == (hd,)


def _keys(shape: Shape, tmp_path: Path) -> dict[str, Any]:
    """The metadata the writer states for ``shape`` (without a tokenizer)."""
    import gguf

    w = gguf.GGUFWriter(tmp_path / f"{shape.name}.gguf", shape.arch)
    _metadata(w, shape, 0, [])
    return {k: v.value for k, v in w.kv_data[0].items()}


# The {arch}. keys llama.cpp requires (llama-model.cpp's load_hparams: the common ones;
# src/models/<arch>.cpp: the eps) and those that state each feature.
_REQUIRED = ("context_length", "embedding_length", "block_count", "feed_forward_length",
             "attention.head_count", "attention.layer_norm_rms_epsilon")


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_metadata_keys_are_in_our_loaders_tables(name: str, tmp_path: Path) -> None:
    shape = SHAPES[name]
    keys = _keys(shape, tmp_path)
    a = shape.arch
    arch = gguf_arch.ARCHS[a]
    known = (set(gguf_arch.COMMON_KEYS) | set(gguf_arch.HANDLED_KEYS)
             | set(gguf_arch.IGNORED_KEYS) | set(arch.keys))
    ours = {k[len(a) + 1:]: v for k, v in keys.items() if k.startswith(a + ".")}
    assert set(ours) <= known
    assert {k for k in keys if not k.startswith(a + ".")} <= {
        k for k in keys if k.startswith(gguf_arch.INFORMATIONAL_PREFIXES)}
    assert keys["general.architecture"] == a
    # (llama.cpp sets a model's token attributes by words in its name: none here.)
    assert not any(w in keys["general.name"].lower() for w in ("phi", "bert", "jina"))
    assert set(_REQUIRED) <= set(ours)
    assert (ours["context_length"], ours["embedding_length"], ours["block_count"]) == (
        shape.context, shape.hidden, shape.layers)
    assert (ours["attention.head_count"], ours["attention.head_count_kv"],
            ours["attention.key_length"], ours["attention.value_length"]) == (
        shape.heads, shape.kv_heads, shape.head_dim, shape.head_dim)
    assert ours["rope.dimension_count"] == shape.rotary_dim
    assert ours["rope.freq_base"] == pytest.approx(shape.rope_theta)
    assert ours["attention.layer_norm_rms_epsilon"] == pytest.approx(shape.rms_eps)
    scaling = {k: v for k, v in ours.items() if k.startswith("rope.scaling.")}
    if shape.rope_scaling == "linear":
        assert scaling == {"rope.scaling.type": "linear",
                           "rope.scaling.factor": pytest.approx(shape.rope_factor)}
    elif shape.rope_scaling == "longrope":  # Phi-3's converter writes no type
        assert scaling == {
            "rope.scaling.original_context_length": shape.rope_original_context,
            "rope.scaling.attn_factor": pytest.approx(longrope_attn_factor(shape))}
    elif shape.rope_scaling == "yarn":  # gpt-oss's converter: its config's five values
        assert scaling == {
            "rope.scaling.type": "yarn", "rope.scaling.factor": pytest.approx(shape.rope_factor),
            "rope.scaling.original_context_length": shape.rope_original_context,
            "rope.scaling.yarn_beta_fast": 32.0, "rope.scaling.yarn_beta_slow": 1.0}
    else:  # (llama3: the rope_freqs tensor alone)
        assert scaling == {}
    assert ours.get("attention.sliding_window", 0) == shape.sliding_window
    assert ours.get("rope.freq_base_swa", 0.0) == pytest.approx(shape.rope_theta_swa)
    # A mixture of experts states its three sizes (llama.cpp's qwen3moe refuses 0
    # experts; our loader requires the expert size); a dense shape none of them.
    moe = {k: ours[k] for k in _MOE_KEYS if k in ours}
    assert moe == ({"expert_count": shape.experts, "expert_used_count": shape.experts_used,
                    "expert_feed_forward_length": shape.expert_ffn} if shape.experts else {})


def test_llama3_rope_freqs_match_transformers() -> None:
    """rope_freqs divides the plain frequencies into transformers' llama3 ones."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for name in ("llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "tiny-llama3"):
        s = SHAPES[name]
        cfg = LlamaConfig(
            hidden_size=s.hidden, num_attention_heads=s.heads, head_dim=s.head_dim,
            max_position_embeddings=s.context, rope_parameters={
                "rope_type": "llama3", "rope_theta": s.rope_theta, "factor": s.rope_factor,
                "low_freq_factor": s.rope_low_freq_factor,
                "high_freq_factor": s.rope_high_freq_factor,
                "original_max_position_embeddings": s.rope_original_context})
        scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
        plain = 1.0 / s.rope_theta ** (np.arange(0, s.head_dim, 2) / s.head_dim)
        freqs = np.asarray(llama3_rope_freqs(s))
        assert freqs.shape == (s.head_dim // 2,) and freqs[0] == 1.0
        assert freqs[-1] == s.rope_factor and np.all(np.diff(freqs) >= 0)
        np.testing.assert_allclose(plain / freqs, scaled.double().numpy(), rtol=2e-6)
        assert [t.values for t in tensor_plan(s) if t.kind == FACTORS] == [tuple(freqs)]


def test_longrope_factors_and_attn_factor() -> None:
    p = SHAPES["phi-4-mini"]
    long, short = (t for t in tensor_plan(p) if t.kind == FACTORS)
    assert (long.name, short.name) == ("rope_factors_long.weight", "rope_factors_short.weight")
    assert len(long.values) == len(short.values) == 48 and set(short.values) == {1.0}
    assert long.values[0] == 1.0 and long.values[-1] == pytest.approx(32.0)
    assert all(b > a for a, b in zip(long.values, long.values[1:], strict=False))
    # transformers' default for longrope: sqrt(1 + ln(factor) / ln(original)).
    assert longrope_attn_factor(p) == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    assert longrope_attn_factor(p) == pytest.approx(1.1902380714)


# ---- the file ------------------------------------------------------------------------
@needs_model
@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-qwen3moe", "tiny-gptoss"])
def test_file_layout_metadata_and_determinism(name: str, tmp_path: Path) -> None:
    import gguf

    shape = SHAPES[name]
    a, b, c = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    write_shape_gguf(shape, a, seed=1)
    write_shape_gguf(shape, b, seed=1)
    write_shape_gguf(shape, c, seed=2)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    r = gguf.GGUFReader(a)
    plan = tensor_plan(shape)
    assert [t.name for t in r.tensors] == [t.name for t in plan]
    for t, spec in zip(r.tensors, plan, strict=True):  # (GGUF: ggml's dims, reversed)
        assert tuple(int(d) for d in reversed(t.shape)) == spec.shape
        assert t.tensor_type.name == ("F16" if spec.kind == MATRIX else "F32")
    arch = shape.arch
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    assert f["general.architecture"] == arch
    assert f[f"{arch}.attention.key_length"] == shape.head_dim
    assert f[f"{arch}.embedding_length"] == 256
    assert f[f"{arch}.vocab_size"] == shape.vocab and f["general.file_type"] == 1
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    assert len(tokens) == len(types) == shape.vocab and len(set(tokens)) == shape.vocab
    assert tokens[BASE_VOCAB:][:1] == [f"[PAD{BASE_VOCAB}]"]
    assert set(types[BASE_VOCAB:]) == {UNUSED}
    norms = {t.name: t for t in r.tensors if t.name.endswith("norm.weight")}
    assert all(np.all(t.data == 1.0) for t in norms.values())
    q = next(t for t in r.tensors if t.name == "blk.0.attn_q.weight")
    w = np.asarray(q.data, dtype=np.float32)
    assert 0.015 < float(w.std()) < 0.025 and np.isfinite(w).all()
    if shape.experts:
        e, ef, h = shape.experts, shape.expert_ffn, shape.hidden
        assert (f[f"{arch}.expert_count"], f[f"{arch}.expert_used_count"],
                f[f"{arch}.expert_feed_forward_length"], f[f"{arch}.feed_forward_length"]) == (
            e, shape.experts_used, ef, shape.ffn)
        t = {x.name: x for x in r.tensors}
        assert not any(n.endswith(("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"))
                       for n in t)
        router = t["blk.1.ffn_gate_inp.weight"]
        assert router.tensor_type.name == "F32" and list(router.shape) == [h, e]
        rw = np.asarray(router.data)
        assert rw.dtype == np.float32 and 0.015 < float(rw.std()) < 0.025
        for kind, ne in (("gate", [h, ef, e]), ("up", [h, ef, e]), ("down", [ef, h, e])):
            x = t[f"blk.1.ffn_{kind}_exps.weight"]
            assert x.tensor_type.name == "F16" and [int(d) for d in x.shape] == ne
            ew = np.asarray(x.data, dtype=np.float32)
            assert 0.015 < float(ew.std()) < 0.025 and np.isfinite(ew).all()
        if arch == "gpt-oss":  # the experts' stacked biases: F32, ggml's {rows, experts}
            for kind, ne in (("gate", [ef, e]), ("up", [ef, e]), ("down", [h, e])):
                x = t[f"blk.1.ffn_{kind}_exps.bias"]
                assert x.tensor_type.name == "F32" and [int(d) for d in x.shape] == ne
                bw = np.asarray(x.data)
                assert bw.dtype == np.float32 and 0.015 < float(bw.std()) < 0.025
            assert [int(d) for d in t["blk.0.attn_sinks.weight"].shape] == [shape.heads]


def _check_config(c: Any, shape: Shape) -> None:
    """Our loader's ModelConfig ``c`` of ``shape``'s file states the shape."""
    assert c.model_type == gguf_arch.ARCHS[shape.arch].model_type
    assert (c.vocab_size, c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads,
            c.head_dim, c.intermediate_size, c.max_position) == (
        shape.vocab, shape.hidden, shape.layers, shape.heads, shape.kv_heads, shape.head_dim,
        shape.ffn, shape.context)
    assert (c.tie_embeddings, c.attention_bias, c.qk_norm) == (
        shape.tied, shape.qkv_bias, shape.qk_norm)
    assert (c.num_experts, c.experts_per_token, c.expert_intermediate_size) == (
        shape.experts, shape.experts_used, shape.expert_ffn)
    assert c.rms_norm_eps == pytest.approx(shape.rms_eps) and c.rotary_dims == shape.rotary_dim
    r = c.rope
    assert r.theta == pytest.approx(shape.rope_theta)
    kind = shape.rope_scaling
    if kind == "none":
        assert r.type == "default"
    elif kind == "linear":
        assert (r.type, r.factor) == ("linear", shape.rope_factor)
    elif kind == "llama3":  # llama.cpp's divisors, read from the file
        assert r.type == "freq_factors"
        assert r.freq_factors == pytest.approx(llama3_rope_freqs(shape), rel=1e-7)
    elif kind == "yarn":  # (gpt-oss's: the model's unrounded correction range)
        assert (r.type, r.factor, r.original_context) == (
            "yarn", shape.rope_factor, shape.rope_original_context)
        assert (r.beta_fast, r.beta_slow, r.truncate) == (32.0, 1.0, False)
    else:
        factors = [t.values for t in tensor_plan(shape) if t.kind == FACTORS]
        assert (r.type, r.original_context) == ("longrope", shape.rope_original_context)
        assert [r.long_factor, r.short_factor] == [pytest.approx(f, rel=1e-7) for f in factors]
        assert r.attention_factor == pytest.approx(longrope_attn_factor(shape), rel=1e-6)
    n = shape.layers
    gemma = shape.arch == "gemma3"
    assert (c.norm_offset_one, c.sandwich_norms) == (gemma, gemma)
    # SmolLM3: no RoPE in every 4th layer (llama.cpp's fixed step).
    assert c.nope_layers == (tuple(i for i in range(n) if (i + 1) % 4 == 0)
                             if shape.arch == "smollm3" else ())
    oss = shape.arch == "gpt-oss"
    assert (c.attention_sinks, c.expert_bias) == (oss, oss)
    if oss:  # every other layer slides, from the first (llama.cpp's pattern 2)
        assert c.layer_windows == tuple(shape.sliding_window if i % 2 == 0 else None
                                        for i in range(n))
        assert c.rope_local is None
    elif gemma:  # five sliding layers, then a global one; those slide on their own base
        assert c.layer_windows == tuple(None if (i + 1) % 6 == 0 else shape.sliding_window
                                        for i in range(n))
        assert c.rope_local is not None and c.rope_local.type == "default"
        assert c.rope_local.theta == pytest.approx(shape.rope_theta_swa)
    else:  # (phi3: transformers' window on every layer; llama.cpp disables it)
        assert set(c.layer_windows) <= {shape.sliding_window or None}
        assert c.rope_local is None


@needs_model
@pytest.mark.parametrize("name", [*PUBLISHED_SHAPES, "qwen3-30b-a3b-L8"])
def test_our_loader_reads_every_published_shapes_header(name: str, tmp_path: Path) -> None:
    """The full-size file's header, RoPE tensors and config (a sparse file: the weights
    are holes, so nothing of gigabytes is written); a reduced shape's too."""
    from recallspec.models.config import ModelConfig
    from recallspec.models.gguf.header import read_header

    shape = get_shape(name)
    path = tmp_path / f"{name}.gguf"
    size = write_shape_gguf(shape, path, seed=0, weights=False)
    header = read_header(path)
    assert size == path.stat().st_size > shape.parameters() * 2  # every F16 byte, as holes
    assert [(t.name, t.shape) for t in header.tensors] == [
        (t.name, t.shape) for t in tensor_plan(shape)]
    c = ModelConfig.from_hf_dict(gguf_arch.hf_config(header, path), str(path))
    _check_config(c, shape)


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The tiny shapes as F16 files, with a private model cache for their conversion."""
    root = tmp_path_factory.mktemp("shapes")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RECALLSPEC_CACHE_DIR", str(root / "cache"))
        yield {n: ensure_shape_gguf(n, cache_dir=root / "shapes", progress=lambda _m: None)
               for n in TINY}


@needs_model
@pytest.mark.parametrize("name", TINY)
def test_our_loader_runs_each_architecture(name: str, tiny_files: dict[str, Path]) -> None:
    from recallspec import Engine, SamplingParams
    from recallspec.runtime.batch import SequenceInput, build_batch

    shape = SHAPES[name]
    eng = Engine.load(str(tiny_files[name]), max_batch_size=1)
    c, tok = eng.model.config, eng.tokenizer
    _check_config(c, shape)
    assert tok.vocab_size == shape.vocab
    ids = tok.encode("The quick brown fox jumps over the lazy dog.")
    logits = eng.model(build_batch([SequenceInput(0, 0, ids)]), eng.model.new_cache(1, 64))
    assert logits.shape == (len(ids), shape.vocab) and bool(logits.isfinite().all())
    out = eng.generate("Hello", SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert len(out.token_ids) == 4 and all(0 <= t < shape.vocab for t in out.token_ids)
    padded = list(range(BASE_VOCAB - 2, shape.vocab))  # the last real ids and every pad id
    text = tok.decode(padded)
    assert isinstance(text, str)
    assert tok.decode([shape.vocab - 1]) == (
        f"[PAD{shape.vocab - 1}]" if shape.vocab > BASE_VOCAB else tok.decode([BASE_VOCAB - 1]))


@needs_model
def test_our_loader_runs_the_mixture_of_experts(tiny_files: dict[str, Path]) -> None:
    """``load_model`` (the default weight format) reads the stacked experts and the F32
    router of tiny-qwen3moe's F16 file as a mixture of experts, and a forward runs."""
    from recallspec.models import load_model
    from recallspec.runtime.batch import SequenceInput, build_batch

    shape = SHAPES["tiny-qwen3moe"]
    model, tok = load_model(tiny_files[shape.name], dtype="auto", repack_cache=False)
    c = model.config
    assert c.moe and (c.num_experts, c.experts_per_token, c.mlp_size) == (
        shape.experts, shape.experts_used, shape.expert_ffn)
    assert c.norm_topk_prob  # (llama.cpp's qwen3moe: the chosen experts renormalised)
    ids = tok.encode("The quick brown fox jumps over the lazy dog.")
    logits = model(build_batch([SequenceInput(0, 0, ids)]), model.new_cache(1, 64))
    assert logits.shape == (len(ids), shape.vocab) and bool(logits.isfinite().all())


@needs_model
@pytest.mark.peer
@pytest.mark.parametrize("name", TINY)
def test_llama_cpp_runs_each_architecture(name: str, tiny_files: dict[str, Path]) -> None:
    """llama-bench (as ``bench scale`` runs it, flash attention on) loads each tiny shape
    and runs a prefill and a decode: a smoke test, its speeds unread."""
    native_peer_or_unavailable()
    from recallspec.bench.common import llamacpp

    rows = llamacpp.llama_bench(str(tiny_files[name]), 1, p=16, n=4, repeats=1,
                                timeout_s=300)
    assert sorted((r["n_prompt"], r["n_gen"]) for r in rows) == [(0, 4), (16, 0)]
    assert all(r["avg_ts"] > 0 for r in rows)


# ---- the cache -----------------------------------------------------------------------
@needs_model
def test_manifest_reuse_and_rewrite(tmp_path: Path) -> None:
    said: list[str] = []
    p = ensure_shape_gguf("tiny-llama", "f16", cache_dir=tmp_path, progress=said.append)
    assert p == tmp_path / "tiny-llama-F16.gguf"
    m = json.loads(p.with_suffix(".json").read_text())
    assert m["file_bytes"] == p.stat().st_size and m["seed"] == shapes_gguf.DEFAULT_SEED
    assert m["shape"] == SHAPES["tiny-llama"].to_dict() and len(m["sha256"]) == 64
    mtime = p.stat().st_mtime_ns
    assert ensure_shape_gguf("tiny-llama", cache_dir=tmp_path, progress=said.append) == p
    assert p.stat().st_mtime_ns == mtime and "cached" in said[-1]
    ensure_shape_gguf("tiny-llama", cache_dir=tmp_path, progress=said.append, seed=5)
    assert p.stat().st_mtime_ns != mtime  # another seed: rewritten
    assert json.loads(p.with_suffix(".json").read_text())["seed"] == 5
    assert sorted(x.name for x in tmp_path.iterdir()) == ["tiny-llama-F16.gguf",
                                                          "tiny-llama-F16.json"]


def test_interrupted_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          ) -> None:
    def interrupted(shape: Shape, path: Path, *, seed: int, source: str) -> int:
        path.write_bytes(b"GGUF" + bytes(1000))
        raise KeyboardInterrupt

    stale = tmp_path / "tiny-llama-F16.tmp-99999999.gguf"  # a dead process's
    stale.write_bytes(b"GGUF")
    monkeypatch.setattr(shapes_gguf, "write_shape_gguf", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ensure_shape_gguf("tiny-llama", cache_dir=tmp_path, progress=lambda _m: None)
    assert list(tmp_path.iterdir()) == []


def test_disk_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shapes_gguf.shutil, "disk_usage", lambda _p: SimpleNamespace(free=10 << 30))
    with pytest.raises(ResourceError, match=r"llama-3.1-8b F16: needs about 16.1 GB"):
        ensure_shape_gguf("llama-3.1-8b", cache_dir=tmp_path, progress=lambda _m: None)
    assert list(tmp_path.iterdir()) == []
    # gpt-oss-20b at MXFP4_MOE, tensor by tensor: the stacked experts at 17 bytes per 32
    # weights (MXFP4), every other matrix at 34 (Q8_0: attention, embedding, head), the
    # rest F32 (none of them needs padding), on top of its Q8_0 source's.
    oss, meta = SHAPES["gpt-oss-20b"], shapes_gguf.METADATA_BYTES
    h, n, q, kv = oss.hidden, oss.layers, oss.heads * oss.head_dim, oss.kv_heads * oss.head_dim
    experts = n * 3 * oss.experts * oss.expert_ffn * h
    q8 = 2 * oss.vocab * h + n * (2 * q * h + 2 * kv * h)
    f32 = oss.parameters() - experts - q8
    mxfp4 = experts * 17 // 32 + q8 * 34 // 32 + 4 * f32
    assert shapes_gguf.quant_file_bytes(oss, "MXFP4_MOE") - meta == mxfp4 == 12_096_558_336
    assert shapes_gguf.source_file_bytes(oss, "Q8_0") - meta == (
        (experts + q8) * 34 // 32 + 4 * f32) == 22_248_903_936
    assert shapes_gguf.quant_file_bytes(oss, "Q8_0") == shapes_gguf.source_file_bytes(oss, "Q8_0")
    # (a dense shape's Q8_0 file: every matrix Q8_0, as its source's would be)
    l8 = SHAPES["llama-3.1-8b"]
    assert shapes_gguf.quant_file_bytes(l8, "Q8_0") == shapes_gguf.source_file_bytes(l8, "Q8_0")
    exe, _ = _fake_quantize(tmp_path / "bin")  # (a binary is found before the check)
    with pytest.raises(ResourceError, match=r"gpt-oss-20b MXFP4_MOE: needs about 34.4 GB"):
        ensure_shape_gguf("gpt-oss-20b", "MXFP4_MOE", cache_dir=tmp_path / "cache",
                          quantize_bin=exe, progress=lambda _m: None)
    assert list((tmp_path / "cache").iterdir()) == []


# ---- quantization ----------------------------------------------------------------------
def _fake_quantize(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in for llama-quantize: logs its arguments and copies SRC to DST (after
    its options)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "args.log"
    exe = tmp_path / "llama-quantize"
    exe.write_text(f'#!/bin/sh\necho "$@" >> {log}\n'
                   'while [ "${1#--}" != "$1" ]; do shift; done\ncp "$1" "$2"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe, log


def test_quantize_found_beside_the_named_peer(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """$RECALLSPEC_LLAMACPP_BIN names the native peer's directory: its llama-quantize is
    used (no peer.json needed: a build of one's own); a directory without one gives None."""
    monkeypatch.delenv(shapes_gguf.QUANTIZE_ENV, raising=False)
    exe, _ = _fake_quantize(tmp_path / "bin")
    monkeypatch.setenv(shapes_gguf.LLAMACPP_BIN_ENV, str(exe.parent))
    assert find_quantize() == exe.resolve()
    monkeypatch.setenv(shapes_gguf.LLAMACPP_BIN_ENV, str(tmp_path / "empty"))
    assert find_quantize() is None


def test_quantize_needs_a_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(shapes_gguf.QUANTIZE_ENV, raising=False)
    monkeypatch.setattr(shapes_gguf, "_peer_quantize",
                        lambda: tmp_path / "none" / "llama-quantize")
    assert find_quantize() is None
    cache = tmp_path / "cache"
    with pytest.raises(RecallspecError, match="llama-quantize not found"):
        ensure_shape_gguf("tiny-llama", "Q4_K_M", cache_dir=cache, progress=lambda _m: None)
    assert list(cache.iterdir()) == []  # failed before writing the F16 file
    monkeypatch.setenv(shapes_gguf.QUANTIZE_ENV, str(tmp_path / "q"))
    assert find_quantize() == tmp_path / "q"
    with pytest.raises(RecallspecError, match="not an executable"):
        ensure_shape_gguf("tiny-llama", "Q8_0", cache_dir=cache, progress=lambda _m: None)
    assert list(cache.iterdir()) == []
    assert find_quantize(tmp_path / "p") == tmp_path / "p"


@needs_model
def test_quantize_pipeline_with_a_fake_binary(tmp_path: Path) -> None:
    exe, log = _fake_quantize(tmp_path)
    cache = tmp_path / "cache"
    said: list[str] = []
    p = ensure_shape_gguf("tiny-llama", "q8_0", cache_dir=cache, quantize_bin=exe,
                          progress=said.append)
    assert p == cache / "tiny-llama-Q8_0.gguf"
    args = log.read_text().split()
    assert args[2:3] == ["Q8_0"] and args[3].isdigit() and args[1].endswith(".gguf")
    assert sorted(x.name for x in cache.iterdir()) == ["tiny-llama-Q8_0.gguf",
                                                       "tiny-llama-Q8_0.json"]
    assert any("deleted the F16 intermediate" in s for s in said)
    assert json.loads(p.with_suffix(".json").read_text())["quant"] == "Q8_0"
    # A cached F16 file is the source and is kept.
    f16 = ensure_shape_gguf("tiny-llama", cache_dir=cache, progress=said.append)
    ensure_shape_gguf("tiny-llama", "Q4_0", cache_dir=cache, quantize_bin=exe,
                      progress=said.append)
    assert log.read_text().splitlines()[-1].split()[0] == str(f16) and f16.is_file()


@needs_model
def test_experts_are_written_in_q8_0_and_requantized(tmp_path: Path) -> None:
    """A mixture of experts' weights are written as Q8_0 blocks (no F16 file: 61 GB at
    Qwen3-30B-A3B), the source of its other quantizations through --allow-requantize; the
    blocks are the F16 pool's values to Q8_0's rounding, and our loader runs the file."""
    import gguf

    from recallspec.models import load_model
    from recallspec.runtime.batch import SequenceInput, build_batch

    shape = SHAPES["tiny-qwen3moe"]
    exe, log = _fake_quantize(tmp_path)
    cache = tmp_path / "cache"
    said: list[str] = []
    q8 = ensure_shape_gguf(shape.name, "Q8_0", cache_dir=cache, progress=said.append)
    assert not log.exists()  # written, not quantized
    assert json.loads(q8.with_suffix(".json").read_text())["source"] == "Q8_0"
    assert q8.stat().st_size <= shapes_gguf.source_file_bytes(shape, "Q8_0")
    r = gguf.GGUFReader(q8)
    plan = {t.name: t for t in tensor_plan(shape)}
    for t in r.tensors:
        spec = plan[t.name]
        assert t.tensor_type.name == ("Q8_0" if spec.kind == MATRIX else "F32")
        assert tuple(int(d) for d in reversed(t.shape)) == spec.shape
    x = next(t for t in r.tensors if t.name == "blk.1.ffn_down_exps.weight")
    w = gguf.quants.dequantize(x.data, x.tensor_type)
    assert 0.015 < float(w.std()) < 0.025 and np.isfinite(w).all()
    assert r.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q8_0
    p = ensure_shape_gguf(shape.name, "Q4_K_M", cache_dir=cache, quantize_bin=exe,
                          progress=said.append)
    args = log.read_text().split()
    assert args[0] == "--allow-requantize" and args[1] == str(q8) and args[3] == "Q4_K_M"
    assert q8.is_file()  # a cached source is kept
    assert json.loads(p.with_suffix(".json").read_text())["source"] == "Q8_0"
    # (A requested F16 file is written as F16, no source stated.)
    f16 = ensure_shape_gguf(shape.name, "F16", cache_dir=cache, progress=said.append)
    assert "source" not in json.loads(f16.with_suffix(".json").read_text())
    model, tok = load_model(q8, dtype="auto", repack_cache=False)
    ids = tok.encode("The quick brown fox")
    logits = model(build_batch([SequenceInput(0, 0, ids)]), model.new_cache(1, 64))
    assert logits.shape == (len(ids), shape.vocab) and bool(logits.isfinite().all())


@needs_model
def test_mxfp4_moe_is_requantized_from_q8_0(tmp_path: Path) -> None:
    """gpt-oss's MXFP4_MOE (as it is published) is made from its Q8_0 source with
    --allow-requantize, the intermediate deleted after."""
    exe, log = _fake_quantize(tmp_path)
    cache = tmp_path / "cache"
    said: list[str] = []
    p = ensure_shape_gguf("tiny-gptoss", "MXFP4_MOE", cache_dir=cache, quantize_bin=exe,
                          progress=said.append)
    args = log.read_text().split()
    assert args[0] == "--allow-requantize" and args[3] == "MXFP4_MOE"
    assert Path(args[1]).name.startswith("tiny-gptoss-Q8_0.tmp-")
    assert any("deleted the Q8_0 intermediate" in m for m in said)
    assert sorted(x.name for x in cache.iterdir()) == ["tiny-gptoss-MXFP4_MOE.gguf",
                                                       "tiny-gptoss-MXFP4_MOE.json"]
    assert json.loads(p.with_suffix(".json").read_text())["source"] == "Q8_0"


@needs_model
@pytest.mark.peer
def test_quantize_with_llama_quantize(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      ) -> None:
    """The real llama-quantize ($RECALLSPEC_LLAMA_QUANTIZE or the built peer's); our
    loader runs its Q4_K_M output."""
    if not os.environ.get(shapes_gguf.QUANTIZE_ENV):
        native_peer_or_unavailable()  # CI builds the peer (.ci/run); a missing one fails
    exe = find_quantize()
    if exe is None or not exe.is_file():
        unavailable(f"no llama-quantize (set {shapes_gguf.QUANTIZE_ENV} or make peers)")
    from recallspec import Engine, SamplingParams

    monkeypatch.setenv("RECALLSPEC_CACHE_DIR", str(tmp_path / "models"))
    cache = tmp_path / "shapes"
    for q in ("Q8_0", "Q4_0", "Q4_K_M"):
        p = ensure_shape_gguf("tiny-llama", q, cache_dir=cache, progress=lambda _m: None)
        assert p.stat().st_size < 0.7 * SHAPES["tiny-llama"].parameters() * 2
    assert not list(cache.glob("*F16*"))
    eng = Engine.load(str(cache / "tiny-llama-Q4_K_M.gguf"), max_batch_size=1)
    out = eng.generate("Hello", SamplingParams(max_new_tokens=3, ignore_eos=True))
    assert len(out.token_ids) == 3
    # A mixture of experts: requantized from its Q8_0 source (--allow-requantize).
    moe = ensure_shape_gguf("tiny-qwen3moe", "Q4_K_M", cache_dir=cache,
                            progress=lambda _m: None)
    assert not (cache / "tiny-qwen3moe-Q8_0.gguf").exists()  # the intermediate, deleted
    eng = Engine.load(str(moe), max_batch_size=1)
    out = eng.generate("Hello", SamplingParams(max_new_tokens=3, ignore_eos=True))
    assert len(out.token_ids) == 3
    # gpt-oss at MXFP4_MOE, as it is published: each tensor of the type (and bytes) the
    # disk check counts, llama-quantize's choice: the stacked experts MXFP4, the other
    # matrices Q8_0, the router, norms, sinks and biases (the 2-D ones too) F32.
    import gguf

    shape = SHAPES["tiny-gptoss"]
    oss = ensure_shape_gguf(shape.name, "MXFP4_MOE", cache_dir=cache,
                            progress=lambda _m: None)
    assert not (cache / "tiny-gptoss-Q8_0.gguf").exists()
    r = gguf.GGUFReader(oss)
    plan = {t.name: t for t in tensor_plan(shape)}
    assert sorted(t.name for t in r.tensors) == sorted(plan)  # (in llama.cpp's order)
    for t in r.tensors:
        spec = plan[t.name]
        assert t.tensor_type.name == ("MXFP4" if len(spec.shape) == 3 else
                                      "Q8_0" if spec.kind == MATRIX else "F32"), t.name
        assert int(t.n_bytes) == shapes_gguf._quant_data_bytes(spec, "MXFP4_MOE"), t.name
    assert r.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_MXFP4_MOE
    assert oss.stat().st_size <= shapes_gguf.quant_file_bytes(shape, "MXFP4_MOE")
    # (no repack cache: its background write would outlive the test's directory)
    eng = Engine.load(str(oss), max_batch_size=1, repack_cache=False)
    out = eng.generate("Hello", SamplingParams(max_new_tokens=3, ignore_eos=True))
    assert len(out.token_ids) == 3
