"""A cost curve measured in the background, in turns (cost/job.py): the job
runs only inside its owner's turns, one forward a turn, its timings untouched by the
owner's work between turns, and its prior prices rows at least at the probe's chord."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from helpers.calibration import LARGE, MID, SMALL, Cost, TimedBigram, fake_clock

from recallspec.cost import calibration as cc
from recallspec.cost.curve import CostCurve, CostGrid
from recallspec.cost.job import PRIOR_MARGIN, UNPRICED, CurveJob, prior_from_probe
from recallspec.runtime.batch import SequenceInput, build_batch


def test_the_job_runs_only_inside_turns_one_step_a_turn() -> None:
    log: list[str] = []
    owner = threading.current_thread()

    def measure(pause: cc.Tick, on_probe: object) -> CostCurve:
        for i in range(3):
            assert threading.current_thread() is not owner
            log.append(f"job {i}")
            pause()
        return UNPRICED

    job = CurveJob(measure)
    log.append("owner")  # (the job has not started: no turn yet)
    turns = 0
    while not job.turn():
        turns += 1
        log.append("owner")
    assert log == ["owner", "job 0", "owner", "job 1", "owner", "job 2", "owner"]
    assert turns == 3 and job.result is UNPRICED and job.error is None
    assert job.turn()  # done stays done


def test_an_error_is_reported_and_a_cancelled_job_ends() -> None:
    def fails(pause: cc.Tick, on_probe: object) -> CostCurve:
        pause()
        raise RuntimeError("out of memory")

    job = CurveJob(fails)
    assert not job.turn() and job.turn()
    assert isinstance(job.error, RuntimeError) and job.result is None

    steps: list[int] = []

    def endless(pause: cc.Tick, on_probe: object) -> CostCurve:
        while True:
            steps.append(1)
            pause()

    job = CurveJob(endless)
    for _ in range(3):
        job.turn()
    job.cancel()
    assert job.done and job.result is None and job.error is None and len(steps) == 3
    job.cancel()  # idempotent


@pytest.mark.parametrize("cost", [SMALL, LARGE], ids=["135M", "8B"])
def test_a_curve_measured_in_turns_is_the_one_measured_at_once(
    cost: Cost, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """On a fake clock: the owner runs forwards of its own between the job's turns (as
    the engine's steps); had a pause point been inside a timing, their time would be in
    the curve. The job pauses after every forward, and reports the probe first."""
    clock = fake_clock(monkeypatch)
    want = cc.calibrate(TimedBigram(cost, clock), 1, busy=lambda: False)
    model = TimedBigram(cost, clock)
    path = tmp_path / "curve.json"
    said: list[str] = []
    job = CurveJob(lambda pause, on_probe: cc.calibrate(
        model, 1, key="k", cache_path=path, busy=lambda: False, pause=pause,
        on_probe=on_probe, say=said.append))
    mine = TimedBigram(Cost(1.0, 1.0), clock)  # the owner's forwards: a second a row
    cache = mine.new_cache(1, 8)
    slot = cache.allocate()
    turns = 0
    while not job.turn():
        turns += 1
        # The probe's five forwards, then (in the sixth turn) its prices are reported.
        assert (job.prior is None) == (turns <= 5)
        mine(build_batch([SequenceInput(slot, 0, [1, 2, 3])]), cache)
    expected = prior_from_probe(cost.probe()).decode
    assert job.prior is not None and job.prior.decode is not None and expected is not None
    assert np.allclose(job.prior.decode.seconds, expected.seconds)
    got = job.result
    assert got is not None and job.error is None
    assert got.tokens == want.tokens and np.allclose(got.seconds, want.seconds)
    assert np.allclose(got.decode.seconds, want.decode.seconds)  # type: ignore[union-attr]
    assert np.allclose(got.prefill.seconds, want.prefill.seconds)  # type: ignore[union-attr]
    assert got.per_seq == pytest.approx(want.per_seq)
    assert turns >= model.calls - 1 and path.is_file()  # a turn per forward
    # The plan is said; no progress lines (the wall time is mostly the owner's).
    assert said[0].startswith("measuring the verification cost curve")
    assert not any("% measured" in line for line in said)


@pytest.mark.parametrize("cost", [SMALL, MID, LARGE], ids=["135M", "1.7B", "8B"])
def test_the_prior_prices_rows_at_the_margin_over_the_chord(cost: Cost) -> None:
    probe = cost.probe()
    prior = prior_from_probe(probe)
    for context in (0, 256, 1024, 3000):
        one = probe(1, context)
        chord = (probe(32, context) - one) / 31
        for rows in (1, 2, 8, 16, 32, 64):
            if rows <= 32:  # (past the probe's rows: its slope at the reference context)
                assert prior(rows, 1, context) == pytest.approx(
                    one + PRIOR_MARGIN * chord * (rows - 1))
            # (These fake models cost exactly their chord: the prior is dearer.)
            assert prior(rows, 1, context) >= cost(rows, context) * (1 - 1e-9)
    assert isinstance(prior.decode, CostGrid) and prior.per_seq == 0.0
