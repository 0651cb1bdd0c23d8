"""``bench replay --predict-time``: tokens/s of drafting policies predicted from recorded
``ar`` answers and the calibrated cost curve, without running the model.

Each policy is replayed exactly (``bench/replay/exact.py``) and its turns priced by the
time model (``bench/replay/time_model.py``), fitted on the recorded run
(``bench/replay/fit.py``); where the policies' own answers were recorded too, the
prediction's error is reported beside it. Another model's answers
(``bench/replay/foreign.py``) are priced by the curve alone, nothing fitted or compared.
Tokens/s are reported as the bench report does: the mean over questions of each
question's tokens / seconds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from recallspec.bench.common.answers import answers_path, read_answers
from recallspec.bench.replay.exact import ReplayConfig
from recallspec.bench.replay.fit import curve_time_model, fit_row_overhead, fit_time_model
from recallspec.bench.replay.foreign import refuse_row_fit
from recallspec.bench.replay.logits import TurnTopk
from recallspec.bench.replay.policies import make_policy
from recallspec.bench.replay.time_model import TimeModel, TurnSim, simulate
from recallspec.cost.curve import CostCurve
from recallspec.errors import DataError
from recallspec.markdown import table_lines


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
    methods: Sequence[str], answers_dir: Path | None, *, count_policy_time: bool = True,
    topk: dict[str, list[TurnTopk]] | None = None, vocab: int = 0,
    row_fit: str | None = "auto", warn: Callable[[str], None] = lambda msg: None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(time-model fit, {method: ``predict``}, {method: ``real_speeds``} for methods whose
    answers ``answers_dir`` holds): ``bench replay --predict-time``.

    ``row_fit``: where ``row_overhead`` comes from: "auto" fits it, for each method, on
    the runs of the OTHER listed drafting methods that were recorded (all of them for a
    method that was not); a method name fits it on that one run (its own error is then
    in-sample); None leaves it out. ``answers_dir`` None: ``records`` are another
    model's answers (``bench/replay/foreign.py``), which no run here recorded: they are
    priced by the curve alone (``fit.py: curve_time_model``), nothing is fitted and
    nothing compared."""
    if answers_dir is None:
        refuse_row_fit(row_fit)
        row_fit = None
        tm, fit_stats = curve_time_model(curve)
    else:
        tm, fit_stats = fit_time_model(curve, records)
    tm = replace(tm, count_policy_time=count_policy_time)
    sims: dict[str, dict[str, list[TurnSim]]] = {}
    recorded: dict[str, list[dict[str, Any]]] = {}
    for m in methods:
        spec = make_policy(m, cfg, curve, tm.step_overhead)
        if spec.approximate:
            warn(f"{m}: its drafter learns from verification logits; replay "
                 + ("feeds it the committed rows only" if topk else "has none (--model-topk)")
                 + ": an approximation")
        sims[m] = simulate(records, spec.build(), cfg, topk=topk, vocab=vocab)
        if answers_dir is None:
            continue
        path = answers_path(answers_dir, "ar" if m in ("ar", "none") else m)
        if path.is_file():
            recorded[m] = read_answers(path)
    drafting = [m for m in methods if m not in ("ar", "none") and m in recorded]
    if row_fit not in (None, "auto") and row_fit not in drafting:
        raise DataError(f"--fit-rows-on {row_fit}: not a listed drafting method with "
                        f"recorded answers in {answers_dir} ({', '.join(drafting) or 'none'})")
    fit: dict[str, Any] = dict(fit_stats)
    fit["row_fit"] = row_fit
    fit["row_overhead_ms"] = {}
    pred: dict[str, Any] = {}
    for m in methods:
        tm_m = tm
        if row_fit is not None and m not in ("ar", "none"):
            on = [row_fit] if row_fit != "auto" else [x for x in drafting if x != m] or drafting
            if on:
                tm_m, _ = fit_row_overhead(tm, records, [(sims[x], recorded[x]) for x in on])
            fit["row_overhead_ms"][m] = tm_m.row_overhead * 1e3
        pred[m] = predict(records, sims[m], tm_m)
    real = {m: real_speeds(records, recorded[m]) for m in methods if m in recorded}
    return fit, pred, real


def render_prediction_markdown(
    pred: dict[str, dict[str, dict[str, Any]]], real: dict[str, dict[str, float]],
    baseline: str | None = "ar", fitted: str | None = None, curve_only: bool = False,
) -> str:
    """Per category: predicted tokens/s of each method (speedup over ``baseline`` where
    it was predicted too), and recorded tokens/s with the prediction's error;
    ``fitted``: a method the row term was fitted on alone (marked: in-sample);
    ``curve_only``: the time model is the curve alone (another model's answers)."""
    methods = list(pred)
    if not methods:
        return ""
    cats = list(pred[methods[0]])
    heads = [f"{m} (row fit)" if m == fitted else m for m in methods]
    rows = []
    for c in cats:
        cells = [c]
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
        rows.append(cells)
    lines = [*table_lines(["category", *heads], rows), ""]
    if curve_only:
        lines.append("Cells: predicted tokens/s (speedup over predicted ar), MAT = tokens "
                     "per step, d = draft nodes per step. Another model's answers, "
                     "retokenized: each step and prefill is priced by the cost curve alone "
                     "(no run recorded here to fit overheads on, none to compare with).")
        return "\n".join(lines) + "\n"
    lines.append("Cells: predicted tokens/s (speedup over predicted ar), MAT = tokens per "
                 "step, d = draft nodes per step, [recorded tokens/s, prediction error]. "
                 "The time model's scales, step and turn terms are fitted on ar; its "
                 "per-draft-row term on the other recorded drafting methods, or on the "
                 "one marked (row fit), whose error is then in-sample.")
    return "\n".join(lines) + "\n"
