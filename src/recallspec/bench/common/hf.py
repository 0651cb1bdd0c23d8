"""Peers on the same weights: a transformers model built from OUR loaded tensors.

``hf_model_from_engine`` maps our internal weights (fused QKV and gate/up, effective
norm scales) back to the transformers layout, so the peer computes with bit-identical
weights in the same dtype as our engine; only the arithmetic differs. Transformers is
imported lazily (optional extra ``hf``).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from recallspec.errors import DataError, ModelLoadError
from recallspec.models.loader import resolve_model

_HF_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}


def _require_transformers() -> None:
    if importlib.util.find_spec("transformers") is None:
        raise DataError("the hf-* methods need transformers: pip install 'recallspec[hf]'")


def hf_config_kwargs(c: Any) -> dict[str, Any]:
    """transformers (5.x) config keyword arguments equivalent to our ``ModelConfig``;
    refused for features this mapping does not carry over (RoPE scaling, partial rotary,
    layers without RoPE, Granite's multipliers, Gemma 2's soft-caps)."""
    if c.arch not in _HF_TYPES or c.model_type not in (*_HF_TYPES.values(), "mistral",
                                                        "gemma3"):
        raise ModelLoadError(f"no transformers equivalent for {c.model_type!r} here")
    plain = not (c.rope.scaled or (c.rope_local is not None and c.rope_local.scaled)
                 or c.rotary_dim or c.nope_layers or c.attn_logit_softcap)
    if not plain:
        raise ModelLoadError("the hf-* peers rebuild plain-RoPE llama, qwen2, qwen3 and "
                             "gemma3 models only; this one has RoPE scaling or another "
                             "feature they do not map")
    eos = list(c.eos_token_ids)
    kw: dict[str, Any] = {
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position, "tie_word_embeddings": c.tie_embeddings,
        "bos_token_id": c.bos_token_id, "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
        "pad_token_id": eos[0] if eos else None,
    }
    rope = {"rope_type": "default", "rope_theta": c.rope.theta}
    if c.arch == "gemma3":
        kw.update(
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=c.query_pre_attn_scalar,
            final_logit_softcapping=c.final_logit_softcap,
            sliding_window=c.sliding_window,
            layer_types=[
                "full_attention" if c.window(i) is None else "sliding_attention"
                for i in range(c.num_layers)
            ],
            rope_parameters={
                "full_attention": rope,
                "sliding_attention": {"rope_type": "default", "rope_theta": (
                    c.rope_local or c.rope).theta},
            },
        )
    else:
        kw.update(hidden_act=c.activation if c.activation == "silu" else "gelu_pytorch_tanh",
                  rope_parameters=rope)
        if c.arch in ("llama", "qwen2"):
            kw["attention_bias"] = c.attention_bias
        if c.layer_windows:
            raise ModelLoadError("sliding-window llama/qwen models are not mapped to transformers")
    return kw


def hf_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """Our CausalLM's tensors under transformers names (views where possible)."""
    c = model.config
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    # Gemma stores norm weights w and scales by (1 + w); ours hold the effective scale.
    norm = (lambda t: t - 1.0) if c.norm_offset_one else (lambda t: t)
    sd: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": model.embed_w,
        "model.norm.weight": norm(model.final_norm),
    }
    if not c.tie_embeddings:
        sd["lm_head.weight"] = model.lm_head_w
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        qw, kw_, vw = layer.qkv_w.split([q, kv, kv], dim=0)
        sd[p + "self_attn.q_proj.weight"] = qw
        sd[p + "self_attn.k_proj.weight"] = kw_
        sd[p + "self_attn.v_proj.weight"] = vw
        if layer.qkv_b is not None:
            qb, kb, vb = layer.qkv_b.split([q, kv, kv], dim=0)
            sd[p + "self_attn.q_proj.bias"] = qb
            sd[p + "self_attn.k_proj.bias"] = kb
            sd[p + "self_attn.v_proj.bias"] = vb
        sd[p + "self_attn.o_proj.weight"] = layer.o_w
        if layer.o_b is not None:
            sd[p + "self_attn.o_proj.bias"] = layer.o_b
        gate, up = layer.gate_up_w.chunk(2, dim=0)
        sd[p + "mlp.gate_proj.weight"] = gate
        sd[p + "mlp.up_proj.weight"] = up
        sd[p + "mlp.down_proj.weight"] = layer.down_w
        sd[p + "input_layernorm.weight"] = norm(layer.attn_norm)
        if c.sandwich_norms:
            sd[p + "post_attention_layernorm.weight"] = norm(layer.post_attn_norm)
            sd[p + "pre_feedforward_layernorm.weight"] = norm(layer.ffn_norm)
            sd[p + "post_feedforward_layernorm.weight"] = norm(layer.post_ffn_norm)
        else:
            sd[p + "post_attention_layernorm.weight"] = norm(layer.ffn_norm)
        if c.qk_norm:
            sd[p + "self_attn.q_norm.weight"] = norm(layer.q_norm)
            sd[p + "self_attn.k_norm.weight"] = norm(layer.k_norm)
    return sd


def hf_model_from_model(model: Any) -> Any:
    """A transformers CausalLM (eval mode, same dtype) holding our model's weights."""
    _require_transformers()
    # Here, not at the top: transformers takes seconds to import, and only the hf-*
    # peers and the runtime benchmark's HF comparison build such a model.
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    c = model.config
    hf_cfg = AutoConfig.for_model(_HF_TYPES[c.arch], **hf_config_kwargs(c))
    dtype = model.dtype
    hf = AutoModelForCausalLM.from_config(hf_cfg, dtype=dtype, attn_implementation="sdpa")
    sd = hf_state_dict(model)
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not (c.tie_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ModelLoadError(
            f"weights do not map onto transformers: missing {missing[:4]}, unexpected "
            f"{unexpected[:4]}"
        )
    if c.tie_embeddings:
        hf.tie_weights()
    hf.eval()
    # A fresh generation config: no sampling defaults inherited from anywhere.
    hf.generation_config = GenerationConfig(
        bos_token_id=hf_cfg.bos_token_id, eos_token_id=hf_cfg.eos_token_id,
        pad_token_id=hf_cfg.pad_token_id,
    )
    return hf


def hf_model_from_engine(engine: Any) -> Any:
    return hf_model_from_model(engine.model)


def gguf_path_for(model_spec: str | None) -> str:
    """The GGUF file behind a model spec (llama.cpp methods need one)."""
    p = resolve_model(model_spec)  # aliases included (the Gemma GGUF is assembled once)
    if p.suffix == ".gguf" and p.is_file():
        return str(p)
    raise DataError(f"the llamacpp-* methods need a GGUF model file, got {model_spec!r}")
