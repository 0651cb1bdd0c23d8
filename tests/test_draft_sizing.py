"""Cost-aware draft sizing: the greedy prefix scan is the exact optimum; the online
acceptance estimate tracks what it sees; the cost curve interpolates and round-trips."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from recallspec.runtime.cost_curve import CostCurve
from recallspec.spec.draft_sizing import AcceptanceStats, choose_draft_sizes


def _value(sizes: list[int], gains: list[np.ndarray], cost: CostCurve, base: int) -> float:
    toks = len(gains) + sum(
        float(np.minimum.accumulate(g)[:k].sum()) for g, k in zip(gains, sizes, strict=True)
    )
    return toks / cost(base + sum(sizes), len(gains))


@pytest.mark.parametrize("seed", range(30))
def test_choice_is_the_brute_force_optimum(seed: int) -> None:
    rng = random.Random(seed)
    # A bumpy curve like MKL's (2-3 rows dearer than 4).
    ks = (1, 2, 3, 4, 6, 8, 16, 32)
    base_s = [1.0, 1.3, 1.25, 1.05, 1.2, 1.3, 1.9, 3.2]
    curve = CostCurve(ks, tuple(b * rng.uniform(0.9, 1.1) for b in base_s), rng.uniform(0, 0.05))
    nseq = rng.randint(1, 3)
    gains = [np.sort(np.array([rng.random() for _ in range(rng.randint(0, 5))]))[::-1]
             for _ in range(nseq)]
    sizes = choose_draft_sizes(gains, curve, base_rows=nseq)
    best = max(
        _value(list(c), gains, curve, nseq)
        for c in itertools.product(*[range(len(g) + 1) for g in gains])
    )
    assert _value(sizes, gains, curve, nseq) == pytest.approx(best, rel=1e-9)
    assert all(0 <= k <= len(g) for k, g in zip(sizes, gains, strict=True))


def test_useless_drafts_are_dropped_and_free_ones_kept() -> None:
    flat = CostCurve((1, 64), (1.0, 1.0), 0.0)  # rows cost nothing: draft everything useful
    steep = CostCurve((1, 2), (1.0, 2.0), 0.0)  # every row costs a whole step
    g = [np.array([0.9, 0.5, 0.1]), np.array([0.2])]
    assert choose_draft_sizes(g, flat, base_rows=2) == [3, 1]
    assert choose_draft_sizes(g, steep, base_rows=2) == [0, 0]
    assert choose_draft_sizes([np.zeros(4)], flat, base_rows=1) == [0]


def test_acceptance_stats() -> None:
    st = AcceptanceStats(4, decay=1.0)
    for _ in range(10):
        st.update(3, [0, 1])
    r = st.rates()
    assert r[:3].tolist() == [1.0, 1.0, 0.0] and r[3] == 0.5  # never drafted: default
    prior = AcceptanceStats(4, decay=1.0)
    prior.update(4, [0, 1, 2, 3])
    fresh = AcceptanceStats(4)
    assert fresh.rates(prior.rates()).tolist() == [1.0] * 4  # a new request starts from the prior


def test_cost_curve_interpolates_and_round_trips() -> None:
    c = CostCurve((1, 4, 8), (1.0, 2.0, 4.0), 0.5, "k")
    assert c(1) == 1.0 and c(2) == pytest.approx(1 + 1 / 3) and c(6) == 3.0
    assert c(12) == 6.0  # extrapolates the last segment
    assert c(4, 3) == 3.0
    assert CostCurve.from_json(c.to_json()) == c
    with pytest.raises(ValueError):
        CostCurve((2, 1), (1.0, 1.0), 0.0)
