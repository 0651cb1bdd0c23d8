"""The weights of one decoder layer, as ``CausalLM`` and the native forward read them."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from recallspec.kernels.qlinear import QuantizedWeight

__all__ = ["DecoderLayer", "Weight"]

# A matrix: dense [out, in] or the GGUF's own blocks.
Weight = torch.Tensor | QuantizedWeight


class DecoderLayer(nn.Module):
    """Weights of one layer (buffers, not parameters: inference only; quantized matrices
    are plain attributes)."""

    qkv_w: Weight
    qkv_b: torch.Tensor | None
    o_w: Weight
    o_b: torch.Tensor | None
    gate_up_w: Weight
    down_w: Weight
    attn_norm: torch.Tensor
    ffn_norm: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    post_attn_norm: torch.Tensor | None
    post_ffn_norm: torch.Tensor | None

    def __init__(self, tensors: Mapping[str, Weight | None]) -> None:
        super().__init__()
        for name in (
            "qkv_w", "qkv_b", "o_w", "o_b", "gate_up_w", "down_w", "attn_norm", "ffn_norm",
            "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm",
        ):
            t = tensors.get(name)
            if isinstance(t, QuantizedWeight):
                setattr(self, name, t)
            else:
                self.register_buffer(name, t, persistent=True)
