"""The engine's cost curve measured in the background (cost/source.py): requests
are served at once with the prior, outputs as plain decoding's; the measurement takes
idle turns and a bounded share of busy time, is cached, and a later engine reads it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from helpers import ByteTokenizer
from helpers.calibration import SMALL, TimedBigram, fake_clock
from helpers.engine import PROMPTS, bigram_table

from recallspec.cost import job as curve_job
from recallspec.cost import source as cost_source
from recallspec.cost.job import UNPRICED
from recallspec.decoding.sampling import SamplingParams
from recallspec.engine import Engine, EngineConfig, GenerationResult


def timed_engine(clock: list[float]) -> Engine:
    return Engine(TimedBigram(SMALL, clock, bigram_table()), ByteTokenizer(),
                  EngineConfig(drafter="pld", mode="adaptive"))


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[float]:
    """A fake clock for the measurement and its turns; a fresh cache directory."""
    monkeypatch.setenv("RECALLSPEC_CACHE_DIR", str(tmp_path))
    c = fake_clock(monkeypatch)
    fake = SimpleNamespace(perf_counter=lambda: c[0])
    monkeypatch.setattr(cost_source, "time", fake)
    monkeypatch.setattr(curve_job, "time", fake)
    return c


def test_served_at_once_measured_in_idle_turns_then_cached(
    clock: list[float], tmp_path: Path,
) -> None:
    eng = timed_engine(clock)
    assert eng.curves.state == "none"
    assert eng.start_cost_curve() and eng.curves.state == "measuring"
    assert eng.curves.current() is UNPRICED  # (nothing timed yet)
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    # Requests while it is measured: no forward of the measurement before they run, and
    # their tokens are plain decoding's.
    rids = [eng.add_request(list(p), params) for p in PROMPTS]
    assert eng.model.calls == 0 and eng.curves.state == "measuring"
    outs: dict[int, list[int]] = {r: [] for r in rids}
    while eng.has_unfinished():
        for o in eng.step():
            outs[o.rid] += o.new_token_ids
        eng.curves.advance(busy=eng.has_unfinished())
    for rid, p in zip(rids, PROMPTS, strict=True):
        ar = eng.generate(list(p), params, drafter="none")
        assert isinstance(ar, GenerationResult) and outs[rid] == ar.token_ids
    before = eng.curves._job.run_s if eng.curves._job else None
    eng.curves.advance(busy=False)  # idle, but only just: no turn yet
    assert eng.curves._job is not None and eng.curves._job.run_s == before
    clock[0] += cost_source.IDLE_WAIT_S
    while eng.curves.state == "measuring":  # idle long enough: a turn after another
        eng.curves.advance(busy=False)
    curve = eng.curves.current()
    assert curve is not UNPRICED and eng.cost_curve() is curve and curve.decode is not None
    files = list((tmp_path / "cost_curves").glob("*.json"))
    assert len(files) == 1
    calls = eng.model.calls
    again = timed_engine(clock)
    again.model.calls = 0
    assert not again.start_cost_curve() and again.curves.state == "measured"
    assert again.cost_curve().seconds == curve.seconds and again.model.calls == 0
    assert eng.model.calls == calls


def test_busy_turns_wait_then_take_a_bounded_share_and_close_stops_it(
    clock: list[float],
) -> None:
    """Busy from the start: no turn for BUSY_WAIT_S, then turns within the share of the
    busy stretch; an idle moment runs one at once and starts a new stretch."""
    eng = timed_engine(clock)
    assert eng.start_cost_curve()
    job = eng.curves._job
    assert job is not None
    t_start, longest = clock[0], 0.0
    for _ in range(1200):
        clock[0] += 0.05  # a step of the engine's requests
        before = job.run_s
        eng.curves.advance(busy=True)
        longest = max(longest, job.run_s - before)
        stretch = clock[0] - t_start - job.run_s  # (the turns' forwards advance the clock)
        if stretch < cost_source.BUSY_WAIT_S:
            assert job.run_s == 0.0
        # (At most one turn past the share: a turn is one forward, of unknown length.)
        assert job.run_s <= cost_source.BACKGROUND_SHARE * (clock[0] - t_start) + longest
    assert job.run_s > 0 and eng.curves.state == "measuring"
    before = job.run_s
    eng.curves.advance(busy=False)  # idle for a moment: no turn
    assert job.run_s == before
    clock[0] += cost_source.IDLE_WAIT_S
    eng.curves.advance(busy=False)  # idle for IDLE_WAIT_S: a turn
    assert job.run_s > before
    before = job.run_s
    eng.curves.advance(busy=True)  # a new busy stretch: it waits again
    assert job.run_s == before
    eng.close()
    assert job.done and job.result is None and eng.curves.state == "none"


def test_a_blocking_request_for_the_curve_finishes_the_background_one(
    clock: list[float],
) -> None:
    eng = timed_engine(clock)
    assert eng.start_cost_curve()
    for _ in range(3):
        eng.curves.advance(busy=False)
    curve = eng.cost_curve()  # (offline runs, benchmarks: the measured curve)
    assert eng.curves.state == "measured" and curve is not UNPRICED
    assert curve.decode is not None and len(curve.tokens) > 2


def test_with_background_set_a_curve_first_needed_later_is_measured_in_the_background(
    clock: list[float],
) -> None:
    """(``recallspec serve --drafter none``: a request naming a cost-aware drafter.)"""
    eng = timed_engine(clock)
    eng.curves.background = True
    eng.add_request(list(PROMPTS[0]), SamplingParams(max_new_tokens=4), drafter="none")
    assert eng.curves.state == "none"  # plain decoding needs no curve
    eng.add_request(list(PROMPTS[0]), SamplingParams(max_new_tokens=4))  # pld, cost-aware
    assert eng.curves.state == "measuring" and eng.model.calls == 0


def test_a_failed_background_measurement_keeps_the_prior_and_says_so(
    clock: list[float], capsys: pytest.CaptureFixture[str],
) -> None:
    class FailsAt32Rows(TimedBigram):  # the probe's 32-row forward (no request has 32)
        def __call__(self, meta: Any, cache: Any) -> torch.Tensor:
            if meta.num_tokens == 32:
                raise RuntimeError("out of memory")
            return super().__call__(meta, cache)

    eng = Engine(FailsAt32Rows(SMALL, clock, bigram_table()), ByteTokenizer(),
                 EngineConfig(drafter="pld", mode="adaptive"))
    assert eng.start_cost_curve()
    clock[0] += cost_source.IDLE_WAIT_S
    while eng.curves.state == "measuring":
        eng.curves.advance(busy=False)
    assert eng.curves.state == "failed" and eng.curves.current() is UNPRICED
    assert "measuring the cost curve failed" in capsys.readouterr().err
    r = eng.generate(list(PROMPTS[0]), SamplingParams(max_new_tokens=8, ignore_eos=True))
    ar = eng.generate(list(PROMPTS[0]), SamplingParams(max_new_tokens=8, ignore_eos=True),
                      drafter="none")
    assert isinstance(r, GenerationResult) and isinstance(ar, GenerationResult)
    assert r.token_ids == ar.token_ids


def test_plain_decoding_never_hashes_the_vocabulary() -> None:
    """The tokenizer's fingerprint (a hash over every token: ~0.6 s of a start at
    Gemma's 262k ids) is taken when a curve's cache key or an index needs it, not at
    load: the real default model loads and decodes without it, and the drafter context
    computes it on request."""
    eng = Engine.load(None, drafter="none")
    out = eng.generate("The capital of France is", SamplingParams(max_new_tokens=4))
    assert len(out.token_ids) == 4
    assert "fingerprint" not in vars(eng.tokenizer)  # (the cached_property's slot)
    fp = eng.drafter_context().tokenizer_fingerprint
    assert "fingerprint" in vars(eng.tokenizer) and fp == eng.tokenizer.fingerprint
    assert fp is not None and len(fp) == 64  # a sha256 in hex
