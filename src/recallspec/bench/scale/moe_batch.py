"""A batched verification step at one model shape: B sequences' draft rows in one forward
(``recallspec bench scale``'s batched curve, measured by ``bench/scale/ours.py``).

A mixture of experts' forward streams each expert that any of its rows chose once per
layer. One sequence's k draft rows share context, and so perhaps experts; B sequences'
rows share neither, so a batched step may wake up to B times the experts of one
sequence's. For each B of ``BatchPlan.seqs`` and k of ``BatchPlan.ks``: one forward of B
sequences, each its own slot holding its own ``cached`` random tokens (sequence i drawn
with seed i: ``cost/calibration.random_prefix``), each a chain of k rows (every row's
logits, as verification), timed as the cost curve's forwards are (``cost/calibration``:
``timed_forward`` in ``interleaved_times`` rounds, median), and its distinct experts per
layer counted by the native forward's counters (the mean over ``samples`` forwards of
other random chains), beside:

* the same B x k rows as one sequence's chain (sequence 0's: seed 0 as
  ``ours.experts_touched``'s, so at B = 1 the forwards are the same), its time and
  experts taken from the run's one-sequence curve where B x k is among its sizes, else
  measured here (the times made non-decreasing in rows, as the curve's are);
* independent uniform routing's expectation, E(1 - (1 - K/E)^(B k));
* what the engine's cost model prices that forward at (``cost/curve.CostCurve``: the
  rows as one chain plus (B - 1) x per_seq, per_seq measured as the calibration measures
  it: ``cost/calibration.per_seq_cost``), at the calibration's routing and re-priced at
  this forward's (``cost/experts``).

A dense model gets the same table without the experts (measured only when asked).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from recallspec.cost.calibration import (
    interleaved_times,
    monotone_in_rows,
    per_seq_cost,
    random_prefix,
    timed_forward,
)
from recallspec.cost.curve import CostCurve
from recallspec.cost.expert_counts import WokenExperts, expert_shape
from recallspec.cost.experts import ExpertShape, RoutingEstimate, reprice
from recallspec.cost.plan import PER_SEQ, PER_SEQ_CACHED
from recallspec.runtime.batch import SequenceInput, build_batch

BATCH_SEQS = (1, 2, 4, 8)  # a mixture of experts' default sequences per forward
BATCH_KS = (1, 4)  # rows per sequence

NOTES_MOE = (
    "The cost model has no per-sequence notion of a mixture's routing: a forward of B "
    "sequences' k rows is priced as one sequence's chain of B x k rows plus (B - 1) x "
    "per_seq (CostCurve), its experts at the one routing position the planner learns from "
    "every verified forward (cost/experts.RoutingEstimate), whichever sequences the rows "
    "came from.",
    f"per_seq is measured as the calibration measures it ({PER_SEQ} one-row sequences of "
    f"{PER_SEQ_CACHED} cached tokens against one chain of {PER_SEQ} rows): its sequences "
    "hold the same tokens and wake the same experts, so for a mixture it leaves out what "
    "the further sequences' experts cost (and may net to 0).",
    "priced_ms: the curve at the calibration's routing (a fresh planner's); "
    "priced_routed_ms: re-priced (cost/experts.reprice) at the routing position this "
    "forward's woken experts give (RoutingEstimate.position_of), where the planner's "
    "estimate sits after many such forwards.",
)
NOTES_DENSE = (
    "A dense model: priced_ms is the rows as one chain plus (B - 1) x per_seq (CostCurve), "
    "per_seq measured as the calibration measures it.",
)


@dataclass(frozen=True)
class BatchPlan:
    """What the batched curve measures: every (B, k) of ``seqs`` x ``ks``."""

    seqs: tuple[int, ...]  # sequences per forward
    ks: tuple[int, ...]  # rows per sequence
    cached: int  # cached tokens of each sequence
    repeats: int = 3  # timed rounds (median)
    samples: int = 8  # forwards whose woken experts are averaged
    warmup: int = 2  # untimed rounds first (as the one-sequence grid's)

    def __post_init__(self) -> None:
        if not self.seqs or not self.ks or min(*self.seqs, *self.ks) < 1:
            raise ValueError(f"a batched curve needs positive sequences and rows: "
                             f"{self.seqs} x {self.ks}")
        if self.cached < 1 or self.repeats < 1 or self.samples < 1 or self.warmup < 0:
            raise ValueError("a batched curve needs cached, repeats, samples >= 1, warmup >= 0")

    def points(self) -> list[tuple[int, int]]:
        """(B, k), k-major then B: the table's order."""
        return [(b, k) for k in sorted(set(self.ks)) for b in sorted(set(self.seqs))]

    def rows(self) -> list[int]:
        """The one-sequence chains compared with: every B x k, and 1 (the price's base)."""
        return sorted({1, *(b * k for b, k in self.points())})


def default_seqs(moe: bool) -> tuple[int, ...]:
    """The sequences per forward measured when none are asked for: a mixture of experts'
    BATCH_SEQS (where batching changes the experts a row costs), none for a dense model."""
    return BATCH_SEQS if moe else ()


def _woken(model: Any, forwards: list[Any], cache: Any, rows: int) -> float:
    """Distinct experts per layer, the mean over ``forwards`` (batches of ``rows`` rows
    each), each read from its own forward's counters (``WokenExperts.last``). Raises
    where a forward's counters do not show its rows."""
    counter = WokenExperts.of(model)
    if counter is None:
        raise RuntimeError("batched curve: experts counted by a mixture's native forward only")
    woken: list[float] = []
    with torch.inference_mode():
        for meta in forwards:
            model(meta, cache)
            n = counter.last(rows)
            if n is None:
                raise RuntimeError(f"batched curve: the expert counters do not show a "
                                   f"forward of {rows} rows")
            woken.append(n)
    return sum(woken) / len(woken)


def _chains(ids: list[int], cached: int, k: int, s: int) -> list[int]:
    """The ``s``-th chain of k rows after the context (as ``ours.experts_touched``'s)."""
    return ids[cached + s * k : cached + (s + 1) * k]


def batched_curve(model: Any, threads: int, plan: BatchPlan,
                  one_seq_ms: Mapping[int, float] | None = None,
                  one_seq_experts: Mapping[int, float] | None = None) -> dict[str, Any]:
    """The batched curve of ``plan`` (JSON-ready: ``points``, one per (B, k), and how it
    was measured). ``one_seq_ms`` / ``one_seq_experts``: the run's one-sequence curve at
    ``plan.cached`` ({rows: ms}, {rows: experts per layer}); a chain of rows they lack is
    measured here (its time in the same rounds as the batched forwards)."""
    given_ms, given_ex = dict(one_seq_ms or {}), dict(one_seq_experts or {})
    shape = expert_shape(model)  # None: dense (or no native forward: no counters)
    ref_rows = plan.rows()
    own_ms = [n for n in ref_rows if n not in given_ms]
    own_ex = [n for n in ref_rows if shape is not None and n not in given_ex]
    longest = max(max(plan.ks), *ref_rows)
    cached, most = plan.cached, max(plan.seqs)
    cache = model.new_cache(most, cached + longest + 2)
    slots = [cache.allocate() for _ in range(most)]
    try:
        # Sequence i's context: seed i's tokens, fed (``random_prefix``); seed 0's are the
        # one-sequence curve's own context (``fill_context``'s) and chains.
        ids = [random_prefix(model, cache, slot, cached, plan.samples * longest, seed=seed)
               for seed, slot in enumerate(slots)]

        def batch(b: int, k: int, s: int) -> Any:
            return build_batch([SequenceInput(slots[i], cached, _chains(ids[i], cached, k, s),
                                              logits="all") for i in range(b)])

        points = plan.points()
        fns: dict[int, Callable[[], Any]] = {
            j: timed_forward(model, cache, batch(b, k, 0), threads)
            for j, (b, k) in enumerate(points)}
        fns |= {len(points) + j: timed_forward(model, cache, batch(1, n, 0), threads)
                for j, n in enumerate(own_ms)}
        t = interleaved_times(fns, plan.repeats, plan.warmup)
        ms = {pt: 1000 * t[j] for j, pt in enumerate(points)}
        # Non-decreasing in rows, as the calibration makes its curve (``monotone_in_rows``:
        # the grid's own already are; one measured here joins them).
        ref_ms = monotone_in_rows(
            given_ms | {n: 1000 * t[len(points) + j] for j, n in enumerate(own_ms)})
        woken: dict[tuple[int, int], float] = {}
        if shape is not None:
            for b, k in points:
                woken[(b, k)] = _woken(model, [batch(b, k, s) for s in range(plan.samples)],
                                       cache, b * k)
            for n in own_ex:
                given_ex[n] = _woken(model, [batch(1, n, s) for s in range(plan.samples)],
                                     cache, n)
    finally:
        for slot in slots:
            cache.release(slot)
    per_seq = per_seq_cost(model, threads, PER_SEQ, PER_SEQ_CACHED, plan.repeats)
    rows = sorted(ref_ms)
    counts = (tuple((n, given_ex[n]) for n in sorted(given_ex))
              if shape is not None and given_ex else None)
    curve = CostCurve(tuple(rows), tuple(ref_ms[n] / 1000 for n in rows), per_seq,
                      "batched", experts=counts)
    routing = (RoutingEstimate(shape, counts)
               if shape is not None and counts and any(n >= 2 for n, _ in counts) else None)
    out_points = []
    for b, k in points:
        n = b * k
        p: dict[str, Any] = {"seqs": b, "k": k, "rows": n, "ms": ms[(b, k)],
                             "one_seq_ms": ref_ms[n], "priced_ms": 1000 * curve(n, b)}
        if shape is not None:
            p |= {"experts": woken[(b, k)], "one_seq_experts": given_ex[n],
                  "uniform": shape.uniform(n), "most": shape.most(n)}
            if routing is not None:
                at = routing.position_of(n, woken[(b, k)])
                p |= {"position": at,
                      "priced_routed_ms": 1000 * _routed(curve, routing, shape, at)(n, b)}
        out_points.append(p)
    out: dict[str, Any] = {
        "cached": cached, "seqs": sorted(set(plan.seqs)), "ks": sorted(set(plan.ks)),
        "repeats": plan.repeats, "samples": plan.samples, "per_seq_ms": 1000 * per_seq,
        "one_seq_measured": own_ms, "points": out_points,
        "notes": list(NOTES_MOE if shape is not None else NOTES_DENSE)}
    if shape is not None:
        out |= {"experts": shape.experts, "experts_used": shape.experts_used}
        if routing is None:
            out["notes"].append("No routing re-pricing: the one-sequence counts hold no "
                                "chain of 2 or more rows.")
    return out


def _routed(curve: CostCurve, routing: RoutingEstimate, shape: ExpertShape,
            at: float) -> CostCurve:
    """``curve`` re-priced at routing position ``at``, as the planner re-prices its
    measured curve (``cost/experts.ExpertPricing``: each expert of a layer streamed at
    ``expert_share`` of a one-row forward)."""
    return reprice(curve, lambda n: routing.estimate(n, at) - routing.calibrated(n),
                   shape.expert_share * curve(1), shape.layers, f"experts@{at:+.2f}")
