"""The weight bytes a decode step reads (``bench/common/decode.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from recallspec.bench.common.decode import quantized_bytes_per_token, weight_bytes_per_token


class Tiny(nn.Module):
    def __init__(self, tied: bool) -> None:
        super().__init__()
        emb = torch.zeros(10, 4)
        self.register_buffer("embed_w", emb)
        self.register_buffer("lm_head_w", emb if tied else torch.zeros(10, 4))
        self.register_buffer("w", torch.zeros(4, 4, dtype=torch.float32))
        self.lin = nn.Linear(4, 3, bias=False)  # a parameter, counted too


def test_weight_bytes_tied_and_untied() -> None:
    other = (16 + 12) * 4
    tied = weight_bytes_per_token(Tiny(True), 10, 4)
    assert tied == {"total": other + 40 * 4 + 4 * 4, "lm_head": 160, "other": other, "tied": 1}
    untied = weight_bytes_per_token(Tiny(False), 10, 4)
    # Untied: the embedding table still costs one row per token, the head is read whole.
    assert untied["total"] == other + 160 + 16 and untied["tied"] == 0


def _mixture(expert_bias: bool) -> SimpleNamespace:
    """A quantized-model stand-in: 2 layers of 4 experts (2 a token), each expert's
    matrices 100 + 60 bytes, its biases (gpt-oss) 6 + 4 floats; a 40-byte attention."""
    def w(nbytes: int) -> SimpleNamespace:
        return SimpleNamespace(nbytes=nbytes)

    def layer() -> SimpleNamespace:
        bias = (lambda n: torch.zeros(n)) if expert_bias else None
        return SimpleNamespace(
            expert_gate_up=tuple(w(100) for _ in range(4)),
            expert_down=tuple(w(60) for _ in range(4)),
            expert_gate_up_b=tuple(bias(6) for _ in range(4)) if bias else (),
            expert_down_b=tuple(bias(4) for _ in range(4)) if bias else ())

    layers = [layer(), layer()]
    experts = 2 * 4 * (160 + (40 if expert_bias else 0))
    embed = SimpleNamespace(nbytes=320, n=10)
    head = SimpleNamespace(nbytes=320)
    resident = experts + 2 * 40 + embed.nbytes + head.nbytes
    return SimpleNamespace(
        weight_bytes=lambda: resident, embed_w=embed, lm_head_w=head, layers=layers,
        config=SimpleNamespace(moe=True, experts_per_token=2, num_experts=4))


def test_a_mixture_token_reads_its_routed_experts_and_their_biases() -> None:
    """A token reads experts_per_token of num_experts experts: their matrices and, for
    gpt-oss, their biases; never every expert's biases."""
    for bias, per_expert in ((False, 160), (True, 200)):
        wb = quantized_bytes_per_token(_mixture(bias))
        assert wb["experts"] == 2 * 4 * per_expert
        assert wb["experts_read"] == 2 * 2 * per_expert
        assert wb["other"] == 2 * 40 + wb["experts_read"]
        assert wb["total"] == wb["other"] + 320 + 32 and wb["tied"] == 0
