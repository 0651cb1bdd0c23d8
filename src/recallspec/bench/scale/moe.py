"""The routing bounds of a mixture of experts' verification cost at a random-weight shape.

A forward of k rows streams each expert that any of its rows chose once per layer
(``NativeModel::experts``), so what k rows cost depends on how many distinct experts they
wake. A random-weight shape's router picks what its random values make it pick: the
measured curve (``bench/scale/ours.py``) is priced at the experts its chains of random
tokens woke (``experts_touched``), which need not be what any real model's draft rows
wake. So the prediction is stated between two bounds, each the measured curve re-priced
at another count of experts per layer:

* **uniform**: rows route independently and uniformly, E(1 - (1 - K/E)^k) experts
  (``experts_uniform``), the most a real model's draft rows would wake;
* **full overlap**: every draft row wakes the experts of the row before, K experts, as
  one row does.

Re-pricing adds (or removes) at each k the streaming of the experts between the counted
and the bound's count, each expert's matrices at the bandwidth the run's AR decode
achieved over the bytes a token reads: an estimate, and labelled so wherever it is used
(the rows' products themselves are the same k x K per layer either way). Prompt chunks
(prefill) keep their measured price: the bounds concern draft rows. The formula is the
engine's own (``cost/experts.py: reprice``), which prices drafts at the routing the
running model shows instead of at a bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from recallspec.cost.curve import CostCurve
from recallspec.cost.experts import reprice

BOUNDS = ("uniform", "full-overlap")


def expert_seconds(ours: Mapping[str, Any], layers: int) -> float:
    """Seconds to stream one expert's matrices of one layer at the bandwidth ``ours``
    (``bench/scale/ours.py``'s result) achieved in AR decode."""
    wb = ours["weight_bytes"]
    per_expert = wb["experts"] / (layers * ours["experts"])
    return per_expert / (ours["achieved_gb_s"] * 1e9)


def bound_experts(bound: str, ours: Mapping[str, Any]) -> dict[str, float]:
    """Experts per layer a forward of k rows wakes under ``bound`` (``BOUNDS``), by k."""
    if bound == "uniform":
        return dict(ours["experts_uniform"])
    if bound == "full-overlap":
        return {k: float(ours["experts_used"]) for k in ours["experts_touched"]}
    raise ValueError(f"unknown routing bound {bound!r} (known: {', '.join(BOUNDS)})")


def repriced_curve(curve: CostCurve, touched: Mapping[str, float],
                   target: Mapping[str, float], layers: int, expert_s: float,
                   label: str) -> CostCurve:
    """``curve`` (measured where its forwards woke ``touched[k]`` experts per layer) with
    every forward of k rows priced at ``target[k]`` experts instead: plus (target - touched)
    x layers x ``expert_s``, never below the smallest measured forward nor a forward of
    fewer rows at the same context. Both maps must hold every size of the curve."""
    missing = [k for k in curve.tokens if str(k) not in touched or str(k) not in target]
    if missing:
        raise ValueError(f"repriced_curve: no experts counted for k = {missing}")
    if expert_s < 0 or layers < 1:
        raise ValueError("repriced_curve: needs expert_s >= 0 and layers >= 1")
    return reprice(curve, lambda k: target[str(k)] - touched[str(k)], expert_s, layers, label)


def bound_curve(curve: CostCurve, ours: Mapping[str, Any], layers: int,
                bound: str) -> CostCurve:
    """The measured ``curve`` of a mixture of experts re-priced at ``bound``'s experts."""
    return repriced_curve(curve, ours["experts_touched"], bound_experts(bound, ours),
                          layers, expert_seconds(ours, layers), bound)
