"""Where the engine's cost curve comes from: measured before use, or in the background.

``measured()`` is the curve of this model on this machine, read from the cache or
measured on the spot (``cost/calibration.py``): offline runs and benchmarks
take it before any request's clock starts. ``start_background()`` (``recallspec
serve``) reads a cached curve, or else starts measuring one in turns
(``cost/job.py``) that the engine thread grants through ``advance()``: once
it has been idle for IDLE_WAIT_S, a turn after another; and once requests have run for
BUSY_WAIT_S without such a pause, at most BACKGROUND_SHARE of that time, so a server
that is never idle still ends up with its curve. Meanwhile ``current()``, what the
planner prices drafts with, is the job's conservative prior. Which curve prices a draft
changes only how many nodes it has, never a token (verification is lossless).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recallspec.cost.cache import cached_curve, curve_key
from recallspec.cost.calibration import calibrate
from recallspec.cost.curve import CostCurve
from recallspec.cost.job import UNPRICED, CurveJob
from recallspec.models.loader import cache_dir

# While requests run, a turn (one forward, seconds long at 8B on a small machine) delays
# every running request's next token by as much: none until the engine has been busy
# this long without a pause (the first requests after a start: a short answer at 8B took
# markedly longer when a turn came right after its prefill), then turns at most this
# share of the busy stretch.
BUSY_WAIT_S = 30.0
BACKGROUND_SHARE = 0.1
# Idle this long before a turn: a client that sends its next request as soon as it has
# the last answer (an agent loop) would otherwise find a turn running each time (at 8B
# the second of two short answers in a row took markedly longer).
IDLE_WAIT_S = 1.0


class CostCurveSource:
    """The cost curve of one engine's model, thread count and machine."""

    def __init__(self, model: Any, fingerprint: Callable[[], str], threads: int,
                 say: Callable[[str], None]) -> None:
        """``fingerprint``: the tokenizer's, part of the cached curve's key (taken when a
        curve is first needed: plain decoding never hashes the vocabulary)."""
        self.model, self.threads, self._say = model, threads, say
        self._fingerprint = fingerprint
        self._curve: CostCurve | None = None
        self._job: CurveJob | None = None
        self._idle_at: float | None = None  # the last idle turn (the busy stretch's start)
        self._busy_at = -float("inf")  # the last call while busy
        self._busy_run_s = 0.0  # seconds of turns in the busy stretch
        # A curve first needed later (a request naming a cost-aware drafter) is measured
        # in the background too, not on the spot (``recallspec serve``'s default).
        self.background = False
        self._failed = False

    @property
    def state(self) -> str:
        """"measured" (cached, measured or given), "measuring" (in the background),
        "failed" (in the background: drafts stay priced by the prior) or "none" (not
        needed yet)."""
        if self._curve is not None:
            return "failed" if self._failed else "measured"
        return "measuring" if self._job is not None else "none"

    def use(self, curve: CostCurve) -> None:
        """Price drafts with ``curve`` from now on (a background measurement stops)."""
        self.cancel()
        self._curve, self._failed = curve, False

    def _place(self) -> tuple[str, Path]:
        key = curve_key(self.model, self._fingerprint(), self.threads)
        return key, cache_dir() / "cost_curves" / f"{key}.json"

    def wait_for_writer(self) -> None:
        """Return once a first load's background repack cache write is done."""
        if self._writing():
            self._say("finishing the repack cache write before timing this model")
            self.model.repack_cache_writer.join()

    def measured(self) -> CostCurve:
        """The measured curve, measured now (or the background measurement finished
        now) when it is not known yet."""
        if self._curve is None:
            self.wait_for_writer()
            if self._job is not None:
                while not self._job.turn():
                    pass
                self._finish(raise_error=True)
            else:
                key, path = self._place()
                self._curve = calibrate(self.model, self.threads, key=key, cache_path=path,
                                        say=self._say)
        assert self._curve is not None
        return self._curve

    def current(self) -> CostCurve:
        """What prices drafts now: the measured curve; while it is measured in the
        background the prior (never waiting for it); else measured now, or with
        ``background`` set, its measurement started in the background."""
        known = self.known()
        if known is None and self.background:
            self.start_background()
            known = self.known()
        return self.measured() if known is None else known

    def known(self) -> CostCurve | None:
        """``current()`` without measuring (None: no curve and none being measured)."""
        if self._curve is not None:
            return self._curve
        if self._job is not None:
            return self._job.prior or UNPRICED
        return None

    def start_background(self) -> bool:
        """Read the cached curve, or start measuring one in the background; returns
        whether a measurement is under way (``advance`` drives it)."""
        if self._curve is not None or self._job is not None:
            return self._job is not None
        key, path = self._place()
        known = cached_curve(path, key, say=self._say)
        if known is not None:
            self._curve = known
            return False
        self._say("the verification cost curve of this model is measured in the background "
                  "while serving (once, then cached); until then drafts are priced "
                  "conservatively")
        # (As if busy until now: a server's first request tends to come right after it
        # starts, and the first turn would hold it up.)
        self._busy_at = time.perf_counter()
        self._job = CurveJob(lambda pause, on_probe: calibrate(
            self.model, self.threads, key=key, cache_path=path, say=self._say, pause=pause,
            on_probe=on_probe))
        return True

    def idle_wait(self) -> float:
        """Seconds until an idle engine's next turn is due (0: now; while the repack
        cache is written, a moment: ask again)."""
        if self._writing():
            return 0.1
        return max(IDLE_WAIT_S - (time.perf_counter() - self._busy_at), 0.0)

    def _writing(self) -> bool:
        writer = getattr(self.model, "repack_cache_writer", None)
        return writer is not None and bool(writer.is_alive())

    def advance(self, busy: bool) -> None:
        """One turn of the background measurement, if one is under way and due: when the
        engine has been idle for IDLE_WAIT_S; while it is ``busy``, only BUSY_WAIT_S after
        its last idle turn and while this busy stretch's turns took under
        BACKGROUND_SHARE of it. Not while a first load's repack cache is written (a
        timing beside the disk writes would be wrong for good)."""
        job = self._job
        if job is None:
            return
        if self._writing():
            return
        now = time.perf_counter()
        if not busy:
            if now - self._busy_at < IDLE_WAIT_S:
                return
            self._idle_at, self._busy_run_s = now, 0.0
        else:
            self._busy_at = now
            if self._idle_at is None:  # (busy from the first call on)
                self._idle_at = now
            stretch = now - self._idle_at
            if stretch < BUSY_WAIT_S or self._busy_run_s > BACKGROUND_SHARE * stretch:
                return
        before = job.run_s
        done = job.turn()
        if busy:
            self._busy_run_s += job.run_s - before
        if done:
            self._finish(raise_error=False)

    def _finish(self, *, raise_error: bool) -> None:
        job, self._job = self._job, None
        assert job is not None and job.done
        if job.result is not None:
            self._curve = job.result
            self._say(f"cost curve measured in the background ({job.run_s:.0f} s of "
                      "forwards); cost-aware drafting uses it from now on")
            return
        if raise_error and job.error is not None:
            raise job.error
        # (A failure in the background: the server keeps serving, its drafts priced by
        # the prior; the next start measures again.)
        self._curve, self._failed = job.prior or UNPRICED, True
        self._say(f"measuring the cost curve failed ({job.error!r}); drafts stay priced "
                  "by the conservative prior until the next start")

    def cancel(self) -> None:
        """Stop a background measurement (its thread ends, its scratch memory freed)."""
        job, self._job = self._job, None
        if job is not None:
            job.cancel()
