"""Policy replay with time prediction: tokens/s of a drafting policy from recorded
``ar`` answers and the calibrated cost curve, without running the model.

Under greedy decoding every lossless method commits the AR tokens, so a replayed
policy's steps (``bench/replay.py``: tokens committed, draft rows, cached context) are
the engine's. A turn's seconds are then predicted as

    turn_overhead + prefill_scale * prefill(prompt) + prompt_overhead * prompt tokens
        + sum over steps [ forward_scale * curve(1 + drafted, context) + step_overhead
                           + row_overhead * drafted + the policy's time ]

* ``prefill``: the prompt in ``prefill_chunk``-token chunks, each priced by the curve's
  prefill grid at the position it starts (last row's logits only);
* ``curve(rows, context)``: one verification forward (all rows' logits) after
  ``context`` cached tokens (the curve's decode grid, ``runtime/cost_curve.py``);
* the scales, ``step_overhead`` and the per-turn / per-prompt-token terms are fitted
  on the recorded ``ar`` run (``bench/replay_fit.py``): the machine's speed during the
  run against the calibration (a shared VM drifts by 10-20% within minutes), and what a
  step (sampling, commit, detokenising, bookkeeping) and a turn cost beyond the
  forwards. AR has no drafts, so that fit never sees a policy's rows;
* ``row_overhead``: what a draft row costs beyond the curve's price of it (most of it
  in the forwards themselves: a 17-row verification inside decoding ran 1.11x its
  calibrated time while a 1-row one ran 0.93-1.06x; ~0.025 ms a row in verification
  and commit). AR cannot show it, so it is fitted on the other recorded drafting
  methods' runs (``bench/replay_fit.py``: each method is predicted with a row term
  fitted without it, so every error tests the model);
* the policy's own time (proposing, sizing, observing): measured while replaying, the
  same Python code the engine runs (``count_policy_time``; off for load-free
  comparisons).

Tokens/s are reported as the bench report does: the mean over questions of each
question's tokens / seconds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import count
from pathlib import Path
from typing import Any

from recallspec.bench.replay import Policy, ReplayConfig, StepRecord, replay_steps
from recallspec.bench.replay_logits import TurnTopk
from recallspec.errors import DataError
from recallspec.runtime.cost_curve import CostCurve

PREFILL_CHUNK = 512  # EngineConfig.prefill_chunk


@dataclass(frozen=True)
class TimeModel:
    curve: CostCurve
    step_overhead: float = 0.0  # seconds a decoding step takes beyond its forward
    prompt_overhead: float = 0.0  # seconds per prompt token beyond the prefill forwards
    prefill_chunk: int = PREFILL_CHUNK
    count_policy_time: bool = True  # add the policy's measured seconds
    row_overhead: float = 0.0  # seconds a draft row costs beyond the curve's price of it
    forward_scale: float = 1.0  # the run's decode forwards / the curve's
    prefill_scale: float = 1.0  # the run's prefill / the curve's
    turn_overhead: float = 0.0  # seconds per turn beyond prefill and steps

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
        t = self.turn_overhead + self.prefill_scale * self.prefill(sim.prompt_len)
        t += self.forward_scale * self.forwards(sim.steps)
        t += self.step_overhead * len(sim.steps) + self.prompt_overhead * sim.prompt_len
        t += self.row_overhead * sum(s.drafted for s in sim.steps)
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
    eos = records[0].get("eos_token_ids") or [] if records else []
    if warmup and records:
        prompt, toks, _ = _turns(records[0])[0]
        short = replace(cfg, max_new_tokens=min(warmup, cfg.max_new_tokens))
        tk = None if topk is None else topk[str(records[0]["question_id"])][0]
        replay_steps(policy, next(rids), prompt, toks[:warmup], False, eos, short, tk, vocab)
    out: dict[str, list[TurnSim]] = {}
    for rec in records:
        sims = []
        qid = str(rec["question_id"])
        for t, (prompt, toks, hit) in enumerate(_turns(rec)):
            policy.seconds = 0.0  # (``replay_steps`` sums the policy's time)
            tk = None if topk is None else topk[qid][t]
            steps = replay_steps(policy, next(rids), prompt, toks, hit,
                                 rec.get("eos_token_ids") or [], cfg, tk, vocab)
            sims.append(TurnSim(len(prompt), len(toks), tuple(steps), policy.seconds))
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
    row_fit: str | None = "auto", warn: Callable[[str], None] = lambda msg: None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(time-model fit, {method: ``predict``}, {method: ``real_speeds``} for methods whose
    answers ``answers_dir`` holds): ``bench replay --predict-time``.

    ``row_fit``: where ``row_overhead`` comes from: "auto" fits it, for each method, on
    the runs of the OTHER listed drafting methods that were recorded (all of them for a
    method that was not); a method name fits it on that one run (its own error is then
    in-sample); None leaves it out."""
    from recallspec.bench.answers import answers_path, read_answers
    from recallspec.bench.replay_fit import fit_row_overhead, fit_time_model
    from recallspec.bench.replay_policies import make_policy

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
    baseline: str | None = "ar", fitted: str | None = None,
) -> str:
    """Per category: predicted tokens/s of each method (speedup over ``baseline`` where
    it was predicted too), and recorded tokens/s with the prediction's error;
    ``fitted``: a method the row term was fitted on alone (marked: in-sample)."""
    methods = list(pred)
    if not methods:
        return ""
    cats = list(pred[methods[0]])
    heads = [f"{m} (row fit)" if m == fitted else m for m in methods]
    lines = ["| category | " + " | ".join(heads) + " |", "|---|" + "---|" * len(methods)]
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
                 "step, d = draft nodes per step, [recorded tokens/s, prediction error]. "
                 "The time model's scales, step and turn terms are fitted on ar; its "
                 "per-draft-row term on the other recorded drafting methods, or on the "
                 "one marked (row fit), whose error is then in-sample.")
    return "\n".join(lines) + "\n"
