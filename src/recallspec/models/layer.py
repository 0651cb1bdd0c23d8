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
    # A mixture of experts (``ModelConfig.moe``; then gate_up_w and down_w are None): the
    # router [experts, hidden] (a dense float32 matrix, or the file's blocks) and each
    # expert's gate-up and down matrices, by expert index.
    router_w: Weight | None
    expert_gate_up: tuple[Weight, ...]
    expert_down: tuple[Weight, ...]

    def __init__(self, tensors: Mapping[str, Weight | None],
                 experts: tuple[tuple[Weight, Weight], ...] = ()) -> None:
        """``experts``: (gate-up, down) of each expert, in order (empty: a dense MLP)."""
        super().__init__()
        for name in (
            "qkv_w", "qkv_b", "o_w", "o_b", "gate_up_w", "down_w", "attn_norm", "ffn_norm",
            "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm", "router_w",
        ):
            t = tensors.get(name)
            if isinstance(t, QuantizedWeight):
                setattr(self, name, t)
            else:
                self.register_buffer(name, t, persistent=True)
        # (Plain tuples: inference only, and a list of buffers would need a name each.)
        self.expert_gate_up = tuple(g for g, _ in experts)
        self.expert_down = tuple(d for _, d in experts)

    def matrices(self) -> list[Weight]:
        """Every matrix and vector of the layer (None ones left out), experts included."""
        names = ("qkv_w", "qkv_b", "o_w", "o_b", "gate_up_w", "down_w", "attn_norm",
                 "ffn_norm", "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm", "router_w")
        own = [getattr(self, n) for n in names]
        return [w for w in (*own, *self.expert_gate_up, *self.expert_down) if w is not None]
