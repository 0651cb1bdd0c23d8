"""Predict Spec-Bench again for a scale table measured before: new SmolLM2 answers (a
``recallspec bench`` run with ar and the drafting methods) replayed with the curves that
table's run measured, each forward priced at scale 1 and the time model fitted on the
new run (``bench.scale.add_predictions``, as ``bench scale --answers`` does in its run).
The measured columns stay those of the earlier run; only the prediction is new.

    .venv/bin/python benchmarks/experiments/exp_repredict.py \\
        --scale docs/results/scale/zen3_2026-11-29_bytes/scale.json \\
        --curves docs/results/scale/zen3_2026-11-29_bytes/curves --answers bench_out/spec_bench \\
        [--methods ar,portfolio:mode=adaptive,oracle:drafters=pld+llma+sam] --out OUT

``--curves``: where the table's curve files are now (each entry's ``curve_file`` is
looked up there by its file name). Writes OUT/scale.json, scale.md and scale.png.

Feeds docs/BENCHMARKS.md, "Speculation: Spec-Bench on the real models" (the predicted
table, command [S5]).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from recallspec.bench.scale.command import add_predictions, write_scale


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=Path, required=True, help="an earlier run's scale.json")
    ap.add_argument("--curves", type=Path, required=True, help="its curve files")
    ap.add_argument("--answers", type=Path, required=True, help="a recallspec bench run")
    ap.add_argument("--methods", default="ar,portfolio:mode=adaptive,oracle:drafters=pld+llma+sam")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    res = json.loads(args.scale.read_text(encoding="utf-8"))
    for key, entry in res["entries"].items():
        if entry.get("curve_file"):
            entry["curve_file"] = str(args.curves / Path(entry["curve_file"]).name)
            if not Path(entry["curve_file"]).is_file():
                sys.exit(f"{key}: no curve file {entry['curve_file']}")
        # (A mixture of experts' curves re-priced at its routing bounds, bench/scale/moe.py.)
        bounds = entry.get("bound_curve_files", {})
        for bound, path in bounds.items():
            bounds[bound] = str(args.curves / Path(path).name)
            if not Path(bounds[bound]).is_file():
                sys.exit(f"{key}: no {bound} curve file {bounds[bound]}")
    methods = tuple(m for m in args.methods.split(",") if m)
    if "ar" not in methods:
        sys.exit("the predicted speedups need 'ar' among --methods")
    res["config"]["methods"] = list(methods)
    res["config"]["answers"] = str(args.answers)
    add_predictions(res, args.answers, methods, args.threads, lambda m: print(m, flush=True))
    write_scale(res, args.out)
    print(f"wrote {args.out}/scale.json, scale.md, scale.png")


if __name__ == "__main__":
    main()
