"""Paired decode rounds of one shape's GGUF, without the rest of a `bench scale` entry:
ours (a fresh process, decode only) and llama-bench's tg, back to back, the order
alternating (``recallspec.bench.scale.paired_decode``). The ratio least moved by a VM
whose speed drifts within a run; more rounds than `bench scale --decode-rounds` gives.

    .venv/bin/python scripts/exp_paired_decode.py --shape llama-3.1-8b --rounds 5 \
        --threads 2 --out bench_out/paired_8b.json

Writes OUT (JSON: the rounds, their ratios, median, min, max) and prints the median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from recallspec.bench.scale import ScaleConfig, paired_decode
from recallspec.bench.shapes import ensure_shape_gguf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", required=True)
    ap.add_argument("--quant", default="Q4_K_M")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    cfg = ScaleConfig(entries=((args.shape, args.quant),), threads=args.threads,
                      decode_rounds=args.rounds)
    gguf = ensure_shape_gguf(args.shape, args.quant)
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rounds = paired_decode(gguf, cfg, args.threads, lambda s: print(s, flush=True))
    if not rounds:
        raise SystemExit("no round completed (see above)")
    ratios = [r["ours"] / r["llamacpp"] for r in rounds]
    out = {"date": date, "gguf": str(gguf), "threads": args.threads, "rounds": rounds,
           "ratios": ratios, "median": statistics.median(ratios), "min": min(ratios),
           "max": max(ratios)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"median {out['median']:.3f} (min {out['min']:.3f}, max {out['max']:.3f}) "
          f"over {len(ratios)} rounds -> {args.out}")


if __name__ == "__main__":
    main()
