"""Predicted Spec-Bench speed of our methods at a model shape we have no weights for.

Under greedy decoding every lossless method commits the AR tokens, so which tokens a
policy accepts depends only on the answers, and what a step costs only on the model's
cost curve. ``bench replay --predict-time`` (``bench/replay/predict.py``) already prices a
replayed policy with a curve; here the two come from different models:

1. the time model's per-step, per-turn and per-row terms (the engine's Python work
   around each forward) are fitted on a real recorded run (SmolLM2's ``ar`` answers
   and its drafting methods' answers) against THAT model's own curve, and that run's
   prediction error is reported beside every prediction;
2. the policies are then replayed on the same answers with the SHAPE's measured curve
   (they size drafts by it, as the engine would at that shape) and every forward is
   priced by it at scale 1: the curve was measured in the same run as the prediction.

What this assumes, stated in every report: the acceptance of the real small model's
answers (a larger model's answers would differ), and per-step overheads independent of
the model's size (they are Python and bookkeeping; the vocabulary-wide steps grow with
the vocabulary, which the forwards in the curve include).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from recallspec.bench.replay.exact import ReplayConfig
from recallspec.bench.replay.policies import make_policy
from recallspec.bench.replay.predict import predict, predict_methods
from recallspec.bench.replay.time_model import TimeModel, simulate
from recallspec.cost.curve import CostCurve


def fitted_model(
    records: Sequence[dict[str, Any]], cfg: ReplayConfig, own_curve: CostCurve,
    methods: Sequence[str], answers_dir: Path, warn: Callable[[str], None],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the fit, {method: {"predicted", "recorded", "error"}}): the replay of the recorded
    run with its own model's curve, i.e. the prediction's error where it can be checked."""
    fit, pred, real = predict_methods(records, cfg, own_curve, methods, answers_dir, warn=warn)
    check: dict[str, Any] = {}
    for m in methods:
        p = pred[m]["overall"]["tokens_per_s"]
        r = real.get(m, {}).get("overall")
        check[m] = {"predicted": p, "recorded": r,
                    "error": None if not r else (p - r) / r}
    return fit, check


def predict_at_curve(
    records: Sequence[dict[str, Any]], cfg: ReplayConfig, curve: CostCurve,
    methods: Sequence[str], fit: dict[str, Any],
) -> dict[str, Any]:
    """{method: {"tokens_per_s", "speedup_vs_ar", "mat", "drafted"}} of the recorded
    answers replayed with ``curve`` (a shape's) and ``fit``'s overheads (``fitted_model``).
    ``methods`` must include "ar" for the speedups."""
    base = TimeModel(curve, step_overhead=fit["step_overhead_ms"] / 1e3,
                     prompt_overhead=fit["prompt_overhead_ms"] / 1e3,
                     turn_overhead=fit["turn_overhead_ms"] / 1e3)
    out: dict[str, Any] = {}
    for m in methods:
        policy = make_policy(m, cfg, curve, base.step_overhead).build()
        sims = simulate(records, policy, cfg)
        tm = replace(base, row_overhead=fit["row_overhead_ms"].get(m, 0.0) / 1e3)
        o = predict(records, sims, tm)["overall"]
        out[m] = {"tokens_per_s": o["tokens_per_s"], "mat": o["mat"], "drafted": o["drafted"]}
    ar = out.get("ar", {}).get("tokens_per_s")
    for v in out.values():
        v["speedup_vs_ar"] = v["tokens_per_s"] / ar if ar else None
    return out
