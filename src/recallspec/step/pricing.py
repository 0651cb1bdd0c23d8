"""The value of a draft: expected tokens per second of its best prefix, from per-node
gains and a forward's cost by row count (the planner's inner loop, in plain Python: the
same IEEE operations in the same order as the numpy formulas it replaces)."""

from __future__ import annotations

from collections.abc import Sequence


def best_rate(gains: Sequence[float], costs: Sequence[float], overhead: float) -> float:
    """Expected tokens per second of the best prefix of a draft whose node gains are
    ``gains`` (non-increasing), a forward of 1 + k rows costing ``costs[k] + overhead``:
    ``max((1 + cumsum([0] + gains)) / (costs + overhead))``, in the same IEEE operations
    in the same order as numpy's (cumsum and the additions run left to right)."""
    best = 1.0 / (costs[0] + overhead)
    total = 0.0
    for k, g in enumerate(gains, start=1):
        total += g
        value = (1.0 + total) / (costs[k] + overhead)
        if value > best:
            best = value
    return best


def price(
    parents: list[int], rates: list[float], costs: Sequence[float], overhead: float,
) -> tuple[list[float], float]:
    """``best_rate`` of a draft (no more nodes than ``rates``) and its gains: the
    running minimum of its node rates (``AcceptanceStats.key_node_rates`` from the
    conditional ``rates``), in one pass with the same IEEE operations in the same order."""
    node = [0.0] * len(parents)
    gains: list[float] = []
    low = float("inf")
    total = 0.0
    best = 1.0 / (costs[0] + overhead)
    for j, p in enumerate(parents):
        r = node[j] = rates[j] if p < 0 else rates[j] * node[p]
        if not r >= low and low == low:  # running_min's rule (NaN sticks)
            low = r
        gains.append(low)
        total += low
        value = (1.0 + total) / (costs[j + 1] + overhead)
        if value > best:
            best = value
    return gains, best
