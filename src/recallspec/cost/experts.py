"""A mixture of experts' forwards priced by the experts they wake, at the routing the
running model shows.

A forward of k rows streams each expert that any of its rows chose once per layer (the
native forward groups a forward's rows by expert), so what it costs is a function of the
rows and of the distinct experts they wake. The cost curve is measured on chains of
random tokens (``cost/calibration.py``), whose forwards woke ``CostCurve.experts``
distinct experts per layer. What a running model's rows wake is another number: a
random-weight shape routes nearly uniformly, a trained model with locality (the tokens
of one text share experts) wakes fewer, a batch of unrelated sequences more. So it is
learned from the model's own verified forwards (``RoutingEstimate``), never taken from
the shape, and every forward of k rows is priced at the measured curve plus (or minus)
the streaming of the experts between that estimate and the calibration's count
(``reprice``): per expert and layer, ``ExpertShape.expert_share`` of a one-row forward
(its bytes over those a token reads: a decode step streams its weights at about one
rate). A price stays rising in rows and never falls below the one-row forward's, so a
draft that no size pays for is not drafted. Which price a draft gets changes only how
many rows it has, never a token (verification is lossless).

Pure: no model runs here (the counts come from ``cost/expert_counts.py``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import accumulate, pairwise

from recallspec.cost.curve import CostCurve, CostGrid

# The estimate's weight before any forward is seen, in forwards (it starts at the
# calibration's counts): a few noisy first forwards do not swing the prices.
PRIOR_WEIGHT = 8.0
# Per observed forward: the estimate follows the running workload (a new request's text
# routes otherwise) over about 1 / (1 - DECAY) forwards.
DECAY = 0.99
# Curves are re-priced only once the estimate's position moved this much since the last
# re-pricing (a re-pricing clears the planner's cost tables): a smaller move changes
# prices by less than a step's noise.
REPRICE_MOVE = 0.02
# The positions of the anchors (``RoutingEstimate``).
FULL_OVERLAP, CALIBRATED, UNIFORM, ALL_FRESH = -1.0, 0.0, 1.0, 2.0


@dataclass(frozen=True)
class ExpertShape:
    """What a mixture of experts' pricing needs of its model."""

    experts: int  # E: experts per layer
    experts_used: int  # K: experts each row chooses (distinct)
    layers: int  # layers, each a mixture of E experts
    # Bytes of one expert's matrices in one layer over the bytes one token's forward
    # reads (its K experts a layer and every shared matrix): the share of a one-row
    # forward that streaming one more expert in one layer adds.
    expert_share: float

    def __post_init__(self) -> None:
        if not 0 < self.experts_used <= self.experts or self.layers < 1:
            raise ValueError("an expert shape needs 0 < experts_used <= experts and layers >= 1")
        if not 0.0 <= self.expert_share <= 1.0:
            raise ValueError("an expert's share of a one-row forward must lie in [0, 1]")

    def uniform(self, rows: int) -> float:
        """Distinct experts per layer ``rows`` rows wake when each chooses independently
        and uniformly: E (1 - (1 - K / E)^rows)."""
        e = self.experts
        return e * (1.0 - (1.0 - self.experts_used / e) ** max(rows, 1))

    def most(self, rows: int) -> float:
        """The most experts per layer ``rows`` rows can wake: min(E, rows x K)."""
        return float(min(self.experts, max(rows, 1) * self.experts_used))


class RoutingEstimate:
    """The distinct experts per layer a forward of k rows wakes, learned from forwards.

    At each k four anchors, non-decreasing: full overlap (K experts: every row wakes
    the experts of the row before), the calibration's count, independent uniform
    routing (``ExpertShape.uniform``, at least the calibration's) and every row fresh
    experts (``ExpertShape.most``); the estimate is one position s in [-1, 2] on them
    (-1, 0, 1, 2 at the anchors, linear between), the same at every k. So it equals the
    calibration at s = 0, whatever shape the calibration's counts have, and each bound
    at its s. Each forward of k >= 2 rows counts its own position (one row wakes K
    experts whatever the routing: no information), and s is their mean, each weighted
    DECAY^(forwards since), beside a prior at s = 0 of PRIOR_WEIGHT forwards, decayed
    alike."""

    def __init__(self, shape: ExpertShape, calibrated: Sequence[tuple[int, float]],
                 decay: float = DECAY, prior_weight: float = PRIOR_WEIGHT) -> None:
        """``calibrated``: (k, distinct experts per layer) of the calibration's forwards,
        k strictly increasing, at least one k >= 2."""
        if not 0.0 < decay <= 1.0 or prior_weight < 0.0:
            raise ValueError("a routing estimate needs 0 < decay <= 1 and prior_weight >= 0")
        ks = [k for k, _ in calibrated]
        if any(b <= a for a, b in pairwise(ks)):
            raise ValueError("the calibration's expert counts need strictly increasing k")
        self.shape = shape
        # The calibration as its share f(k) of the way from K to uniform, interpolated
        # in k between its counts (constant past them): (k, f) for k >= 2.
        self._ks: list[int] = []
        self._fs: list[float] = []
        for k, woken in calibrated:
            span = shape.uniform(k) - shape.experts_used
            if k >= 2 and span > 0.0:
                self._ks.append(k)
                self._fs.append((woken - shape.experts_used) / span)
        if not self._ks and shape.experts_used < shape.experts:
            raise ValueError("the calibration's expert counts need a forward of k >= 2 rows")
        self.decay = decay
        self.forwards = 0  # forwards counted (of k >= 2 rows)
        self._sum = 0.0  # sum of the weighted positions
        self._weight = prior_weight  # sum of the weights, the prior's included

    @property
    def position(self) -> float:
        """s: -1 full overlap, 0 as calibrated, 1 uniform, 2 every row fresh experts."""
        return self._sum / self._weight if self._weight > 0.0 else CALIBRATED

    def calibrated(self, rows: int) -> float:
        """The calibration's distinct experts per layer at ``rows`` rows (interpolated)."""
        s = self.shape
        if rows <= 1 or not self._ks:
            return float(s.experts_used)
        ks, fs = self._ks, self._fs
        i = bisect_left(ks, rows)
        if i == 0:
            f = fs[0]
        elif i == len(ks):
            f = fs[-1]
        else:
            w = (rows - ks[i - 1]) / (ks[i] - ks[i - 1])
            f = fs[i - 1] + w * (fs[i] - fs[i - 1])
        span = s.uniform(rows) - s.experts_used
        return min(max(s.experts_used + f * span, float(s.experts_used)), s.most(rows))

    def anchors(self, rows: int) -> tuple[float, float, float, float]:
        """(full overlap, calibration, uniform, every row fresh) at ``rows`` rows."""
        s = self.shape
        top, cal = s.most(rows), self.calibrated(rows)
        return float(s.experts_used), cal, min(max(s.uniform(rows), cal), top), top

    def estimate(self, rows: int, position: float | None = None) -> float:
        """Distinct experts per layer a forward of ``rows`` rows wakes at ``position``
        (None: the current one), in [K, min(E, rows x K)]."""
        at = self.position if position is None else position
        lo, cal, uni, top = self.anchors(rows)
        if at < CALIBRATED:
            return cal + at * (cal - lo)
        if at <= UNIFORM:
            return cal + at * (uni - cal)
        return uni + (min(at, ALL_FRESH) - UNIFORM) * (top - uni)

    def position_of(self, rows: int, woken: float) -> float:
        """The position at which ``rows`` rows wake ``woken`` experts per layer (clipped
        to the anchors; on a flat stretch, the point nearest the calibration)."""
        lo, cal, uni, top = self.anchors(rows)
        w = min(max(woken, lo), top)
        if w < cal:
            return (w - cal) / (cal - lo)
        if w <= uni:
            return CALIBRATED if uni <= cal else (w - cal) / (uni - cal)
        return UNIFORM + (w - uni) / (top - uni)

    def observe(self, rows: int, woken: float) -> None:
        """A forward of ``rows`` rows woke ``woken`` distinct experts per layer."""
        if rows < 2 or self.shape.most(rows) <= self.shape.experts_used:
            return
        d = self.decay
        self.forwards += 1
        self._sum = d * self._sum + self.position_of(rows, woken)
        self._weight = d * self._weight + 1.0


def reprice(curve: CostCurve, extra: Callable[[int], float], expert_s: float, layers: int,
            label: str) -> CostCurve:
    """``curve`` with every forward of k rows waking ``extra(k)`` more distinct experts per
    layer (fewer where negative): plus layers x extra(k) x ``expert_s`` (seconds to
    stream one expert of one layer), never below the smallest measured forward nor below
    a forward of fewer rows at the same context. Prompt chunks (``prefill``) keep their
    prices: they are not draft rows. The result counts no experts (``experts`` None: its
    prices are no measurement, and are never re-priced again)."""
    if expert_s < 0 or layers < 1:
        raise ValueError("reprice: needs expert_s >= 0 and layers >= 1")

    def priced(rows: tuple[int, ...], times: tuple[float, ...]) -> tuple[float, ...]:
        new = [t + layers * extra(k) * expert_s for k, t in zip(rows, times, strict=True)]
        return tuple(accumulate((max(c, times[0]) for c in new), max))

    decode = curve.decode
    if decode is not None:
        decode = CostGrid(decode.rows, decode.contexts,
                          tuple(priced(decode.rows, times) for times in decode.seconds))
    return replace(curve, seconds=priced(curve.tokens, curve.seconds), decode=decode,
                   experts=None, key=f"{curve.key}:{label}")


class ExpertPricing:
    """A mixture of experts' measured curves priced at the routing its forwards show:
    ``observe`` each verified forward, ``curve`` the measured curve re-priced at the
    current estimate (``RoutingEstimate``, relative to that curve's calibration counts;
    a curve without counts, e.g. a prior, is returned as it is). The re-priced curve is
    kept until the estimate moves by more than REPRICE_MOVE, so a caller may key its own
    caches on the returned object's identity."""

    def __init__(self, shape: ExpertShape) -> None:
        self.shape = shape
        self._measured: CostCurve | None = None  # the curve the estimate is relative to
        self._routing: RoutingEstimate | None = None  # None: that curve has no counts
        self._priced: CostCurve | None = None  # the measured curve at ``_at``
        self._at = CALIBRATED

    @property
    def routing(self) -> RoutingEstimate | None:
        """The estimate of the last curve priced (None: none, or it has no counts)."""
        return self._routing

    def observe(self, rows: int, woken: float) -> None:
        """A verified forward of ``rows`` rows woke ``woken`` distinct experts per layer
        (before any curve with counts is priced: not counted, there is nothing to count
        it against)."""
        if self._routing is not None:
            self._routing.observe(rows, woken)

    def curve(self, measured: CostCurve) -> CostCurve:
        """``measured`` priced at the current estimate."""
        if measured is not self._measured:
            # Another curve (a measured one replacing a prior): an estimate relative to
            # its own calibration, from the prior again.
            self._measured, self._priced, self._at = measured, measured, CALIBRATED
            counts = measured.experts
            self._routing = (RoutingEstimate(self.shape, counts)
                             if counts is not None and any(k >= 2 for k, _ in counts)
                             else None)
        r = self._routing
        if r is not None and abs(r.position - self._at) > REPRICE_MOVE:
            self._priced = self._reprice(measured, r)
        assert self._priced is not None
        return self._priced

    def _reprice(self, measured: CostCurve, r: RoutingEstimate) -> CostCurve:
        """``measured`` at ``r``'s current position (then noted as the priced one)."""
        at = self._at = r.position
        return reprice(measured, lambda k: r.estimate(k, at) - r.calibrated(k),
                       self.shape.expert_share * measured(1), self.shape.layers,
                       f"experts@{at:+.2f}")
