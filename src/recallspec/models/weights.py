"""A checkpoint's tensors under our internal names: the one mapping every load path uses.

HF-named tensors (a safetensors checkpoint, or a GGUF's tensors renamed by
``gguf.convert`` / ``gguf.quantized``) become the names ``CausalLM`` reads, with QKV and
gate/up (each expert's, in a mixture of experts) fused and norm weights turned into
effective scales; a mixture's router is ``layers.N.router_w``, its experts
``layers.N.experts.E.gate_up_w`` / ``down_w``. A tensor the model would not
compute with is refused, never dropped.
"""

from __future__ import annotations

from typing import Any

import torch

from recallspec.errors import ModelLoadError
from recallspec.kernels.qlinear import QuantizedWeight
from recallspec.models.config import ModelConfig

__all__ = ["internal_weights"]


def _cat(parts: list[Any]) -> Any:
    """Stack matrices along their output rows: tensors or quantized weights."""
    if all(isinstance(p, torch.Tensor) for p in parts):
        return torch.cat(parts)
    return QuantizedWeight.concat(parts)


def internal_weights(config: ModelConfig, hf: dict[str, Any]) -> dict[str, Any]:
    """HF-named tensors -> our internal names, fusing QKV and gate/up; consumes ``hf``.

    Matrices may be tensors or ``QuantizedWeight``s (fused alike); norm weights become
    effective scales (Gemma: ``1 + w``).
    """
    # Multimodal Gemma 3 checkpoints nest the text model under "language_model". Moved
    # out of the caller's dict, so that fused parts are freed as they are fused (the
    # caller still holds that dict during the call).
    hf = {k.replace("model.language_model.", "model.").replace("language_model.", ""): hf.pop(k)
          for k in list(hf)}

    at = f"{config.source} ({config.model_type}): " if config.source else ""

    def take(name: str) -> Any:
        t = hf.pop(name, None)
        if t is None:
            raise ModelLoadError(f"{at}checkpoint lacks tensor {name!r}")
        return t

    def norm(name: str) -> torch.Tensor:
        t = take(name).float()
        return t + 1.0 if config.norm_offset_one else t

    def fused(name: str, parts: tuple[str, ...]) -> Any:
        """A fused matrix as the checkpoint stores it (Phi-3's qkv_proj, gate_up_proj),
        else its parts, fused."""
        if name in hf:
            return take(name)
        prefix = name.rsplit(".", 2)[0]
        return _cat([take(f"{prefix}.{p}.weight") for p in parts])

    w: dict[str, Any] = {"embed": take("model.embed_tokens.weight")}
    if not config.tie_embeddings:
        w["lm_head"] = take("lm_head.weight")
    else:
        hf.pop("lm_head.weight", None)
    w["final_norm"] = norm("model.norm.weight")
    for i in range(config.num_layers):
        p, o = f"model.layers.{i}.", f"layers.{i}."
        a = p + "self_attn."
        w[o + "qkv_w"] = fused(a + "qkv_proj.weight", ("q_proj", "k_proj", "v_proj"))
        if f"{a}q_proj.bias" in hf:
            w[o + "qkv_b"] = torch.cat([take(a + f"{x}_proj.bias") for x in "qkv"])
        w[o + "o_w"] = take(a + "o_proj.weight")
        if f"{a}o_proj.bias" in hf:
            w[o + "o_b"] = take(a + "o_proj.bias")
        if config.attention_sinks:
            w[o + "sinks"] = take(a + "sinks" if a + "sinks" in hf else a + "sinks.weight").float()
        if config.moe and f"{p}mlp.experts.gate_up_proj" in hf:
            w.update(_stacked_experts(config, hf, p, o, take))
        elif config.moe:
            # The router stays as the checkpoint has it (float: a GGUF's ffn_gate_inp is
            # never block-quantized by llama-quantize); each expert's gate and up fused.
            router = p + ("mlp.router." if config.expert_bias else "mlp.gate.")
            w[o + "router_w"] = take(router + "weight")
            if config.expert_bias:
                w[o + "router_b"] = take(router + "bias").float()
            for e in range(config.num_experts):
                x = f"{p}mlp.experts.{e}."
                w[f"{o}experts.{e}.gate_up_w"] = fused(x + "gate_up_proj.weight",
                                                       ("gate_proj", "up_proj"))
                w[f"{o}experts.{e}.down_w"] = take(x + "down_proj.weight")
                if config.expert_bias:
                    w[f"{o}experts.{e}.gate_up_b"] = torch.cat(
                        [take(x + "gate_proj.bias"), take(x + "up_proj.bias")]).float()
                    w[f"{o}experts.{e}.down_b"] = take(x + "down_proj.bias").float()
        else:
            w[o + "gate_up_w"] = fused(p + "mlp.gate_up_proj.weight", ("gate_proj", "up_proj"))
            w[o + "down_w"] = take(p + "mlp.down_proj.weight")
        w[o + "attn_norm"] = norm(p + "input_layernorm.weight")
        if config.sandwich_norms:
            w[o + "post_attn_norm"] = norm(p + "post_attention_layernorm.weight")
            w[o + "ffn_norm"] = norm(p + "pre_feedforward_layernorm.weight")
            w[o + "post_ffn_norm"] = norm(p + "post_feedforward_layernorm.weight")
        else:
            w[o + "ffn_norm"] = norm(p + "post_attention_layernorm.weight")
        if config.qk_norm:
            w[o + "q_norm"] = norm(a + "q_norm.weight")
            w[o + "k_norm"] = norm(a + "k_norm.weight")
    # Whatever is left is a tensor this model would not compute with: refused, never
    # dropped (a multimodal checkpoint's other towers excepted: the text model is whole
    # without them).
    left = sorted(k for k in hf if not k.startswith(_OTHER_TOWERS))
    if left:
        more = f" and {len(left) - 5} more" if len(left) > 5 else ""
        raise ModelLoadError(f"{at}checkpoint holds tensors {config.model_type} does not "
                             f"use: {', '.join(left[:5])}{more}")
    return w


def _stacked_experts(config: ModelConfig, hf: dict[str, Any], p: str, o: str,
                     take: Any) -> dict[str, Any]:
    """A gpt-oss checkpoint's experts as transformers stores them (GptOssExperts): one
    [experts, hidden, 2 x size] gate-up tensor whose columns interleave gate and up
    (gate the even ones), its [experts, 2 x size] bias alike, and [experts, size, hidden]
    down and [experts, hidden] bias; split into each expert's [out, in] matrices, gate rows
    first (the order every fused gate-up here has)."""
    if not config.expert_bias:
        raise ModelLoadError(f"{config.model_type} checkpoint with gpt-oss's stacked experts")
    x = f"{p}mlp.experts."
    if f"{x}gate_up_proj_blocks" in hf:
        raise ModelLoadError("an MXFP4 safetensors checkpoint: convert it to GGUF with "
                             "llama.cpp's convert_hf_to_gguf.py and load the GGUF")
    gu, gu_b = take(x + "gate_up_proj"), take(x + "gate_up_proj_bias")
    down, down_b = take(x + "down_proj"), take(x + "down_proj_bias")
    n = config.num_experts
    size, hidden = config.expert_intermediate_size, config.hidden_size
    if (tuple(gu.shape) != (n, hidden, 2 * size) or tuple(gu_b.shape) != (n, 2 * size)
            or tuple(down.shape) != (n, size, hidden) or tuple(down_b.shape) != (n, hidden)):
        raise ModelLoadError(f"{x}: expert tensors of shapes {tuple(gu.shape)}, "
                             f"{tuple(down.shape)} for {n} experts of {size} x {hidden}")
    w: dict[str, Any] = {o + "router_w": take(p + "mlp.router.weight"),
                         o + "router_b": take(p + "mlp.router.bias").float()}
    for e in range(n):
        t = gu[e].t()  # [2 x size, hidden], rows interleaved gate / up
        w[f"{o}experts.{e}.gate_up_w"] = torch.cat([t[0::2], t[1::2]]).contiguous()
        w[f"{o}experts.{e}.gate_up_b"] = torch.cat([gu_b[e, 0::2], gu_b[e, 1::2]]).float()
        w[f"{o}experts.{e}.down_w"] = down[e].t().contiguous()
        w[f"{o}experts.{e}.down_b"] = down_b[e].float().clone()
    return w


# Tensor name prefixes of a multimodal checkpoint's non-text parts (Gemma 3 4B+).
_OTHER_TOWERS = ("model.vision_tower.", "vision_tower.", "model.multi_modal_projector.",
                 "multi_modal_projector.")
