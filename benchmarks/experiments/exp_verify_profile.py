"""Issue 18's profile of one verification forward: k = 1 vs k = 16 (``--ks``) new rows (a chain,
every row's logits) after C cached tokens, split by the native forward's own counters
(``NativeModel.set_profiling``: activation quantization, weight products, attention,
other native work) for 1 and 2 threads. Best of R forwards per cell (the machine's
noise is one-sided: a slower run was disturbed).

    .venv/bin/python benchmarks/experiments/exp_verify_profile.py [--model ALIAS]
        [--cached 200 512] [--repeats 15] [--ks 16] [--kv-dtypes float32 float16]
        [--out bench_out/verify_profile]

``--kv-dtypes``: the KV-cache formats to profile, in one run (default: the model's own).
Rows past 16 (``--ks 512``) are timed as a prefill chunk (the last row's logits only).

Writes OUT.json and OUT.md. Run it alone on the machine.

Feeds the notebooks' profiles of a k-row forward: docs/history/benchmarks_2026-11.md,
"Profile of one step (native forward, SmolLM2, 200 cached tokens, idle machine)", and
docs/history/benchmarks_2026-11-27_to_12-01.md, "What bounds the products on a CPU
without VNNI: the arithmetic floor (issue 37, 2026-11-30 evening)" and the KV-cache
sections of 2026-11-29 (runs: docs/results/native/).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from _common import write_outputs

from recallspec.cost.calibration import random_prefix
from recallspec.engine import Engine
from recallspec.kernels.linear import forward_threads
from recallspec.kernels.threads import decode_threads
from recallspec.markdown import table_lines
from recallspec.runtime.batch import SequenceInput, build_batch

PARTS = ("gemm", "attention", "quantize", "other")


def profile_cell(model: Any, cache: Any, slot: int, ctx: list[int], cached: int, k: int,
                 threads: int, repeats: int) -> dict[str, float]:
    """Milliseconds of the best of ``repeats`` forwards of k rows at ``cached``, and its
    split."""
    native = model.native
    logits = "all" if k <= 16 else "last"  # (more rows: a prefill chunk)
    meta = build_batch([SequenceInput(slot, cached, ctx[cached : cached + k], logits=logits)])
    best: dict[str, float] | None = None
    for _ in range(repeats + 1):  # the first is a warm-up
        native.profile(reset=True)
        t0 = time.perf_counter()
        with decode_threads(threads), forward_threads(meta.num_tokens, threads):
            model(meta, cache)
        wall = time.perf_counter() - t0
        prof = native.profile(reset=True)
        cell = {"wall": 1e3 * wall, **{p: 1e3 * float(prof[p]) for p in PARTS}}
        if best is None or cell["wall"] < best["wall"]:
            best = cell
    assert best is not None
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--cached", type=int, nargs="+", default=[200, 512])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--ks", type=int, nargs="+", default=[16],
                    help="row counts to profile besides k = 1")
    ap.add_argument("--kv-dtypes", nargs="+", choices=("float32", "float16"), default=None)
    ap.add_argument("--out", default="bench_out/verify_profile")
    args = ap.parse_args()
    engine = Engine.load(args.model)
    model = engine.model
    if model.native is None:
        raise SystemExit("the model has no native forward (quantized weights only)")
    top = max(args.cached)
    kv_dtypes = args.kv_dtypes or [str(model.kv_dtype).removeprefix("torch.")]
    model.native.set_profiling(True)
    rows: list[dict[str, Any]] = []
    with torch.inference_mode():
        for kv in kv_dtypes:
            cache = model.new_cache(1, top + max(16, *args.ks) + 1, dtype=getattr(torch, kv))
            slot = cache.allocate()
            ctx = random_prefix(model, cache, slot, top, max(16, *args.ks))
            for cached in args.cached:
                for threads in (1, 2):
                    one = profile_cell(model, cache, slot, ctx, cached, 1, threads, args.repeats)
                    cells = [(1, one)] + [
                        (k, profile_cell(model, cache, slot, ctx, cached, k, threads,
                                         args.repeats)) for k in args.ks if k != 1]
                    for k, cell in cells:
                        rows.append({"kv": kv, "cached": cached, "threads": threads, "k": k,
                                     **cell, "ratio_to_k1": cell["wall"] / one["wall"]})
    model.native.set_profiling(False)
    lines = table_lines(
        ["KV", "cached", "threads", "k", "wall ms", "GEMM", "attention", "act. quantize",
         "other native", "k / k=1"],
        [[r["kv"], r["cached"], r["threads"], r["k"],
          *(f"{r[p]:.2f}" for p in ("wall", "gemm", "attention", "quantize", "other")),
          f"{r['ratio_to_k1']:.2f}x"] for r in rows])
    write_outputs(args.out, rows, lines)


if __name__ == "__main__":
    main()
