"""The quantized products' cost against the number of rows, per kernel variant, at one
model shape: the layer matrices of ``--shape`` (qkv, o, gate+up, down, as the native
forward fuses them) for ``--layers`` distinct layers of random K-quant bytes (Q4_K, and
Q6_K for v and down in every other layer as Q4_K_M does), so that a pass streams the
weights from memory as decoding does. Milliseconds per pass over those layers, median of
``--repeats`` (the variants alternated within each repeat), each row count's cost over
one row's of the same variant, and the median of each repeat's ratio to the first
variant.

    .venv/bin/python benchmarks/experiments/exp_rows_cost.py --shape smollm2-1.7b --layers 8 \\
        [--rows 1 8 9 16 32 64] [--variants avx512 avx512-amx] [--threads 2] \\
        [--repeats 5] [--out bench_out/rows_cost]

Written for the AMX check (issue 37 item 5: ``avx512-amx`` against ``avx512``, VNNI),
runs on any CPU with the variants it has. Every variant gives the same bits
(tests/kernels/test_qlinear.py); this measures speed only. Each product is one Python
call (an overhead the same for every variant). Writes OUT.json and OUT.md. Run it alone
on the machine.

Feeds docs/BENCHMARKS.md, "Decode and prefill against llama.cpp (1-8B shapes, Q4_K_M)"
(the AMX note, command [E1]).
"""

from __future__ import annotations

import argparse
import statistics
import time

import gguf
import numpy as np
import torch
from _common import utc_now, write_outputs
from gguf import GGMLQuantizationType as T

from recallspec.bench.common.shapes import SHAPES, Shape
from recallspec.kernels import isa
from recallspec.kernels.qlinear import QuantizedWeight, qlinear
from recallspec.markdown import table_lines

FP16_AT = {T.Q4_K: slice(0, 4), T.Q6_K: slice(208, 210)}  # a block's fp16 fields


def random_weight(qtype: T, n: int, k: int, rng: np.random.Generator) -> QuantizedWeight:
    """Random GGUF block bytes with small finite fp16 fields (any other bytes of a K-quant
    block are valid), repacked."""
    bs, ts = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n, k // bs, ts), dtype=np.uint8)
    at = FP16_AT[qtype]
    halves = (rng.standard_normal((n, k // bs, 2)) * 0.01).astype(np.float16)
    raw[..., at] = halves.view(np.uint8).reshape(n, k // bs, 4)[..., : at.stop - at.start]
    return QuantizedWeight.from_gguf_rows(qtype, n, k, [(0, raw.reshape(n, -1))])


def layer(shape: Shape, index: int, rng: np.random.Generator) -> list[QuantizedWeight]:
    q = shape.heads * shape.head_dim
    kv = shape.kv_heads * shape.head_dim
    six = T.Q6_K if index % 2 == 0 else T.Q4_K  # Q4_K_M: v and down in Q6_K in half the layers
    return [random_weight(T.Q4_K, q + kv, shape.hidden, rng),  # q and k
            random_weight(six, kv, shape.hidden, rng),  # v
            random_weight(T.Q4_K, shape.hidden, q, rng),  # o
            random_weight(T.Q4_K, 2 * shape.ffn, shape.hidden, rng),  # gate and up
            random_weight(six, shape.hidden, shape.ffn, rng)]  # down


def one_pass(ws: list[QuantizedWeight], xs: dict[int, torch.Tensor], variant: str,
             threads: int) -> float:
    t0 = time.perf_counter()
    for w in ws:
        qlinear(xs[w.k], w, threads=threads, isa=variant)
    return time.perf_counter() - t0


def time_rows(ws: list[QuantizedWeight], m: int, variants: list[str], threads: int,
              repeats: int) -> dict[str, list[float]]:
    """Seconds per pass of each variant, the variants alternated within each repeat (a
    machine whose speed drifts moves them together)."""
    xs = {w.k: torch.randn(m, w.k, generator=torch.Generator().manual_seed(1)) for w in ws}
    for v in variants:  # warm: the thread pool, the activation buffers
        one_pass(ws, xs, v, threads)
    out: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(repeats):
        order = variants if r % 2 == 0 else variants[::-1]
        for v in order:
            out[v].append(one_pass(ws, xs, v, threads))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="smollm2-1.7b", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 9, 16, 32, 64])
    ap.add_argument("--variants", nargs="+", default=None,
                    help="kernel variants (default: every one this CPU runs but scalar)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="bench_out/rows_cost")
    args = ap.parse_args()
    variants = args.variants or [v for v in isa.variants() if v != "scalar"]
    for v in variants:
        isa.code(v)  # a clear error for a path this CPU cannot run
    shape = SHAPES[args.shape]
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    ws = [w for i in range(args.layers) for w in layer(shape, i, rng)]
    weight_mb = sum(w.nbytes for w in ws) / 1e6
    print(f"{args.layers} layers of {shape.name}: {weight_mb:.0f} MB "
          f"({time.perf_counter() - t0:.1f} s to build)", flush=True)
    rows = []
    one: dict[str, float] = {}
    for m in args.rows:
        t = time_rows(ws, m, variants, args.threads, args.repeats)
        for v in variants:
            ms = 1e3 * statistics.median(t[v])
            if m == 1:
                one[v] = ms
            paired = statistics.median(a / b for a, b in zip(t[v], t[variants[0]], strict=True))
            rows.append({"variant": v, "rows": m, "ms": ms,
                         "over_one_row": ms / one[v] if v in one else None,
                         "over_first_variant": paired})
            print(rows[-1], flush=True)
    meta = {"cpu": isa.cpu_identity(), "kernels": {v: isa.describe(v) for v in variants},
            "date": utc_now(), "shape": shape.name,
            "layers": args.layers, "weight_mb": weight_mb, "threads": args.threads,
            "repeats": args.repeats}
    lines = [f"{meta['cpu']}, {meta['date']}, {args.threads} threads; ms per pass over "
             f"{args.layers} layers of {shape.name} ({weight_mb:.0f} MB of Q4_K/Q6_K), "
             f"median of {args.repeats}.", ""]
    lines += table_lines(
        ["variant", "rows", "ms", "over 1 row", f"over {variants[0]} (paired)"],
        [[r["variant"], r["rows"], f"{r['ms']:.2f}",
          "" if r["over_one_row"] is None else f"{r['over_one_row']:.2f}",
          f"{r['over_first_variant']:.2f}"] for r in rows])
    write_outputs(args.out, {**meta, "rows": rows}, lines)


if __name__ == "__main__":
    main()
