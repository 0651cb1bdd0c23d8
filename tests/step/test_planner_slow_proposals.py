"""The planner sizes slow proposers before they propose: idle requests of a drafter
whose proposals are slow propose only to probe."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from helpers.step_seq import Seq

from recallspec.cost.curve import CostCurve
from recallspec.decoding.tree import DraftTree
from recallspec.drafters import Drafter
from recallspec.step.planner import PROBE_EVERY, DraftPlanner


class Slow(Drafter):
    """Proposes a chain that is never accepted, taking ``seconds`` per proposal."""

    name = "slow"

    def __init__(self, seconds: float) -> None:
        self.seconds, self.calls = seconds, 0

    def start(self, rid: int, prompt: Sequence[int]) -> None: ...

    def propose(self, rid: int, max_nodes: int) -> DraftTree:
        self.calls += 1
        time.sleep(self.seconds)
        return DraftTree.chain([1, 2, 3][:max_nodes])

    def observe(self, *a: Any) -> None: ...

    def stop(self, rid: int) -> None: ...


def _run(seconds: float, steps: int, accepted: bool = False) -> tuple[int, int]:
    """(proposals, drafted steps) of a request whose drafts are always rejected (or
    always accepted)."""
    # A 1-row forward of 0.5 s: "slow" starts at 2% of it, 10 ms, far above what a
    # proposal that does not sleep takes even on a loaded machine (at a 10 ms forward the
    # 0.2 ms threshold was crossed by the first call's overhead under load: a flake).
    curve = CostCurve((1, 4), (0.5, 1.0), 0.0)
    d = Slow(seconds)
    planner = DraftPlanner(16, lambda: curve)
    seq = Seq(d)
    drafted = 0
    for _ in range(steps):
        trees, failed = planner.plan([seq], [16])
        assert not failed
        drafted += bool(len(trees[0]))
        planner.observe(seq, trees[0], list(range(len(trees[0]))) if accepted else [])
    return d.calls, drafted


def test_idle_requests_of_slow_drafters_propose_only_to_probe() -> None:
    fast_calls, fast_drafted = _run(0.0, 60)
    slow_calls, slow_drafted = _run(0.1, 60)  # 20% of a forward per proposal
    assert fast_calls == 60  # cheap proposals: every step, as before
    # Slow: a few steps until it stops drafting, then a proposal per probe only (the
    # probe wait doubles after each rejected probe).
    assert slow_calls < 60 // PROBE_EVERY + 8
    # It still probes, and drafts no more than a cheap drafter would.
    assert 0 < slow_drafted <= fast_drafted
    # Drafts that are accepted pay for a slow proposal: once its statistics have learned
    # that (at most one probe wait), it proposes and drafts every step.
    calls, drafted = _run(0.1, 30, accepted=True)
    assert calls == drafted >= 30 - PROBE_EVERY
