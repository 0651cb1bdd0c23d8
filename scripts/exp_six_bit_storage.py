"""Q6_K products in 6-bit storage against u8 storage, the same weights, in one process.

    .venv/bin/python scripts/exp_six_bit_storage.py [--threads 2] [--repeats 7]
        [--rows 1,4,8,16] [--out bench_out/six_bit]

For each matrix shape (one in cache, two streamed from memory like an 8B model's), the
time of ``qlinear`` of M rows with the weight stored in 8 and in 6 bits (identical
values: the outputs are checked bit for bit), measured alternately, medians of
``--repeats``. Writes OUT.json and OUT.md (6-bit / u8 time per shape and row count).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from gguf import GGMLQuantizationType as T

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from qweight_helpers import random_raw

from recallspec.runtime import isa
from recallspec.runtime.qlinear import QuantizedWeight, qlinear

SHAPES = ((2048, 2048), (8192, 4096), (14336, 4096))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--rows", default="1,4,8,16")
    p.add_argument("--out", default="bench_out/six_bit")
    args = p.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    res: dict[str, dict[str, dict[str, float]]] = {}
    for n, k in SHAPES:
        raw = random_raw(T.Q6_K, n, k, seed=1)
        ws = {b: QuantizedWeight.from_gguf_rows(T.Q6_K, n, k, [(0, raw)], bits=b) for b in (8, 6)}
        key = f"{n}x{k}"
        res[key] = {}
        for m in rows:
            x = torch.randn(m, k)
            outs = {b: qlinear(x, w, threads=args.threads) for b, w in ws.items()}
            assert torch.equal(outs[6].view(torch.int32), outs[8].view(torch.int32))
            times: dict[int, list[float]] = {8: [], 6: []}
            calls = max(3, int(200 / (n * k / 1e6 * m)))
            for _ in range(args.repeats):
                for b, w in ws.items():
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        qlinear(x, w, threads=args.threads)
                    times[b].append((time.perf_counter() - t0) / calls * 1e3)
            med = {b: statistics.median(v) for b, v in times.items()}
            res[key][str(m)] = {"u8_ms": med[8], "six_bit_ms": med[6], "ratio": med[6] / med[8]}
            print(f"{key} m={m}: u8 {med[8]:.3f} ms, 6-bit {med[6]:.3f} ms, "
                  f"{med[6] / med[8]:.3f}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"machine": isa.describe(), "threads": args.threads, "repeats": args.repeats,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    out.with_suffix(".json").write_text(json.dumps({**meta, "results": res}, indent=1))
    lines = [f"{meta['machine']}; {args.threads} threads; {meta['date']}; medians of "
             f"{args.repeats}. Q6_K product time, 6-bit / u8 storage:", "",
             "| shape | " + " | ".join(f"{m} rows" for m in rows) + " |",
             "|---|" + "---|" * len(rows)]
    for key, r in res.items():
        lines.append(f"| {key} | " + " | ".join(f"{r[str(m)]['ratio']:.2f}" for m in rows) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
