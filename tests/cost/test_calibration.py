"""The cost curve's measurement within a time budget (cost/plan.py and
cost/calibration.py): the plan chosen from a probe's prices, and a calibration
end to end on a fake model whose forwards take synthetic time on a fake clock."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import needs_model
from helpers.calibration import LARGE, MID, SMALL, Cost, TimedBigram, fake_clock
from helpers.routed import RoutedTimedBigram, woken

from recallspec.cost import calibration as cc
from recallspec.cost.cache import grid_agrees
from recallspec.cost.curve import REFERENCE_CONTEXT
from recallspec.cost.plan import (
    CALIBRATION_BUDGET_S,
    COUNTED_ROWS,
    DEFAULT_SIZES,
    GRID_CONTEXTS,
    GRID_SIZES,
    PREFILL_SIZES,
    PREFILL_STARTS,
    REQUIRED_ROWS,
    CalibrationPlan,
    full_plan,
    ladder,
    plan_calibration,
    plan_seconds,
)
from recallspec.cost.sizing import choose_draft_sizes


def keeps_the_required_points(plan: CalibrationPlan) -> bool:
    """The module's invariant: the draft sizes and 32 rows at >= 2 contexts (128 among
    them), reference sizes 1, 2, 4, 8, 16 and 64, >= 2 prefill sizes at >= 2 starts."""
    return ({*REQUIRED_ROWS, 32} <= set(plan.grid_sizes) and len(plan.grid_contexts) >= 2
            and 128 in plan.grid_contexts and {1, 2, 4, 8, 16, 64} <= set(plan.sizes)
            and len(plan.prefill_sizes) >= 2 and len(plan.prefill_starts) >= 2)


def test_the_full_plan_is_the_measurement_as_before_and_kept_when_it_fits() -> None:
    full = full_plan()
    assert (full.sizes, full.repeats, full.warmup, full.fed) == (DEFAULT_SIZES, 3, 1, True)
    assert (full.grid_sizes, full.grid_contexts, full.grid_repeats) == (GRID_SIZES,
                                                                         GRID_CONTEXTS, 7)
    assert (full.prefill_sizes, full.prefill_starts) == (PREFILL_SIZES, PREFILL_STARTS)
    # SmolLM2-135M-like costs: the full plan, about the ~25 s it takes.
    assert plan_calibration(SMALL.probe()) == full
    assert 15 < plan_seconds(full, SMALL.probe()) < 45
    assert plan_calibration(LARGE.probe(), None) == full  # no budget: no thinning
    assert plan_calibration(SMALL.probe(), 5.0) == full  # small models keep theirs


@pytest.mark.parametrize("cost", [MID, LARGE], ids=["1.7B", "8B"])
def test_a_slow_model_gets_a_thinned_plan_within_the_budget(cost: Cost) -> None:
    probe = cost.probe()
    full = full_plan()
    assert plan_seconds(full, probe) > 200  # minutes: 305 s measured at 1.7B
    plan = plan_calibration(probe)
    assert plan != full and not plan.fed
    assert plan_seconds(plan, probe) <= CALIBRATION_BUDGET_S
    assert keeps_the_required_points(plan)
    # The richest rung that fits: the one before it misses the budget.
    rungs = ladder(full)
    i = rungs.index(plan)
    assert i == len(rungs) - 1 or plan_seconds(rungs[i - 1], probe) > CALIBRATION_BUDGET_S


def test_every_rung_thins_and_keeps_the_required_points() -> None:
    for full in (full_plan(), full_plan(contexts=False)):
        rungs = ladder(full)
        assert len(set(rungs)) == len(rungs)  # each rung changes something
        for cost in (SMALL, MID, LARGE):
            t = [plan_seconds(p, cost.probe()) for p in rungs]
            assert all(b <= a for a, b in pairwise(t)), t
        for p in rungs[1:]:
            if full.grid_contexts:
                assert keeps_the_required_points(p)
            else:
                assert not p.grid_contexts and not p.prefill_starts
                assert {*REQUIRED_ROWS, 64} <= set(p.sizes)
    with pytest.raises(ValueError):
        CalibrationPlan(sizes=(2, 4))
    with pytest.raises(ValueError):
        CalibrationPlan(grid_contexts=(512, 128))


# ---- a calibration on a fake clock -----------------------------------------------------


@pytest.mark.parametrize("cost", [SMALL, LARGE], ids=["135M", "8B"])
def test_calibration_measures_the_planned_points_in_the_estimated_time(
    cost: Cost, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """The probe prices the model right, the plan's estimate is what measuring it takes,
    its points are the curve's, and long measurements report progress."""
    clock = fake_clock(monkeypatch)
    model = TimedBigram(cost, clock)
    said: list[str] = []
    path = tmp_path / "curve.json"
    curve = cc.calibrate(model, 1, key="k", cache_path=path, say=said.append,
                         busy=lambda: False)
    plan = plan_calibration(cost.probe())
    prices, tile = cc.probe(model, 1)
    assert np.allclose(prices.seconds, cost.probe().seconds)
    before = clock[0]
    again = cc.measure(model, 1, plan, tile=tile)
    # (The estimate prices the per-sequence batch as a chain of as many rows.)
    assert clock[0] - before == pytest.approx(plan_seconds(plan, prices), rel=0.01)
    assert np.allclose(again.seconds, curve.seconds) and again.tokens == curve.tokens
    assert path.is_file() and grid_agrees(curve)
    assert curve.tokens == plan.sizes
    assert curve.seconds == pytest.approx([cost(n, 256) for n in plan.sizes])
    assert curve.decode is not None and curve.prefill is not None
    assert (curve.decode.rows, curve.decode.contexts) == (plan.grid_sizes, plan.grid_contexts)
    assert (curve.prefill.rows, curve.prefill.contexts) == (plan.prefill_sizes,
                                                            plan.prefill_starts)
    assert curve.per_seq == pytest.approx(cost.seq)
    assert f"about {np.ceil(plan_seconds(plan, cost.probe())):.0f} s" in said[0]
    if cost is LARGE:
        assert "thinned" in said[0] and any("% measured" in s for s in said[1:])
    else:
        assert "thinned" not in said[0]


def test_a_mixtures_calibration_counts_its_experts_in_the_estimated_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A mixture of experts' measurement also counts the experts its reference chains
    wake (one untimed forward a size up to COUNTED_ROWS, after a context of its own):
    the plan's estimate prices those forwards too, and is what measuring takes; each
    count is the distinct experts the chain's tokens chose (the fake routes by token)."""
    clock = fake_clock(monkeypatch)
    model = RoutedTimedBigram(SMALL, clock)
    said: list[str] = []
    curve = cc.calibrate(model, 1, key="k", say=said.append, busy=lambda: False)
    probe = SMALL.probe()
    plan = plan_calibration(probe, experts=True)
    assert plan == plan_calibration(probe)  # (a small model's full plan either way)
    with_counts = plan_seconds(plan, probe, experts=True)
    assert with_counts > plan_seconds(plan, probe)
    assert f"about {np.ceil(with_counts):.0f} s" in said[0]
    prices, tile = cc.probe(model, 1)
    before = clock[0]
    again = cc.measure(model, 1, plan, tile=tile)
    assert clock[0] - before == pytest.approx(plan_seconds(plan, prices, experts=True),
                                              rel=0.01)
    counted = [k for k in plan.sizes if k <= COUNTED_ROWS]
    ids = cc.random_ids(model, REFERENCE_CONTEXT + max(plan.sizes))  # (the chains' tokens)
    want = tuple((k, float(woken(ids[REFERENCE_CONTEXT : REFERENCE_CONTEXT + k])))
                 for k in counted)
    assert curve.experts == again.experts == want
    # Several chains a size: their mean (chain s of k rows after the first s k).
    ids = cc.random_ids(model, 64 + 8 * 3)
    assert cc.expert_counts(model, 1, (1, 8), cached=64, samples=3) == tuple(
        (k, sum(woken(ids[64 + s * k : 64 + (s + 1) * k]) for s in range(3)) / 3)
        for k in (1, 8))


def test_a_thinned_curve_prices_like_the_full_one_and_sizes_drafts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The 8B's thinned curve prices the draft sizes it measured at any context as the
    model costs them (contexts past 2,048 extrapolated), and every row count (past its
    grid and its largest size: extrapolated) about as the full curve does, never less
    for more rows; the draft sizing drafts good nodes and drops useless ones with it."""
    clock = fake_clock(monkeypatch)
    thin = cc.calibrate(TimedBigram(LARGE, clock), 1, busy=lambda: False)
    full = cc.calibrate(TimedBigram(LARGE, clock), 1, busy=lambda: False, budget_s=None)
    assert len(thin.tokens) < len(full.tokens) and thin.decode is not None
    rows = np.arange(1, 700, dtype=np.float64)
    top = thin.decode.rows[-1]
    for context in (0, 300, 1500, 4000):
        costs = thin.costs(rows, 1, context)
        assert np.all(np.diff(costs) >= -1e-12)
        assert np.allclose(costs, [thin(int(r), 1, context) for r in rows])
        assert np.allclose(costs[:top], [LARGE(int(r), context) for r in rows[:top]])
        # Past its grid (32 rows, the full one 64) a curve prices the extra rows at the
        # reference context (256): near it, the two agree.
        if context <= 300:
            assert np.allclose(costs, full.costs(rows, 1, context), rtol=0.05), context
    for n, start in ((32, 0), (512, 1536), (300, 700)):
        assert thin.prefill_cost(n, start) == pytest.approx(LARGE(n, start))
    good, poor = [np.array([0.9, 0.85, 0.8])], [np.array([0.02, 0.01])]
    for context in (200, 3000):
        price = lambda rows, seqs, c=context: thin(rows, seqs, c)  # noqa: E731
        assert choose_draft_sizes(good, price, base_rows=1) == [3]
        assert choose_draft_sizes(poor, price, base_rows=1) == [0]


@needs_model
def test_a_thinned_plan_runs_on_the_real_model(engine: Any) -> None:
    """The native forward over contexts tiled from the probe's keys and values (a cache
    the model never fed): every point is measured, the curve is well formed. (A second or
    two; no timing is asserted: the machine may be busy.)"""
    model = engine.model
    prices, tile = cc.probe(model, engine.threads)
    assert all(s > 0 for row in prices.seconds for s in row)
    plan = CalibrationPlan(sizes=(1, 2, 64), repeats=1, grid_sizes=(1, 4), grid_contexts=(128, 700),
                           grid_repeats=1, prefill_sizes=(8, 32), prefill_starts=(0, 300),
                           warmup=0, fed=False)
    curve = cc.measure(model, engine.threads, plan, tile=tile)
    assert curve.tokens == plan.sizes and curve.decode is not None and curve.prefill is not None
    assert curve.decode.contexts == plan.grid_contexts
    assert curve.prefill.contexts == plan.prefill_starts
    assert all(b >= a > 0 for a, b in pairwise(curve.seconds))  # (monotone_in_rows)
    assert np.isfinite(curve.costs(np.arange(1.0, 600.0), 2, 2000)).all()
