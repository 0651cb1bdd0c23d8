"""Paired rounds of one GGUF, without the rest of a `bench scale` entry: ours (a fresh
process: AR decode, or one forward of a P-token prompt chunk at position 0) and
llama-bench's tg or ppP, back to back, the order alternating, each after an idle pause
(``recallspec.bench.scale.command.paired_rounds``). The ratio least moved by a VM whose speed
drifts within a run; more rounds than `bench scale --decode-rounds/--prefill-rounds` give.

    .venv/bin/python benchmarks/experiments/exp_paired.py --shape llama-3.1-8b \\
        --measure decode --rounds 5 --threads 2 --out bench_out/paired_8b.json
    .venv/bin/python benchmarks/experiments/exp_paired.py --gguf SHAPE.gguf \\
        --measure prefill --rounds 6 [--prefill 512] [--repeats 1] --threads 2 \\
        --out bench_out/paired_pp.json

Writes OUT (JSON: the rounds, their ratios, median, min, max) and prints the median.
Run it alone on the machine.

Feeds docs/BENCHMARKS.md, "Decode and prefill against llama.cpp (1-8B shapes, Q4_K_M)"
(commands [D6], [P1]).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _common import utc_now

from recallspec.bench.common.shapes_gguf import ensure_shape_gguf
from recallspec.bench.scale.command import paired_rounds, paired_summary
from recallspec.bench.scale.config import ScaleConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--shape", help="a shape of bench scale (its GGUF made if missing)")
    src.add_argument("--gguf", type=Path, help="a GGUF file")
    ap.add_argument("--quant", default="Q4_K_M", help="with --shape")
    ap.add_argument("--measure", choices=("decode", "prefill"), required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=ScaleConfig.new_tokens)
    ap.add_argument("--prefill", type=int, default=ScaleConfig.prefill)
    ap.add_argument("--repeats", type=int, default=1,
                    help="measurements a side, after its warm-up (the median)")
    ap.add_argument("--idle", type=float, default=ScaleConfig.pair_idle_s,
                    help="seconds idle before each side")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    if a.rounds < 1 or a.repeats < 1:
        ap.error("--rounds and --repeats must be >= 1")
    if a.gguf is not None and not a.gguf.is_file():
        ap.error(f"no such GGUF: {a.gguf}")
    cfg = ScaleConfig(threads=a.threads, new_tokens=a.new_tokens, prefill=a.prefill,
                      pair_idle_s=a.idle)
    gguf = a.gguf or ensure_shape_gguf(a.shape, a.quant)
    date = utc_now()
    rounds = paired_rounds(gguf, cfg, a.threads, a.measure, a.rounds,
                           lambda s: print(s, flush=True), repeats=a.repeats)
    summary = paired_summary(rounds)
    if summary is None:
        raise SystemExit("no round completed (see above)")
    out = {"date": date, "gguf": str(gguf), "measure": a.measure, "threads": a.threads,
           "tokens": a.new_tokens if a.measure == "decode" else a.prefill,
           "repeats": a.repeats, "idle_s": a.idle,
           "rounds": rounds, "ratios": [r["ours"] / r["llamacpp"] for r in rounds],
           **{k: summary[k] for k in ("median", "min", "max")}}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1))
    print(f"median {summary['median']:.3f} (min {summary['min']:.3f}, max {summary['max']:.3f})"
          f" over {summary['rounds']} rounds -> {a.out}")


if __name__ == "__main__":
    main()
