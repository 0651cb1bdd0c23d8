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
    # gpt-oss (``ModelConfig.attention_sinks`` / ``expert_bias``; else None and empty):
    # each head's sink logit [heads], the router's bias [experts], and each expert's
    # gate-up bias [2 x expert size] (gate first, the rows of its gate-up matrix) and
    # down bias [hidden]; all float32.
    sinks: torch.Tensor | None
    router_b: torch.Tensor | None
    expert_gate_up_b: tuple[torch.Tensor, ...]
    expert_down_b: tuple[torch.Tensor, ...]

    def __init__(self, tensors: Mapping[str, Weight | None],
                 experts: tuple[tuple[Weight, Weight], ...] = (),
                 expert_biases: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()) -> None:
        """``experts``: (gate-up, down) of each expert, in order (empty: a dense MLP);
        ``expert_biases``: their (gate-up, down) biases, in the same order (or empty)."""
        super().__init__()
        for name in (
            "qkv_w", "qkv_b", "o_w", "o_b", "gate_up_w", "down_w", "attn_norm", "ffn_norm",
            "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm", "router_w", "sinks",
            "router_b",
        ):
            t = tensors.get(name)
            if isinstance(t, QuantizedWeight):
                setattr(self, name, t)
            else:
                self.register_buffer(name, t, persistent=True)
        # (Plain tuples: inference only, and a list of buffers would need a name each.)
        self.expert_gate_up = tuple(g for g, _ in experts)
        self.expert_down = tuple(d for _, d in experts)
        if expert_biases and len(expert_biases) != len(experts):
            raise ValueError(f"{len(expert_biases)} expert biases for {len(experts)} experts")
        self.expert_gate_up_b = tuple(g for g, _ in expert_biases)
        self.expert_down_b = tuple(d for _, d in expert_biases)

    def matrices(self) -> list[Weight]:
        """Every matrix and vector of the layer (None ones left out), experts included."""
        names = ("qkv_w", "qkv_b", "o_w", "o_b", "gate_up_w", "down_w", "attn_norm",
                 "ffn_norm", "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm", "router_w",
                 "sinks", "router_b")
        own = [getattr(self, n) for n in names]
        return [w for w in (*own, *self.expert_gate_up, *self.expert_down,
                            *self.expert_gate_up_b, *self.expert_down_b) if w is not None]
