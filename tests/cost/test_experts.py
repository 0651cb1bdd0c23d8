"""A mixture of experts' pricing (cost/experts.py, cost/expert_counts.py): the routing
estimate learned from forwards stays between its bounds and converges to what the
forwards show; the curve re-priced at it rises in rows, never falls below a one-row
forward, is the measured curve where the forwards route as the calibration did, and is
dearer where they route uniformly. Fake curves and models: nothing is loaded."""

from __future__ import annotations

import json
import random
from itertools import pairwise
from types import SimpleNamespace
from typing import Any

import pytest

from recallspec.cost.curve import CostCurve, CostGrid
from recallspec.cost.expert_counts import WokenExperts, expert_shape
from recallspec.cost.experts import (
    REPRICE_MOVE,
    ExpertPricing,
    ExpertShape,
    RoutingEstimate,
    reprice,
)

SHAPE = ExpertShape(experts=64, experts_used=4, layers=4, expert_share=0.02)
KS = (1, 2, 4, 8, 16)


def _calibrated(share: float = 0.9) -> tuple[tuple[int, float], ...]:
    """Counts of a random-token calibration: ``share`` of the way from K to uniform."""
    k_used = SHAPE.experts_used
    return tuple((k, k_used + share * (SHAPE.uniform(k) - k_used)) for k in KS)


def _curve(experts: tuple[tuple[int, float], ...] | None = None) -> CostCurve:
    seconds = (0.010, 0.012, 0.015, 0.020, 0.030)
    decode = CostGrid(KS, (128, 512), (seconds, tuple(1.1 * t for t in seconds)))
    prefill = CostGrid((128,), (0,), ((0.5,),))
    return CostCurve(KS, seconds, 0.001, "t", decode, prefill,
                     _calibrated() if experts is None else experts)


def _rising(curve: CostCurve) -> bool:
    rows = [curve.seconds, *(curve.decode.seconds if curve.decode else ())]
    return all(b >= a >= times[0] for times in rows for a, b in pairwise(times))


def test_the_shape_bounds() -> None:
    assert SHAPE.uniform(1) == pytest.approx(4.0) and SHAPE.most(1) == 4.0
    for k in (2, 5, 16, 100):
        assert 4.0 < SHAPE.uniform(k) <= SHAPE.most(k) <= 64
    assert SHAPE.most(100) == 64
    with pytest.raises(ValueError, match="experts_used"):
        ExpertShape(4, 8, 2, 0.1)
    with pytest.raises(ValueError, match="share"):
        ExpertShape(8, 2, 2, 1.5)


def test_the_estimate_starts_at_the_calibration_and_converges_to_the_forwards() -> None:
    cal = dict(_calibrated())
    r = RoutingEstimate(SHAPE, tuple(cal.items()))
    assert r.position == 0.0
    for k in KS:
        assert r.calibrated(k) == pytest.approx(cal[k]) == pytest.approx(r.estimate(k))
    # Between and past the counted sizes: the calibration's share of uniform.
    assert cal[4] < r.calibrated(6) < cal[8] and r.calibrated(1) == 4.0
    assert r.calibrated(40) == pytest.approx(4 + 0.9 * (SHAPE.uniform(40) - 4))
    # A workload with locality: the forwards of 4 rows wake 7 experts a layer.
    for _ in range(1000):
        r.observe(4, 7.0)
    assert r.estimate(4) == pytest.approx(7.0, abs=1e-3)
    assert r.forwards == 1000
    # Then uniform routing, at a few sizes: every size follows, those not seen too.
    for _ in range(1000):
        for k in (2, 3, 8):
            r.observe(k, SHAPE.uniform(k))
    assert r.position == pytest.approx(1.0, abs=1e-3)
    for k in (2, 5, 16, 40):
        assert r.estimate(k) == pytest.approx(SHAPE.uniform(k), rel=1e-3)
    # Then full overlap: every size wakes one row's experts.
    for _ in range(2000):
        r.observe(6, 4.0)
    assert r.position == pytest.approx(-1.0, abs=1e-3)
    assert all(r.estimate(k) == pytest.approx(4.0, abs=1e-2) for k in (2, 16, 40))


def test_the_estimate_stays_within_its_bounds() -> None:
    rng = random.Random(0)
    r = RoutingEstimate(SHAPE, _calibrated(0.3))
    r.observe(1, 50.0)  # one row: no information about overlap
    assert (r.position, r.forwards) == (0.0, 0)
    for _ in range(500):
        r.observe(rng.randint(1, 80), rng.uniform(0.0, 2.0 * SHAPE.experts))
        assert -1.0 <= r.position <= 2.0
        for k in (1, 2, 3, 5, 8, 13, 64, 200):
            assert SHAPE.experts_used - 1e-9 <= r.estimate(k) <= SHAPE.most(k) + 1e-9
    # More than uniform (every row fresh experts) is reachable, and bounded.
    for _ in range(2000):
        r.observe(8, 32.0)
    assert r.estimate(8) == pytest.approx(32.0, abs=1e-2) and r.position > 1.0
    assert r.estimate(200) <= 64.0


def test_repricing_rises_in_rows_and_keeps_the_one_row_floor() -> None:
    c = _curve()
    same = reprice(c, lambda k: 0.0, 1e-3, 4, "x")
    assert (same.seconds, same.decode, same.prefill) == (c.seconds, c.decode, c.prefill)
    rng = random.Random(1)
    for _ in range(50):
        extra = {k: rng.uniform(-20.0, 20.0) for k in KS}
        p = reprice(c, extra.__getitem__, rng.uniform(0.0, 1e-3), 4, "x")
        assert _rising(p) and p.prefill == c.prefill and p.key == "t:x"
        assert p.seconds[0] >= c.seconds[0] - 1e-15
        assert p.experts is None  # (no measurement: never re-priced again)
    with pytest.raises(ValueError, match="expert_s"):
        reprice(c, lambda k: 0.0, -1.0, 4, "x")


def test_pricing_follows_the_routing_the_forwards_show() -> None:
    c = _curve()
    cal = dict(_calibrated())
    p = ExpertPricing(SHAPE)
    assert p.curve(c) is c  # nothing seen: the measured curve
    for _ in range(300):  # forwards that route as the calibration's did
        for k in (2, 4, 8):
            p.observe(k, cal[k])
    assert p.curve(c) is c
    uniform = ExpertPricing(SHAPE)
    full = ExpertPricing(SHAPE)
    uniform.curve(c), full.curve(c)
    for _ in range(300):
        for k in (2, 4, 8):
            uniform.observe(k, SHAPE.uniform(k))
            full.observe(k, 4.0)
    dear, cheap = uniform.curve(c), full.curve(c)
    assert dear(1) == c(1) == cheap(1)
    for k in (2, 4, 8, 16):
        # Per extra expert a layer: layers x share x the one-row forward.
        want = c(k) + 4 * (SHAPE.uniform(k) - cal[k]) * 0.02 * c(1)
        assert dear(k) == pytest.approx(want, rel=1e-3) and dear(k) > c(k)
        assert dear(k, 2, context=512) > c(k, 2, context=512)
        assert c(1) <= cheap(k) < c(k)
    assert _rising(dear) and _rising(cheap)
    # Kept until the estimate moves by more than REPRICE_MOVE.
    uniform.observe(4, SHAPE.uniform(4))
    assert uniform.curve(c) is dear
    routing = uniform.routing
    assert routing is not None and abs(routing.position - 1.0) < REPRICE_MOVE
    # A curve without counts (a prior) is priced as it is.
    bare = CostCurve(KS, c.seconds, 0.0)
    assert uniform.curve(bare) is bare and uniform.routing is None
    uniform.observe(4, SHAPE.uniform(4))
    assert uniform.curve(bare) is bare


def test_a_curves_expert_counts_round_trip() -> None:
    c = _curve()
    assert CostCurve.from_json(json.loads(json.dumps(c.to_json()))) == c
    old = c.to_json()
    del old["experts"]  # a curve written before they were counted
    assert CostCurve.from_json(old).experts is None
    with pytest.raises(ValueError, match="expert counts"):
        CostCurve(KS, c.seconds, 0.0, experts=((2, 5.0), (1, 4.0)))


class FakeNative:
    """The native forward's counters: each ``forward`` of T rows routes T rows in each
    layer it runs and runs ``woken`` experts a layer, its own counts kept as the last
    call's (with profiling off: the forward counts them always)."""

    def __init__(self, layers: int) -> None:
        self.layers = layers
        self.last = (0, 0)

    def last_experts(self) -> tuple[int, int]:
        return self.last

    def forward(self, rows: int, woken: int, layers: int | None = None) -> None:
        n = self.layers if layers is None else layers
        self.last = (woken * n, rows * n)


def _fake_model(moe: bool = True, native: bool = True, tied: bool = False) -> Any:
    def w(n: int) -> SimpleNamespace:
        return SimpleNamespace(nbytes=n)

    layers = [SimpleNamespace(expert_gate_up=tuple(w(100) for _ in range(8)),
                              expert_down=tuple(w(50) for _ in range(8)),
                              expert_gate_up_b=(), expert_down_b=()) for _ in range(2)]
    embed = w(1000)
    head = embed if tied else w(500)
    resident = 2400 + 600 + head.nbytes + (0 if tied else embed.nbytes)  # experts, shared
    return SimpleNamespace(
        config=SimpleNamespace(moe=moe, num_experts=8, experts_per_token=2, num_layers=2),
        native=FakeNative(2) if native else None, layers=layers, embed_w=embed,
        lm_head_w=head, weight_bytes=lambda: resident)


def test_the_shape_is_read_from_the_models_weights() -> None:
    s = expert_shape(_fake_model())
    # A token reads the shared 600, the head 500 and 2 of 8 experts (600 of 2400).
    assert s == ExpertShape(8, 2, 2, 150 / 1700)
    tied = expert_shape(_fake_model(tied=True))  # the table is the head: read whole
    assert tied is not None and tied.expert_share == pytest.approx(150 / 2200)
    assert expert_shape(_fake_model(moe=False)) is None
    assert expert_shape(_fake_model(native=False)) is None
    assert WokenExperts.of(_fake_model(moe=False)) is None


def test_the_counter_reads_the_last_forward() -> None:
    model = _fake_model()
    native = model.native
    counter = WokenExperts.of(model)
    assert counter is not None
    assert counter.last(3) is None  # no forward yet
    native.forward(3, 5)
    assert counter.last(3) == 5.0
    assert counter.last(3) == 5.0  # (a reading changes nothing)
    native.forward(3, 5)
    native.forward(3, 2, layers=1)  # a self-draft's forward (its first layer) ran last
    assert counter.last(3) is None
    native.forward(4, 6)
    assert counter.last(3) is None  # not the forward of these rows
    assert counter.last(4) == 6.0
    assert counter.last(0) is None
