"""What the replay and cost-prediction tests run and price steps with: a small cyclic
model over ``V`` tokens and a synthetic context-aware cost curve."""

from __future__ import annotations

from typing import Any

import torch
from helpers import successor_model

from recallspec.cost.curve import CostCurve, CostGrid

V = 40


def cycle_model(seed: int) -> Any:
    g = torch.Generator().manual_seed(seed)
    return successor_model(torch.randint(0, V, (V,), generator=g))


def grid_curve(step: float = 1.0, per_row: float = 0.1, per_ctx: float = 0.001) -> CostCurve:
    """A synthetic curve: step + per_row * (rows - 1) + per_ctx * context * rows."""
    rows = (1, 2, 4, 8, 16, 32)
    ctxs = (0, 100, 1000)
    sec = tuple(tuple(step + per_row * (r - 1) + per_ctx * c * r for r in rows) for c in ctxs)
    base = tuple(step + per_row * (r - 1) + per_ctx * 256 * r for r in rows)
    prefill = CostGrid((1, 512), (0, 512), ((0.5, 2.0), (1.0, 3.0)))
    return CostCurve(rows, base, 0.0, "synthetic", CostGrid(rows, ctxs, sec), prefill)
