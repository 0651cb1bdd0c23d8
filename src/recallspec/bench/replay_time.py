"""Policy replay with time prediction: tokens/s of a drafting policy from recorded
``ar`` answers and the calibrated cost curve, without running the model.

Under greedy decoding every lossless method commits the AR tokens, so a replayed
policy's steps (``bench/replay.py``: tokens committed, draft rows, cached context) are
the engine's. A turn's seconds are then predicted as

    prefill(prompt) + prompt_overhead * prompt tokens
        + sum over steps [ curve(1 + drafted, context) + step_overhead + the policy's time ]

* ``prefill``: the prompt in ``prefill_chunk``-token chunks, each priced by the curve's
  prefill grid at the position it starts (last row's logits only);
* ``curve(rows, context)``: one verification forward (all rows' logits) after
  ``context`` cached tokens (the curve's decode grid, ``runtime/cost_curve.py``);
* ``step_overhead``, ``prompt_overhead``: what a step (sampling, commit, detokenising,
  bookkeeping) and a prompt token (chunking, batch building, the drafter's indexing)
  cost beyond the forwards, fitted on the recorded ``ar`` wall times
  (``fit_time_model``): AR has no drafts, so the fit never sees a policy's rows and
  predicting the drafting methods is a test of the model, not a fit to them;
* the policy's own time (proposing, sizing, observing): measured while replaying, the
  same Python code the engine runs (``count_policy_time``; off for load-free
  comparisons).

Tokens/s are reported as the bench report does: the mean over questions of each
question's tokens / seconds.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import count
from pathlib import Path
from typing import Any

import numpy as np

from recallspec.bench.replay import Policy, ReplayConfig, StepRecord, replay_steps
from recallspec.bench.replay_logits import TurnTopk
from recallspec.runtime.cost_curve import CostCurve

PREFILL_CHUNK = 512  # EngineConfig.prefill_chunk


@dataclass(frozen=True)
class TimeModel:
    curve: CostCurve
    step_overhead: float = 0.0  # seconds a decoding step takes beyond its forward
    prompt_overhead: float = 0.0  # seconds per prompt token beyond the prefill forwards
    prefill_chunk: int = PREFILL_CHUNK
    count_policy_time: bool = True  # add the policy's measured seconds

    def prefill(self, prompt_len: int) -> float:
        t, s = 0.0, 0
        while s < prompt_len:
            n = min(self.prefill_chunk, prompt_len - s)
            t += self.curve.prefill_cost(n, s)
            s += n
        return t

    def forwards(self, steps: Sequence[StepRecord]) -> float:
        return sum(self.curve(1 + s.drafted, 1, s.context) for s in steps)

    def turn(self, sim: TurnSim) -> float:
        t = self.prefill(sim.prompt_len) + self.forwards(sim.steps)
        t += self.step_overhead * len(sim.steps) + self.prompt_overhead * sim.prompt_len
        return t + (sim.policy_s if self.count_policy_time else 0.0)


@dataclass(frozen=True)
class TurnSim:
    prompt_len: int
    new_tokens: int  # generated tokens, EOS excluded (the answer's new_tokens)
    steps: tuple[StepRecord, ...]
    policy_s: float = 0.0  # measured seconds in the policy's calls


def _turns(rec: dict[str, Any]) -> list[tuple[list[int], list[int], bool]]:
    c = rec["choices"][0]
    return [(list(p), list(t), f == "eos")
            for p, t, f in zip(c["prompt_ids"], c["token_ids"], c["finish_reason"], strict=True)]


class _Timed:
    """Wraps a policy, summing the seconds spent in its calls."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.name = policy.name
        self.seconds = 0.0

    def _time(self, fn: Any, *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds += time.perf_counter() - t0

    def start(self, *a: Any) -> None:
        self._time(self.policy.start, *a)

    def draft(self, *a: Any) -> Any:
        return self._time(self.policy.draft, *a)

    def observe(self, *a: Any) -> None:
        self._time(self.policy.observe, *a)

    def stop(self, *a: Any) -> None:
        self._time(self.policy.stop, *a)


def simulate(
    records: Sequence[dict[str, Any]], policy: Policy, cfg: ReplayConfig, *,
    warmup: int = 16, topk: dict[str, list[TurnTopk]] | None = None, vocab: int = 0,
) -> dict[str, list[TurnSim]]:
    """question_id -> each turn's simulated steps, questions in record order through ONE
    policy (one engine answers a whole run: its planner's prior carries over).

    ``warmup``: first replay the bench's untimed warm-up, the first question's first turn
    cut to ``warmup`` tokens (0: none), as it too teaches the planner. ``topk``/``vocab``:
    the model's top-k along the answers (``bench/replay_logits.py``)."""
    rids = count()
    timed = _Timed(policy)
    eos = records[0].get("eos_token_ids") or [] if records else []
    if warmup and records:
        prompt, toks, _ = _turns(records[0])[0]
        short = ReplayConfig(min(warmup, cfg.max_new_tokens), cfg.max_draft_nodes, cfg.max_len)
        tk = None if topk is None else topk[str(records[0]["question_id"])][0]
        replay_steps(policy, next(rids), prompt, toks[:warmup], False, eos, short, tk, vocab)
    out: dict[str, list[TurnSim]] = {}
    for rec in records:
        sims = []
        qid = str(rec["question_id"])
        for t, (prompt, toks, hit) in enumerate(_turns(rec)):
            timed.seconds = 0.0
            tk = None if topk is None else topk[qid][t]
            steps = replay_steps(timed, next(rids), prompt, toks, hit,
                                 rec.get("eos_token_ids") or [], cfg, tk, vocab)
            sims.append(TurnSim(len(prompt), len(toks), tuple(steps), timed.seconds))
        out[str(rec["question_id"])] = sims
    return out


def ar_sims(records: Sequence[dict[str, Any]]) -> dict[str, list[TurnSim]]:
    """The ``ar`` method's own steps (one token each), straight from the answers."""
    out: dict[str, list[TurnSim]] = {}
    for rec in records:
        sims = []
        for prompt, toks, hit in _turns(rec):
            n = len(toks) + int(hit)  # an EOS is committed by a step too
            steps = tuple(StepRecord(1, 0, len(prompt) + j - 1) for j in range(1, n))
            sims.append(TurnSim(len(prompt), len(toks), steps))
        out[str(rec["question_id"])] = sims
    return out


def fit_time_model(
    curve: CostCurve, records: Sequence[dict[str, Any]], *, prefill_chunk: int = PREFILL_CHUNK,
) -> tuple[TimeModel, dict[str, float]]:
    """``step_overhead`` and ``prompt_overhead`` from the recorded ar wall times minus
    the curve's prefill and forwards, regressed on [steps, prompt tokens] by least
    absolute deviations (iteratively reweighted): a turn that another job slowed is a
    one-sided outlier, which would drag a least-squares fit. (A constant per turn fits
    no better and goes negative.) Returns the model and fit statistics."""
    base = TimeModel(curve, prefill_chunk=prefill_chunk, count_policy_time=False)
    rows: list[tuple[float, float, float, float]] = []  # (steps, prompt, wall, curve's s)
    for rec, sims in zip(records, ar_sims(records).values(), strict=True):
        for sim, wall in zip(sims, rec["choices"][0]["wall_time"], strict=True):
            rows.append((len(sim.steps), sim.prompt_len, float(wall), base.turn(sim)))
    x = np.asarray([[s, p] for s, p, _, _ in rows], dtype=np.float64)
    y = np.asarray([w - c for _, _, w, c in rows])
    w = np.ones(len(y))
    coef = np.zeros(2)
    for _ in range(50):
        sw = np.sqrt(w)
        coef = np.linalg.lstsq(x * sw[:, None], y * sw, rcond=None)[0]
        w = 1.0 / np.maximum(np.abs(y - x @ coef), 1e-4)
    step, prompt = max(float(coef[0]), 0.0), max(float(coef[1]), 0.0)
    model = np.asarray([c for _, _, _, c in rows]) + x @ np.asarray([step, prompt])
    slowed = np.asarray([w for _, _, w, _ in rows]) > 1.25 * model  # another job slowed it
    tm = TimeModel(curve, step, prompt, prefill_chunk)
    return tm, {"turns": float(len(y)), "disturbed": float(slowed.sum()),
                "step_overhead_ms": step * 1e3, "prompt_overhead_ms": prompt * 1e3}


def predict(
    records: Sequence[dict[str, Any]], sims: dict[str, list[TurnSim]], tm: TimeModel,
) -> dict[str, dict[str, Any]]:
    """{category | "overall": {"questions", "mat", "drafted", "tokens_per_s", "seconds",
    "policy_ms"}}: predicted per-question tokens/s averaged like the bench report."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(r["category"], []).append(r)
    groups["overall"] = list(records)
    out: dict[str, dict[str, Any]] = {}
    for cat, recs in groups.items():
        turns = [t for r in recs for t in sims[str(r["question_id"])]]
        steps = [s for t in turns for s in t.steps]
        speeds = []
        for r in recs:
            ts = sims[str(r["question_id"])]
            secs = sum(tm.turn(t) for t in ts)
            speeds.append(sum(t.new_tokens for t in ts) / secs if secs > 0 else 0.0)
        out[cat] = {
            "questions": len(recs),
            "mat": statistics.fmean(s.committed for s in steps) if steps else None,
            "drafted": statistics.fmean(s.drafted for s in steps) if steps else None,
            "tokens_per_s": statistics.fmean(speeds) if speeds else None,
            "seconds": sum(tm.turn(t) for t in turns),
            "policy_ms": 1e3 * sum(t.policy_s for t in turns) / max(len(steps), 1),
        }
    return out


def real_speeds(
    records: Sequence[dict[str, Any]], answers: Sequence[dict[str, Any]],
) -> dict[str, float]:
    """{category | "overall": recorded tokens/s} of a method's answers on the questions
    of ``records`` (the bench report's mean of per-question speeds)."""
    by = {str(a["question_id"]): a for a in answers}
    groups: dict[str, list[float]] = {}
    for r in records:
        a = by.get(str(r["question_id"]))
        if a is None:
            continue
        c = a["choices"][0]
        t = sum(c["wall_time"])
        v = sum(c["new_tokens"]) / t if t > 0 else 0.0
        groups.setdefault(r["category"], []).append(v)
        groups.setdefault("overall", []).append(v)
    return {k: statistics.fmean(v) for k, v in groups.items()}


def predict_methods(
    records: Sequence[dict[str, Any]], cfg: ReplayConfig, curve: CostCurve,
    methods: Sequence[str], answers_dir: Path, *, count_policy_time: bool = True,
    topk: dict[str, list[TurnTopk]] | None = None, vocab: int = 0,
    warn: Callable[[str], None] = lambda msg: None,
) -> tuple[dict[str, float], dict[str, Any], dict[str, Any]]:
    """(time-model fit, {method: ``predict``}, {method: ``real_speeds``} for methods whose
    answers ``answers_dir`` holds): ``bench replay --predict-time``."""
    from recallspec.bench.answers import answers_path, read_answers
    from recallspec.bench.replay_policies import make_policy

    tm, fit = fit_time_model(curve, records)
    tm = replace(tm, count_policy_time=count_policy_time)
    pred: dict[str, Any] = {}
    real: dict[str, Any] = {}
    for m in methods:
        spec = make_policy(m, cfg, curve, tm.step_overhead)
        if spec.approximate:
            warn(f"{m}: its drafter learns from verification logits; replay "
                 + ("feeds it the committed rows only" if topk else "has none (--model-topk)")
                 + ": an approximation")
        pred[m] = predict(records, simulate(records, spec.build(), cfg, topk=topk, vocab=vocab),
                          tm)
        recorded = answers_path(answers_dir, "ar" if m in ("ar", "none") else m)
        if recorded.is_file():
            real[m] = real_speeds(records, read_answers(recorded))
    return fit, pred, real


def render_prediction_markdown(
    pred: dict[str, dict[str, dict[str, Any]]], real: dict[str, dict[str, float]],
    baseline: str | None = "ar",
) -> str:
    """Per category: predicted tokens/s of each method (speedup over ``baseline`` where
    it was predicted too), and recorded tokens/s with the prediction's error."""
    methods = list(pred)
    if not methods:
        return ""
    cats = list(pred[methods[0]])
    lines = ["| category | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for c in cats:
        cells = []
        for m in methods:
            p = pred[m][c]
            v = p["tokens_per_s"]
            cell = f"{v:.1f}"
            if baseline in pred and m != baseline:
                cell += f" ({v / pred[baseline][c]['tokens_per_s']:.2f}x)"
            cell += f" MAT {p['mat']:.2f} d {p['drafted']:.1f}"
            got = real.get(m, {}).get(c)
            if got:
                cell += f" [real {got:.1f}, {100 * (v - got) / got:+.1f}%]"
            cells.append(cell)
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Cells: predicted tokens/s (speedup over predicted ar), MAT = tokens per "
                 "step, d = draft nodes per step, [recorded tokens/s, prediction error].")
    return "\n".join(lines) + "\n"
