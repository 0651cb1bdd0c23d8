"""A fake model whose forwards take synthetic time on a fake clock: cost curve
measurements (``cost/calibration.py``) in tests, without waiting."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from helpers import BigramModel

from recallspec.cost import calibration as cc
from recallspec.cost.curve import CostGrid
from recallspec.cost.plan import PROBE_CONTEXT, PROBE_ROWS


class Cost:
    """Seconds of a forward of ``rows`` rows after ``context`` cached tokens: ``first``
    for one row at none, ``row`` per further row, ``ctx`` per cached token for one row,
    ``ctx_row`` per cached token for each further row; ``seq`` per further sequence."""

    def __init__(self, first: float, row: float, ctx: float = 0.0, ctx_row: float = 0.0,
                 seq: float = 0.0) -> None:
        self.first, self.row, self.ctx, self.ctx_row, self.seq = first, row, ctx, ctx_row, seq

    def __call__(self, rows: int, context: float, seqs: int = 1) -> float:
        extra = rows - 1
        return (self.first + self.row * extra + context * (self.ctx + self.ctx_row * extra)
                + self.seq * (seqs - 1))

    def probe(self) -> CostGrid:
        """What ``cost_calibration.probe`` measures of such a model."""
        return CostGrid((1, PROBE_ROWS), (0, PROBE_CONTEXT),
                        tuple(tuple(self(r, c) for r in (1, PROBE_ROWS))
                              for c in (0, PROBE_CONTEXT)))


# Orders of magnitude on 2 cores (issue 37, docs/results/scale/native_spr_nov27/curves):
# SmolLM2-135M, a row ~4 ms, prefill ~1,500 tokens/s; 1.7B, a row ~45 ms, prefill ~145
# tokens/s; 8B, a row ~150 ms, prefill ~32 tokens/s; attention about linear in the context.
SMALL = Cost(0.004, 0.0006, 2e-6, 6e-7, seq=1e-4)
MID = Cost(0.045, 0.0069, 6e-6, 5e-6)
LARGE = Cost(0.15, 0.0315, 1e-5, 8e-6)


class TimedBigram(BigramModel):
    """A bigram model whose every forward advances ``clock`` by ``cost``'s seconds (all
    its rows, their sequences' mean cached tokens, sequences): calibration's timings
    without waiting."""

    def __init__(self, cost: Cost, clock: list[float], table: torch.Tensor | None = None,
                 ) -> None:
        super().__init__(torch.eye(40) if table is None else table, max_position=4096)
        self.cost, self.clock = cost, clock

    def __call__(self, meta: Any, cache: Any) -> torch.Tensor:
        seqs = len(meta.cache_lens)
        self.clock[0] += self.cost(meta.num_tokens, sum(meta.cache_lens) / seqs, seqs)
        return super().__call__(meta, cache)


def fake_clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    clock = [0.0]
    monkeypatch.setattr(cc, "time", SimpleNamespace(perf_counter=lambda: clock[0],
                                                    time=time.time))
    return clock


