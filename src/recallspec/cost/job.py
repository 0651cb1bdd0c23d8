"""A cost curve measured in the background, in turns, and the prior used meanwhile.

``recallspec serve`` answers requests at once after loading instead of measuring the cost
curve first (at the 1.7B and 8B shapes that kept ``/health`` from answering for tens of
seconds or more). The measurement (``cost/calibration.py``: ``calibrate``) runs in a
thread of its own, but only while its owner (the engine thread) waits for it: the owner
calls ``turn()``, the job runs up to its next pause point (one forward; calibrate's
``pause`` hook, outside its timings) and hands the CPU back. So the job's forwards never
share the cores with the engine's steps (a timing taken beside a step would be wrong for
good, and the step slower), the engine touches the model only between turns, and a
request that arrives while a turn runs waits for one forward at most.

Until the curve is measured, the planner prices drafts with a prior: before the probe
(the measurement's first few forwards) every row as dear as a whole forward
(``UNPRICED``: it drafts nothing but near-certain drafts and its probes), after it
``prior_from_probe``: the probe's 1- and 32-row forwards, each extra row priced at
PRIOR_MARGIN times their chord.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from recallspec.cost.calibration import Tick
from recallspec.cost.curve import REFERENCE_CONTEXT, CostCurve, CostGrid

# A measurement: given the pause hook and where to report the probe, the curve.
Measure = Callable[[Tick, Callable[[CostGrid], None]], CostCurve]

# Extra rows at this many times the probe's chord (1 to PROBE_ROWS = 32 rows): over the
# draft-sized points of cached decode grids (135M to 8B) the chord is about the measured
# extra cost in the median but far off either way at single points; twice it prices most
# draft sizes above their measured cost, so the prior drafts less than the measured
# curve will (lossless either way: only the speed is at stake).
PRIOR_MARGIN = 2.0
# Before any forward is timed: each row a whole second (only the ratios of the prices
# matter to the sizing; a step's overhead is counted in them, and is tiny against this).
UNPRICED = CostCurve((1, 2), (1.0, 2.0), 0.0, "unpriced")


def prior_from_probe(prices: CostGrid) -> CostCurve:
    """A curve from the probe's 2 x 2 grid (1 and PROBE_ROWS rows at two contexts): the
    1-row forward as measured, each extra row at PRIOR_MARGIN x the chord's slope, at
    each probed context (linear between and beyond them, as any grid)."""
    rows = prices.rows
    seconds = tuple(
        tuple(s[0] + PRIOR_MARGIN * (s[-1] - s[0]) * (r - rows[0]) / (rows[-1] - rows[0])
              for r in rows) for s in prices.seconds)
    grid = CostGrid(rows, prices.contexts, seconds)
    ref = tuple(grid(r, REFERENCE_CONTEXT) for r in rows)
    return CostCurve(rows, ref, 0.0, decode=grid)


class CurveJob:
    """``measure`` in a thread that runs only during its owner's ``turn()`` calls."""

    def __init__(self, measure: Measure) -> None:
        self._measure = measure
        self._cv = threading.Condition()
        self._job_runs = False  # whose turn it is: the job's or the owner's
        self._cancelled = False
        self._started = False
        self._thread = threading.Thread(target=self._main, name="recallspec-cost-curve",
                                        daemon=True)
        self.prior: CostCurve | None = None  # from the probe, once it ran
        self.result: CostCurve | None = None
        self.error: BaseException | None = None
        self.done = False
        self.run_s = 0.0  # seconds of turns so far

    def turn(self) -> bool:
        """Let the job run to its next pause point (one forward), then return whether
        it is done (``result`` or ``error`` set). Only the owner's thread calls this."""
        if self.done:
            return True
        t0 = time.perf_counter()
        with self._cv:
            if not self._started:
                self._started = True
                self._thread.start()
            self._job_runs = True
            self._cv.notify_all()
            self._cv.wait_for(lambda: not self._job_runs)
        self.run_s += time.perf_counter() - t0
        return self.done

    def cancel(self) -> None:
        """Stop the job at its pause point (its scratch caches freed); idempotent."""
        self._cancelled = True
        while not self.turn():
            pass

    def _pause(self) -> None:
        """The job's pause point (calibrate's ``pause``): hand the turn back, wait for
        the next one."""
        with self._cv:
            self._job_runs = False
            self._cv.notify_all()
            self._cv.wait_for(lambda: self._job_runs)
        if self._cancelled:
            raise _Cancelled

    def _set_prior(self, prices: CostGrid) -> None:
        self.prior = prior_from_probe(prices)

    def _main(self) -> None:
        with self._cv:  # (started inside a turn: it is the job's)
            self._cv.wait_for(lambda: self._job_runs)
        try:
            if self._cancelled:
                raise _Cancelled
            self.result = self._measure(self._pause, self._set_prior)
        except _Cancelled:
            pass
        except BaseException as e:  # reported to the owner (``error``), never lost
            self.error = e
        finally:
            with self._cv:
                self.done = True
                self._job_runs = False
                self._cv.notify_all()


class _Cancelled(Exception):
    """Raised at the job's pause point once it is cancelled."""
