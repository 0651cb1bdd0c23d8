"""Issue 22's workload table: the default policy against the best fixed drafter, per
workload, from bench runs (``recallspec bench --out DIR``) and, where a run has one,
the replay prediction written next to it (``recallspec bench replay --predict-time
--out DIR/prediction.json``).

    .venv/bin/python benchmarks/experiments/policy_workloads.py \\
        --policy portfolio:mode=adaptive --out bench_out/policy/workloads bench_out/policy_*

Writes OUT.json and OUT.md. Speedups are the bench report's (mean of per-question
tokens/s over ``ar``'s, same run); "policy / best fixed" divides the policy's speedup by
the best fixed method's in that run. A method counts as fixed where it drafts fixed sizes:
ours sized fixed (``NAME:mode=fixed``, or named without a sizing in a run whose unlabeled
methods were fixed: its run.json's ``sizing_default``, fixed in runs recorded before the
key; cost-aware otherwise), and the peers (hf-*, llamacpp-*: their own fixed drafting).

Feeds docs/BENCHMARKS.md, "Speculation: Spec-Bench on the real models" (the default
policy's choice, command [S3] per workload) and the notebook docs/history/benchmarks_2026-11.md,
"Seven workloads, the final planner (issue 22)" (tables: docs/results/policy/).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from _common import write_outputs

from recallspec.bench.common.method import baseline_of, method_spec, recorded_sizing_default
from recallspec.markdown import table_lines
from recallspec.params import Sizing


def is_fixed(method: str, sizing_default: Sizing) -> bool:
    """Whether a run's method drafts fixed sizes (see the module docstring);
    ``sizing_default``: how the run sized its methods named without a sizing."""
    if baseline_of(method) != "ar":  # a peer: its own fixed drafting, or none
        return True
    return method_spec(method, sizing_default).sizing == "fixed"


def workload_row(run: Path, policy: str) -> dict[str, Any]:
    rep = json.loads((run / "report.json").read_text(encoding="utf-8"))
    settings = rep["run"]["settings"]
    overall = {m: v["stats"]["overall"] for m, v in rep["methods"].items()}
    if policy not in overall or "ar" not in overall:
        raise SystemExit(f"{run}: the run has no {policy!r} or no 'ar'")
    speed = {m: float(s["speedup_vs_ar"]) for m, s in overall.items()}
    unlabeled = recorded_sizing_default(settings)
    fixed = {m: v for m, v in speed.items()
             if m not in ("ar", policy) and is_fixed(m, unlabeled)}
    if not fixed:
        raise SystemExit(f"{run}: no method of fixed sizes to compare {policy!r} with "
                         "(name one NAME:mode=fixed)")
    best = max(fixed, key=lambda m: fixed[m])
    row: dict[str, Any] = {
        "workload": settings["suite"], "run": str(run),
        "questions": int(overall["ar"]["questions"]),
        "repeats": int(rep["run"]["config"].get("repeats", 1)),
        "ar_tokens_per_s": float(overall["ar"]["tokens_per_s"]),
        "speedup": speed, "mat": {m: float(s["mat"]) for m, s in overall.items()},
        "identical_to_ar": {m: float(s["identical_to_ar"]) for m, s in overall.items()},
        "best_fixed": best, "policy_over_best_fixed": speed[policy] / fixed[best],
    }
    pred_file = run / "prediction.json"
    if pred_file.is_file():
        pred = json.loads(pred_file.read_text(encoding="utf-8"))
        row["replay_error"] = {
            m: p["overall"]["tokens_per_s"] / pred["recorded"][m]["overall"] - 1.0
            for m, p in pred["predicted"].items() if m in pred.get("recorded", {})}
    return row


def render(rows: list[dict[str, Any]], policy: str) -> list[str]:
    methods = list(rows[0]["speedup"]) if rows else []
    head = ["workload", "n", "ar tok/s", *methods, "best fixed", f"{policy} / best fixed",
            "identical to ar"]
    body = []
    for r in rows:
        cells = [r["workload"], str(r["questions"]), f"{r['ar_tokens_per_s']:.1f}"]
        for m in methods:
            v = r["speedup"].get(m)
            cell = "-" if v is None else f"{v:.2f}x"
            cells.append(f"**{cell}**" if m == r["best_fixed"] else cell)
        ident = min(r["identical_to_ar"].values())
        cells += [r["best_fixed"], f"{r['policy_over_best_fixed']:.3f}", f"{100 * ident:.0f}%"]
        body.append(cells)
    lines = table_lines(head, body)
    errs = [r for r in rows if "replay_error" in r]
    if errs:
        ms = list(errs[0]["replay_error"])
        lines += ["", "Replay prediction error of tokens/s (overall, per run):", ""]
        lines += table_lines(
            ["workload", *ms],
            [[r["workload"], *(f"{100 * r['replay_error'][m]:+.1f}%" if m in r["replay_error"]
                               else "-" for m in ms)] for r in errs])
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="bench output directories")
    ap.add_argument("--policy", default="portfolio:mode=adaptive")
    ap.add_argument("--out", type=Path, required=True, help="OUT.json and OUT.md are written")
    args = ap.parse_args()
    rows = [workload_row(r, args.policy) for r in args.runs]
    write_outputs(args.out, rows, render(rows, args.policy))


if __name__ == "__main__":
    main()
