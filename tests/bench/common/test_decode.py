"""The weight bytes a decode step reads (``bench/common/decode.py``)."""

from __future__ import annotations

import torch
from torch import nn

from recallspec.bench.common.decode import weight_bytes_per_token


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
