"""The verification cost curve: seconds for one forward of T new rows on this machine.

Speculation pays only when the extra accepted tokens outweigh the extra rows a draft
adds to the forward. On a CPU that trade-off depends on the model, the dtype, the
thread count and the matmul library (e.g. MKL is slow for 2-3 rows), so it is measured,
not modelled (``cost/calibration.py``: one chain of T rows after a cached
prefix, for a grid of T, plus the extra cost of each additional sequence in a batch).

Every row attends to the whole cached context, so a step costs more the more tokens are
cached, and a draft's rows cost more there too. Format 3 therefore also holds the
draft-sized forwards over a grid of context lengths (``decode``) and prompt chunks (last
row's logits only) at a few start positions (``prefill``): what policy replay
(``bench/replay/predict.py``) needs to predict seconds, and what the cost-aware sizing
uses to price a long request's rows.

A mixture of experts' curve also holds the distinct experts per layer its forwards of
``tokens`` rows woke (``experts``): a forward streams each woken expert once, so its price
holds only for rows that wake as many (``cost/experts.py`` re-prices it at the routing a
running model shows).

This module is the curve as data: the measured points, their interpolation and their
JSON form; it runs no model (measuring and caching a curve: ``cost/calibration.py``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
import numpy.typing as npt

# 2: large forwards measured with torch's threads (forward_threads); 3: + context grids
CURVE_FORMAT = 3
REFERENCE_CONTEXT = 256  # cached tokens before the forwards of ``tokens``/``seconds``


# Every price is positive (the cost-aware sizing divides by it) and grows past the
# measured points: a curve measured on a busy machine can fall between its last two
# points, or rise steeply between its first two contexts, and extending that by a line
# once priced forwards at zero seconds (a ZeroDivisionError in a served request).
# Measured times are positive (checked when a curve is built); past the last point the
# end segment's slope counts only where it rises, and below the first context (where
# contexts are extrapolated) a forward costs no less than BELOW_FIRST_CONTEXT of its
# cost at that context: attention over the cached tokens is a small share of a forward
# at the grid's first context (128), so a line that removes more is noise.
BELOW_FIRST_CONTEXT = 0.5


def _check_times(times: Sequence[float], what: str) -> None:
    if not all(np.isfinite(t) and t > 0 for t in times):
        raise ValueError(f"{what}: every time must be a positive number of seconds")


def _interp(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through (xs, ys), extended before the first point with the first
    segment's slope and past the last with the last segment's where it rises."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    slope = (y1 - y0) / (x1 - x0)
    return y0 + (max(slope, 0.0) if x > x1 else slope) * (x - x0)


def _lerp(xs: Sequence[int], ys: Sequence[float], x: npt.NDArray[np.float64],
          ) -> npt.NDArray[np.float64]:
    """``_interp`` at many points."""
    if len(xs) == 1:
        return np.full(x.shape, float(ys[0]))
    xa, ya = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
    i = np.clip(np.searchsorted(xa, x), 1, len(xa) - 1)
    x0, x1, y0, y1 = xa[i - 1], xa[i], ya[i - 1], ya[i]
    slope = (y1 - y0) / (x1 - x0)
    return np.asarray(y0 + np.where(x > x1, np.maximum(slope, 0.0), slope) * (x - x0),
                      np.float64)


def _between(lo: Any, hi: Any, w: float) -> Any:
    """The cost at weight ``w`` between contexts[i - 1] (``lo``) and contexts[i]
    (``hi``): past the last context rising only, below the first at least
    BELOW_FIRST_CONTEXT of ``lo`` (see above)."""
    if w > 1.0:
        return hi + (w - 1.0) * np.maximum(hi - lo, 0.0)
    v = lo + w * (hi - lo)
    return np.maximum(v, BELOW_FIRST_CONTEXT * lo) if w < 0.0 else v


@dataclass(frozen=True)
class CostGrid:
    """Seconds of one forward over ``rows`` new rows after ``contexts`` cached tokens,
    bilinear between the measured points (linear beyond them: attention is linear in
    the context, the matmuls piecewise linear in the rows)."""

    rows: tuple[int, ...]  # [K] strictly increasing
    contexts: tuple[int, ...]  # [C] strictly increasing
    seconds: tuple[tuple[float, ...], ...]  # [C][K]

    def __post_init__(self) -> None:
        if not self.rows or not self.contexts or len(self.seconds) != len(self.contexts):
            raise ValueError("cost grid needs one row of times per context")
        if any(len(r) != len(self.rows) for r in self.seconds):
            raise ValueError("cost grid needs one time per size and context")
        for xs in (self.rows, self.contexts):
            if any(b <= a for a, b in pairwise(xs)):
                raise ValueError("cost grid sizes and contexts must be strictly increasing")
        for times in self.seconds:
            _check_times(times, "cost grid")

    def _bracket(self, context: int) -> tuple[int, float]:
        """(i, w): the context lies at w between contexts[i - 1] and contexts[i] (w < 0 or
        > 1: beyond them); a one-context grid gives (0, 0.0)."""
        cs = self.contexts
        if len(cs) == 1:
            return 0, 0.0
        i = min(max(bisect_left(cs, context), 1), len(cs) - 1)
        return i, (max(context, 0) - cs[i - 1]) / (cs[i] - cs[i - 1])

    def __call__(self, rows: int, context: int) -> float:
        r = max(rows, self.rows[0])  # fewer rows than measured cost no less
        i, w = self._bracket(context)
        hi = _interp(self.rows, self.seconds[i], r)
        if len(self.contexts) == 1:
            return hi
        lo = _interp(self.rows, self.seconds[i - 1], r)
        return float(_between(lo, hi, w))

    def many(self, rows: npt.NDArray[np.float64], context: int) -> npt.NDArray[np.float64]:
        """``self(r, context)`` for every r of ``rows``."""
        r = np.maximum(rows, self.rows[0])
        i, w = self._bracket(context)
        hi = _lerp(self.rows, self.seconds[i], r)
        if len(self.contexts) == 1:
            return hi
        lo = _lerp(self.rows, self.seconds[i - 1], r)
        return np.asarray(_between(lo, hi, w), np.float64)

    def to_json(self) -> dict[str, Any]:
        return {"rows": list(self.rows), "contexts": list(self.contexts),
                "seconds": [list(s) for s in self.seconds]}

    @staticmethod
    def from_json(d: dict[str, Any] | None) -> CostGrid | None:
        if d is None:
            return None
        return CostGrid(tuple(int(x) for x in d["rows"]), tuple(int(x) for x in d["contexts"]),
                        tuple(tuple(float(x) for x in s) for s in d["seconds"]))


@dataclass(frozen=True)
class CostCurve:
    """cost(T, B) = interpolation of ``seconds`` over ``tokens`` + (B - 1) * per_seq;
    with a ``context`` (cached tokens) and a ``decode`` grid, the grid's cost there."""

    tokens: tuple[int, ...]  # [K] forward sizes measured, strictly increasing, tokens[0] == 1
    seconds: tuple[float, ...]  # [K] median seconds of one forward of that many rows
    per_seq: float  # extra seconds per additional sequence in the same forward
    key: str = ""  # what the curve was measured for (model, dtype, threads, machine)
    decode: CostGrid | None = None  # all-logits chains x context lengths (format 3)
    prefill: CostGrid | None = None  # prompt chunks (last logits) x start positions
    # A mixture of experts: (k, distinct experts per layer) its forwards of k rows at
    # the reference context woke, k strictly increasing (``cost/experts.py``); None: a
    # dense model, or not counted.
    experts: tuple[tuple[int, float], ...] | None = None

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.seconds) or not self.tokens:
            raise ValueError("cost curve needs one time per size")
        if self.experts is not None:
            ks = [k for k, _ in self.experts]
            if any(b <= a for a, b in pairwise(ks)) or not all(
                    k >= 1 and np.isfinite(n) and n >= 1 for k, n in self.experts):
                raise ValueError("cost curve: expert counts need strictly increasing row "
                                 "counts and at least one expert each")
        if any(b <= a for a, b in zip(self.tokens, self.tokens[1:], strict=False)):
            raise ValueError("cost curve sizes must be strictly increasing")
        _check_times(self.seconds, "cost curve")
        if not (np.isfinite(self.per_seq) and self.per_seq >= 0):
            raise ValueError("cost curve: the cost per extra sequence must be >= 0 seconds")

    def __call__(self, rows: int, seqs: int = 1, context: int | None = None) -> float:
        """Seconds of one forward of ``rows`` rows of ``seqs`` sequences; ``context``:
        their (mean) cached tokens, None = the reference context."""
        return self.rows_cost(rows, context) + max(seqs - 1, 0) * self.per_seq

    def costs(self, rows: npt.NDArray[np.float64], seqs: int = 1, context: int | None = None,
              ) -> npt.NDArray[np.float64]:
        """``self(r, seqs, context)`` for every r of ``rows`` at once (the cost-aware
        sizing prices every prefix of a step's candidate nodes)."""
        r = np.asarray(rows, np.float64)
        base = _lerp(self.tokens, self.seconds, np.maximum(r, self.tokens[0]))
        g = self.decode
        if context is not None and g is not None:
            top = g.rows[-1]
            grid = g.many(np.minimum(r, top), context)
            # Past the grid (large batches): the extra rows at the reference context
            # (never fewer seconds than the grid's last size).
            base = np.where(r <= top, grid, grid + np.maximum(base - self.rows_cost(top), 0.0))
        return base + max(seqs - 1, 0) * self.per_seq

    def prefill_cost(self, rows: int, start: int) -> float:
        """Seconds of one prompt chunk of ``rows`` rows after ``start`` cached tokens
        (logits of its last row only); without a prefill grid, an all-logits forward."""
        if self.prefill is not None:
            return self.prefill(rows, start)
        return self.rows_cost(rows, start)

    def rows_cost(self, rows: int, context: int | None = None) -> float:
        g = self.decode
        if context is not None and g is not None:
            top = g.rows[-1]
            if rows <= top:
                return g(rows, context)
            # Past the grid (large batches): the extra rows at the reference context
            # (never fewer seconds than the grid's last size).
            return g(top, context) + max(self.rows_cost(rows) - self.rows_cost(top), 0.0)
        # Fewer rows than measured cost no less; past the last size, its segment's slope.
        return _interp(self.tokens, self.seconds, max(rows, self.tokens[0]))

    def to_json(self) -> dict[str, Any]:
        return {
            "format": CURVE_FORMAT, "tokens": list(self.tokens), "seconds": list(self.seconds),
            "per_seq": self.per_seq, "key": self.key,
            "decode": None if self.decode is None else self.decode.to_json(),
            "prefill": None if self.prefill is None else self.prefill.to_json(),
            "experts": None if self.experts is None else [[k, n] for k, n in self.experts],
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> CostCurve:
        if d.get("format") != CURVE_FORMAT:
            raise ValueError("cost curve file has another format")
        experts = d.get("experts")  # (absent from curves written before it was counted)
        return CostCurve(tuple(int(t) for t in d["tokens"]), tuple(float(s) for s in d["seconds"]),
                         float(d["per_seq"]), str(d.get("key", "")),
                         CostGrid.from_json(d.get("decode")), CostGrid.from_json(d.get("prefill")),
                         None if experts is None else tuple((int(k), float(n)) for k, n in experts))
