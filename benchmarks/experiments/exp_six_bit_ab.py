"""A/B of one matrix's product in 6-bit against u8 storage on this CPU's kernel path: a
Q6_K matrix of ``--n`` x ``--k`` (default 14,336 x 4,096: larger than any cache, so the
product streams its weights as decode and verification do), random GGUF blocks
(``tests/helpers/qweight.random_raw``: needs the dev install), ``--threads`` threads,
M rows of activations; the two storages alternate within each repeat (the first few
dropped as warm-up), median ms.

    .venv/bin/python benchmarks/experiments/exp_six_bit_ab.py [--rows 1 4 8 16]
        [--repeats 15] [--out bench_out/six_bit_ab]

Both storages give the same bits (tests/kernels/test_qlinear.py); this measures only
their speed and bytes (``qlinear.default_bits`` says which one a load picks). Run it
alone on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from _common import utc_now, write_outputs
from gguf import GGMLQuantizationType as T

from recallspec.kernels import isa
from recallspec.kernels.qlinear import QuantizedWeight, default_bits, qlinear

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from helpers.qweight import random_raw

WARMUP = 3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=14336)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default="bench_out/six_bit_ab")
    args = ap.parse_args()
    if args.repeats <= WARMUP:
        ap.error(f"--repeats must exceed the {WARMUP} warm-up repeats")
    raw = random_raw(T.Q6_K, args.n, args.k, seed=0)
    ws = {b: QuantizedWeight.from_gguf_rows(T.Q6_K, args.n, args.k, [(0, raw)], bits=b)
          for b in (6, 8)}
    mb = {b: sum(t.numel() * t.element_size() for t in w.state_dict("w.").values()) / 1e6
          for b, w in ws.items()}
    points = []
    for m in args.rows:
        x = torch.randn(m, args.k, generator=torch.Generator().manual_seed(1))
        times: dict[int, list[float]] = {6: [], 8: []}
        for r in range(args.repeats):
            for b in ((6, 8) if r % 2 else (8, 6)):
                t0 = time.perf_counter()
                qlinear(x, ws[b], threads=args.threads)
                times[b].append(time.perf_counter() - t0)
        ms = {b: 1e3 * statistics.median(v[WARMUP:]) for b, v in times.items()}
        points.append({"rows": m, "ms_6bit": ms[6], "ms_u8": ms[8], "ratio": ms[6] / ms[8]})
        print(f"{m} rows: 6-bit {ms[6]:.2f} ms, u8 {ms[8]:.2f} ms ({ms[6] / ms[8]:.3f}x)",
              flush=True)
    meta = {"cpu": isa.cpu_model(), "kernels": isa.ISA, "date": utc_now(), "n": args.n,
            "k": args.k, "threads": args.threads, "repeats": args.repeats, "mb": mb,
            "load_bits": default_bits(T.Q6_K)}
    lines = [f"{meta['cpu']}, kernels {isa.ISA}, {meta['date']}, {args.threads} threads; a Q6_K "
             f"matrix of {args.n} x {args.k}: {mb[6]:.1f} MB in 6 bits, {mb[8]:.1f} MB in u8 "
             f"(a load here picks {meta['load_bits']} bits). Median ms of "
             f"{args.repeats - WARMUP} alternating repeats.", "",
             "| rows | 6-bit ms | u8 ms | 6-bit / u8 |", "|---|---|---|---|",
             *(f"| {p['rows']} | {p['ms_6bit']:.2f} | {p['ms_u8']:.2f} | {p['ratio']:.3f}x |"
               for p in points)]
    write_outputs(args.out, {"meta": meta, "points": points}, lines)


if __name__ == "__main__":
    main()
