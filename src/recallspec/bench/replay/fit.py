"""Fitting policy replay's time model (``bench/replay/time_model.py``) to a recorded run.

Two fits, so that predicting a drafting method tests the model rather than fits it:

* ``fit_time_model``, on the ``ar`` answers only. Where the run recorded our engine's
  split of each turn (``timing``: decode steps, seconds inside their forwards, the
  decode steps' wall time; ``bench/suite/methods.py:engine_timing``) each term is read
  off separately: ``forward_scale`` = median over turns of (forward seconds / the
  curve's price of the same steps), the machine's speed during the run against the
  calibration (a shared VM drifts within minutes, so a curve measured earlier is off by
  as much); ``step_overhead`` = median of (decode wall - forwards) / steps; and the
  rest of a turn (prefill, set-up) regressed on the curve's prefill price
  (``prefill_scale``) and a constant (``turn_overhead``). Older runs without ``timing``
  get the former fit: [steps, prompt tokens] on wall - curve.
* ``fit_row_overhead``, on drafting methods' answers: what a draft row costs beyond its
  (scaled) price in the curve, which AR cannot show.

All fits are least absolute deviations (medians): a turn another job slowed is a
one-sided outlier that would drag a least-squares fit.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from recallspec.bench.replay.time_model import PREFILL_CHUNK, TimeModel, TurnSim, ar_sims
from recallspec.cost.curve import CostCurve

DISTURBED = 1.25  # a turn this much slower than the model: another job ran meanwhile


def _walls(rec: dict[str, Any]) -> list[float]:
    """Per turn: the wall time that goes with ``timing`` (the first repeat's, where the
    run repeated turns), else the recorded (median) wall time."""
    c = rec["choices"][0]
    if "timing" in c and c.get("wall_time_repeats"):
        return [float(r[0]) for r in c["wall_time_repeats"]]
    return [float(w) for w in c["wall_time"]]


def _lad(x: npt.NDArray[np.float64], y: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Non-negative least-absolute-deviations coefficients of y ~ x (iteratively
    reweighted least squares); a column whose coefficient comes out negative is dropped
    and the others refitted."""
    cols = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while cols:
        xs = x[:, cols]
        w = np.ones(len(y))
        c: npt.NDArray[np.float64] = np.zeros(len(cols))
        for _ in range(50):
            sw = np.sqrt(w)
            c = np.asarray(np.linalg.lstsq(xs * sw[:, None], y * sw, rcond=None)[0], np.float64)
            w = 1.0 / np.maximum(np.abs(y - xs @ c), 1e-4)
        if (c >= 0).all():
            coef[cols] = c
            break
        cols.pop(int(np.argmin(c)))
    return coef


def fit_time_model(
    curve: CostCurve, records: Sequence[dict[str, Any]], *, prefill_chunk: int = PREFILL_CHUNK,
) -> tuple[TimeModel, dict[str, Any]]:
    """The time model of ``records`` (an ``ar`` run) and the fit's statistics."""
    base = TimeModel(curve, prefill_chunk=prefill_chunk, count_policy_time=False)
    turns = [(sim, wall, t)
             for rec, sims in zip(records, ar_sims(records).values(), strict=True)
             for sim, wall, t in zip(sims, _walls(rec),
                                     rec["choices"][0].get("timing") or [None] * len(sims),
                                     strict=True)]
    if turns and all(t is not None for _, _, t in turns):
        tm = _fit_split(base, turns)
        source = "timing"
    else:
        tm = _fit_walls(base, [(s, w) for s, w, _ in turns])
        source = "wall times"
    slowed = sum(w > DISTURBED * tm.turn(s) for s, w, _ in turns)
    return tm, {"source": source, "turns": float(len(turns)), "disturbed": float(slowed),
                "forward_scale": tm.forward_scale, "prefill_scale": tm.prefill_scale,
                "step_overhead_ms": tm.step_overhead * 1e3,
                "turn_overhead_ms": tm.turn_overhead * 1e3,
                "prompt_overhead_ms": tm.prompt_overhead * 1e3}


def curve_time_model(curve: CostCurve) -> tuple[TimeModel, dict[str, Any]]:
    """The time model of answers no run recorded here (another model's): the curve
    alone, at scale 1 and without overheads, and ``fit_time_model``'s statistics of it
    (``source`` "none")."""
    tm = TimeModel(curve, count_policy_time=False)
    return tm, {"source": "none", "turns": 0.0, "disturbed": 0.0,
                "forward_scale": tm.forward_scale, "prefill_scale": tm.prefill_scale,
                "step_overhead_ms": 0.0, "turn_overhead_ms": 0.0, "prompt_overhead_ms": 0.0}


def _fit_split(base: TimeModel, turns: list[tuple[TurnSim, float, Any]]) -> TimeModel:
    decoding = [(s, t) for s, _, t in turns if s.steps and t["steps"] > 0]
    scale = statistics.median(t["forward_s"] / base.forwards(s.steps) for s, t in decoding) \
        if decoding else 1.0
    step = statistics.median((t["decode_s"] - t["forward_s"]) / t["steps"]
                             for _, t in decoding) if decoding else 0.0
    x = np.asarray([[base.prefill(s.prompt_len), 1.0] for s, _, _ in turns])
    y = np.asarray([w - t["decode_s"] for _, w, t in turns])
    pre, const = _lad(x, y)
    return replace(base, forward_scale=scale, step_overhead=max(step, 0.0),
                   prefill_scale=float(pre), turn_overhead=float(const))


def _fit_walls(base: TimeModel, turns: list[tuple[TurnSim, float]]) -> TimeModel:
    if not turns:
        return base
    x = np.asarray([[len(s.steps), s.prompt_len] for s, _ in turns], dtype=np.float64)
    y = np.asarray([w - base.turn(s) for s, w in turns])
    step, prompt = _lad(x, y)
    return replace(base, step_overhead=float(step), prompt_overhead=float(prompt))


def fit_row_overhead(
    tm: TimeModel, records: Sequence[dict[str, Any]],
    runs: Sequence[tuple[dict[str, list[TurnSim]], Sequence[dict[str, Any]]]],
) -> tuple[TimeModel, dict[str, float]]:
    """``row_overhead`` from drafting methods' recorded wall times: ``runs`` = (replayed
    turns, recorded answers) per method. The least-absolute-deviations slope through the
    origin of each turn's residual (wall - ``tm``'s prediction without row overhead) on
    its draft rows, i.e. the rows-weighted median of residual / rows. Turns without rows
    carry no information."""
    base = replace(tm, row_overhead=0.0)
    ratio: list[float] = []
    weight: list[float] = []
    for sims, answers in runs:
        by = {str(a["question_id"]): a for a in answers}
        for rec in records:
            qid = str(rec["question_id"])
            if qid not in by:
                continue
            for sim, wall in zip(sims[qid], by[qid]["choices"][0]["wall_time"], strict=False):
                rows = sum(s.drafted for s in sim.steps)
                if rows > 0:
                    ratio.append((float(wall) - base.turn(sim)) / rows)
                    weight.append(float(rows))
    if not ratio:
        return base, {"row_overhead_ms": 0.0, "row_fit_turns": 0.0}
    order = np.argsort(ratio)
    cum = np.cumsum(np.asarray(weight)[order])
    row = max(float(np.asarray(ratio)[order][int(np.searchsorted(cum, cum[-1] / 2))]), 0.0)
    return replace(tm, row_overhead=row), {"row_overhead_ms": row * 1e3,
                                           "row_fit_turns": float(len(ratio))}
