"""A mixture of experts' verification curve re-priced at a routing bound
(``bench/scale/moe.py``): each forward plus or minus the streaming of the experts between
the counted and the bound's, never cheaper than a smaller forward."""

from __future__ import annotations

import pytest

from recallspec.bench.scale.moe import bound_curve, bound_experts, expert_seconds, repriced_curve
from recallspec.cost.curve import CostCurve, CostGrid

KS = (1, 2, 4, 8)


def _curve() -> CostCurve:
    decode = CostGrid(KS, (128, 512), ((0.010, 0.014, 0.020, 0.030),
                                       (0.011, 0.015, 0.022, 0.033)))
    prefill = CostGrid((128,), (0,), ((0.5,),))
    return CostCurve(KS, (0.010, 0.014, 0.020, 0.030), 0.0, "t", decode, prefill)


def _ours(touched: dict[str, float]) -> dict[str, object]:
    # 4 layers of 16 experts, 2 a row; each expert 1 MB, decode at 4 GB/s: 0.25 ms each.
    return {"experts": 16, "experts_used": 2, "experts_touched": touched,
            "experts_uniform": {str(k): 16 * (1 - (1 - 2 / 16) ** k) for k in KS},
            "weight_bytes": {"experts": 4 * 16 * 1_000_000}, "achieved_gb_s": 4.0}


def test_repricing_adds_or_removes_the_experts_streaming() -> None:
    touched = {"1": 2.0, "2": 3.5, "4": 6.0, "8": 9.0}
    c = _curve()
    full = bound_curve(c, _ours(touched), 4, "full-overlap")
    es = 0.25e-3
    want = (0.010, 0.014 - 4 * 1.5 * es, 0.020 - 4 * 4 * es, 0.030 - 4 * 7 * es)
    assert full.seconds == pytest.approx(want)
    assert full.decode is not None and full.decode.seconds[1] == pytest.approx(
        (0.011, 0.015 - 4 * 1.5 * es, 0.022 - 4 * 4 * es, 0.033 - 4 * 7 * es))
    assert full.prefill == c.prefill and full.key == "t:full-overlap"
    uniform = bound_curve(c, _ours(touched), 4, "uniform")
    u = _ours(touched)["experts_uniform"]
    assert isinstance(u, dict)
    assert uniform.seconds == pytest.approx(
        tuple(t + 4 * (u[str(k)] - touched[str(k)]) * es
              for k, t in zip(KS, c.seconds, strict=True)))
    assert uniform(8) > c(8) > full(8)
    # Never below a smaller forward, nor below the smallest measured one.
    steep = repriced_curve(c, touched, bound_experts("full-overlap", _ours(touched)), 4,
                           5e-3, "x")
    assert steep.seconds == (0.010,) * 4


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match=r"k = \[8\]"):
        repriced_curve(_curve(), {"1": 2.0, "2": 3.0, "4": 5.0}, {k: 2.0 for k in "1248"},
                       4, 1e-4, "x")
    with pytest.raises(ValueError, match="unknown routing bound"):
        bound_experts("some", _ours({}))


def test_expert_seconds_from_the_run() -> None:
    assert expert_seconds(_ours({}), 4) == pytest.approx(1e6 / 4e9)
