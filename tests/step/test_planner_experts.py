"""The planner prices a mixture of experts' drafts at the routing its forwards show
(``DraftPlanner(experts=...)``, ``observe_experts``): where draft rows wake fresh experts
and experts are dear it drafts fewer rows (probes only) than where they share the
experts of the row before; where the forwards route as the calibration did, and for a
dense model, the plans are exactly the measured curve's."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from helpers.step_seq import Seq

from recallspec.cost.curve import CostCurve
from recallspec.cost.experts import ExpertShape, RoutingEstimate
from recallspec.decoding.tree import DraftTree
from recallspec.drafters import Drafter
from recallspec.step.planner import DraftPlanner

# 8 layers of 64 experts, 4 a row; one expert of one layer is 8% of a one-row forward:
# each extra expert a layer costs 0.64 s beside a 1 s forward whose rows cost 20 ms. (A
# forward of seconds: the drafter's proposals, microseconds, stay far below the share of
# it that makes the planner size a drafter before it proposes, on any machine load.)
SHAPE = ExpertShape(experts=64, experts_used=4, layers=8, expert_share=0.08)
KS = (1, 2, 4, 8, 16, 32)
# The calibration's random tokens woke half-way between one row's experts and uniform.
COUNTS = tuple((k, 4 + 0.5 * (SHAPE.uniform(k) - 4)) for k in KS)
ROOM = 16


class Chain(Drafter):
    name = "chain"

    def start(self, rid: int, prompt: Sequence[int]) -> None: ...

    def propose(self, rid: int, max_nodes: int) -> DraftTree:
        return DraftTree.chain(list(range(1, max_nodes + 1)))

    def observe(self, *a: Any) -> None: ...

    def stop(self, rid: int) -> None: ...


def _curve(counted: bool = True) -> CostCurve:
    return CostCurve(KS, tuple(1.0 + 0.02 * (k - 1) for k in KS), 0.05, "t",
                     experts=COUNTS if counted else None)


def _run(planner: DraftPlanner, woken: Callable[[int], float] | None, steps: int,
         seed: int = 0) -> list[int]:
    """Each step's draft size; each draft node accepted with probability 0.8 given its
    parent, the forward of its rows waking ``woken(rows)`` experts a layer (None: no
    counts fed)."""
    rng = random.Random(seed)
    seq = Seq(Chain(), cached_length=200)
    sizes = []
    for _ in range(steps):
        trees, failed = planner.plan([seq], [ROOM])
        assert not failed
        tree = trees[0]
        sizes.append(len(tree))
        accepted: list[int] = []
        while len(accepted) < len(tree) and rng.random() < 0.8:
            accepted.append(len(accepted))
        planner.observe(seq, tree, accepted)
        if woken is not None:
            planner.observe_experts(1 + len(tree), woken(1 + len(tree)))
    return sizes


def test_uniform_routing_on_dear_experts_drafts_fewer_rows_than_full_overlap() -> None:
    curve = _curve()
    uniform = _run(DraftPlanner(ROOM, lambda: curve, SHAPE), SHAPE.uniform, 300)
    full = _run(DraftPlanner(ROOM, lambda: curve, SHAPE), lambda k: 4.0, 300)
    # Full overlap: extra rows wake no expert beyond the first row's, so they cost
    # less than the calibration's (no less than one row).
    assert min(full[50:]) >= 8
    # Uniform: each extra row's fresh experts cost more than its tokens bring; once the
    # estimate has learned that, only the probes draft (a node each).
    assert max(uniform[100:]) <= 1
    assert sum(uniform) < sum(full) / 4
    # The measured curve alone (its calibration's routing) drafts in between.
    measured = _run(DraftPlanner(ROOM, lambda: curve, SHAPE), None, 300)
    assert sum(uniform) < sum(measured) <= sum(full)


def test_routing_as_calibrated_and_dense_models_plan_as_the_measured_curve() -> None:
    curve, bare = _curve(), _curve(counted=False)
    cal = RoutingEstimate(SHAPE, COUNTS).calibrated
    want = _run(DraftPlanner(ROOM, lambda: bare), None, 200)
    assert 0 < sum(want) < ROOM * 200  # (the sizing decides: not all or nothing)
    # A mixture whose forwards wake the calibration's experts: the same plans.
    assert _run(DraftPlanner(ROOM, lambda: curve, SHAPE), cal, 200) == want
    # A dense model's planner ignores expert counts; a curve without counts is priced
    # as measured.
    assert _run(DraftPlanner(ROOM, lambda: bare), SHAPE.uniform, 200) == want
    assert _run(DraftPlanner(ROOM, lambda: bare, SHAPE), SHAPE.uniform, 200) == want
