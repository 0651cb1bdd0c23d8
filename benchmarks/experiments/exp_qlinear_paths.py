"""Time the quantized product alone on every kernel path this CPU runs: ``qlinear`` of M
rows through one transformer layer's worth of weights shaped like SmolLM2's (576 x 1536,
1536 x 576, 576 x 576; random values quantized by gguf-py to each ``--types`` format),
one thread, weights in cache. Best of R repeats of 10 passes (the machine's noise is
one-sided), milliseconds per pass.

    .venv/bin/python benchmarks/experiments/exp_qlinear_paths.py [--types Q4_1 Q8_0]
        [--rows 1 4 16 64] [--variants avx512 avx512-novnni avx2 scalar] [--repeats 30]
        [--out bench_out/qlinear_paths]

Every path gives the same bits (tests/kernels/test_qlinear.py); this measures only their speed,
e.g. for an A/B of a kernel change on a path the machine would not pick by itself
(``avx512-novnni`` on a VNNI CPU). Writes OUT.json and OUT.md. Run it alone on the machine.

Feeds the notebook docs/history/benchmarks_2026-11.md, "Profile of one step (native
forward, SmolLM2, 200 cached tokens, idle machine)" (runs: docs/results/native/, the
``*_novnni_zen4`` pages).
"""

from __future__ import annotations

import argparse
import time

import gguf
import numpy as np
import torch
from _common import utc_now, write_outputs
from gguf import GGMLQuantizationType as T

from recallspec.kernels import isa
from recallspec.kernels.qlinear import QuantizedWeight, qlinear
from recallspec.markdown import table_lines

SHAPES = ((1536, 576), (576, 1536), (576, 576))  # (n, k): MLP up, MLP down, attention


def weights(qtype: T) -> list[QuantizedWeight]:
    rng = np.random.default_rng(0)
    out = []
    for n, k in SHAPES:
        raw = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)
        out.append(QuantizedWeight.from_gguf(raw, qtype, n, k))
    return out


def time_pass(ws: list[QuantizedWeight], m: int, variant: str, repeats: int) -> float:
    xs = [torch.randn(m, w.k, generator=torch.Generator().manual_seed(1)) for w in ws]
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(10):
            for x, w in zip(xs, ws, strict=True):
                qlinear(x, w, threads=1, isa=variant)
        best = min(best, (time.perf_counter() - t0) / 10)
    return 1e3 * best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", nargs="+", default=["Q4_1", "Q8_0"],
                    choices=["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--variants", nargs="+", default=None,
                    help="kernel variants (default: every one this CPU runs)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", default="bench_out/qlinear_paths")
    args = ap.parse_args()
    variants = args.variants or isa.variants()
    for v in variants:
        isa.code(v)  # a clear error for a path this CPU cannot run
    rows = []
    for name in args.types:
        ws = weights(T[name])
        for v in variants:
            for m in args.rows:
                rows.append({"type": name, "variant": v, "rows": m,
                             "ms": time_pass(ws, m, v, args.repeats)})
    meta = {"cpu": isa.cpu_model(), "date": utc_now(), "shapes": SHAPES, "threads": 1}
    lines = [f"{meta['cpu']}, {meta['date']}, one thread; ms per pass over {list(SHAPES)}.",
             "", *table_lines(["type", "variant", "rows", "ms"],
                              [[r["type"], r["variant"], r["rows"], f"{r['ms']:.3f}"]
                               for r in rows])]
    write_outputs(args.out, {**meta, "rows": rows}, lines)


if __name__ == "__main__":
    main()
