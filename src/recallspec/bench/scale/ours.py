"""Our side of ``recallspec bench scale`` for one GGUF, run in a child process.

A child per model keeps the measurements apart: its resident memory is that model's
alone (a parent that loaded 8B and then 1B would still hold pages of both), and a model
that does not fit kills only its own child. The parent (``bench/scale/command.py``) runs

    python -m recallspec.bench.scale.ours GGUF --threads T --repeats R --new-tokens N
        --prefill P --ks 1,2,4 --cached C --contexts 128,512,1024 --curve-out FILE
        [--batch-seqs 1,2,4,8 --batch-ks 1,4]

and reads one JSON object from stdout:

* ``load_s``: ``Engine.load`` wall seconds (the first run of a file includes the
  repack into our block layout; later runs read the repack cache: ``cold`` says which);
  ``cache_write_wait_s``: how much longer the first run's background repack cache write
  took after that (the model could answer meanwhile; 0 on later runs);
* ``ar``: AR decoding (greedy, EOS ignored) of N tokens after the runtime bench's
  ~100-token prompt, end to end and decode only (``bench/runtime/command.py``);
* ``prefill_tok_s``: one forward of a P-token prompt chunk (last row's logits) at
  position 0, as the engine prefills;
* ``cost_ms``: one forward of a chain of k rows (every row's logits, as verification)
  after C cached tokens, for each k;
* ``weight_bytes``/``achieved_gb_s``: the bytes of weights one decode step reads (a
  mixture of experts': its routed experts' share) and that over the decode time per token;
* ``experts_touched`` (a mixture of experts): for each k, the distinct experts one
  forward of a chain of k rows woke per layer (the native forward's counters, the mean
  over ``EXPERT_SAMPLES`` chains of random tokens), beside ``experts_uniform``, what
  rows routed independently and uniformly would wake: E(1 - (1 - K/E)^k);
* ``batched`` (a mixture of experts by default, a dense model with ``--batch-seqs``):
  one forward of B sequences (``--batch-seqs``), each its own context of C random tokens
  and a chain of k rows (``--batch-ks``): ms and experts woken beside the same B x k rows
  as one sequence's chain, uniform routing's count and the cost model's price
  (``bench/scale/moe_batch.py``);
* ``rss_mb``/``peak_rss_mb``: the process's resident and peak resident memory after
  all of it (the Python runtime and torch included: ``baseline_rss_mb`` is before load).

``--only decode`` or ``--only prefill``: ``ar`` or ``prefill_tok_s`` alone (a paired
round's side of ours: ``bench/scale/command.paired_rounds``); ``--only batched``:
``batched`` alone (its one-sequence chains measured with it).

``--curve-out`` also writes the model's cost curve (``cost/curve.CostCurve``,
format 3) from the same forwards plus a prefill grid: what ``bench replay``'s time
model prices a replayed policy with at this shape.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from recallspec.bench.common.args import positive_ints
from recallspec.bench.common.decode import engine_ar, prompt_ids, quantized_bytes_per_token
from recallspec.bench.common.machine import status_mb
from recallspec.bench.scale.config import seq_counts
from recallspec.bench.scale.moe_batch import BATCH_KS, BatchPlan, batched_curve, default_seqs
from recallspec.cost.calibration import expert_counts, grid_times
from recallspec.cost.curve import CostCurve, CostGrid
from recallspec.engine import Engine

# Prefill grid (chunk sizes 128 and --prefill x start positions): the span Spec-Bench
# prompts (about 100-700 tokens) are priced over by the curve written with --curve-out.
PREFILL_SMALL = 128
PREFILL_STARTS = (0, 512)
EXPERT_SAMPLES = 8  # chains per k whose woken experts are counted


def experts_touched(model: Any, ks: tuple[int, ...], cached: int) -> dict[str, Any]:
    """{"experts_touched": {k: mean distinct experts per layer}, "experts_uniform": {k:
    the independent uniform routing's expectation}} of a mixture of experts: forwards of
    ``EXPERT_SAMPLES`` chains of k random tokens each after ``cached`` random ones,
    counted by the native forward (``calibration.expert_counts``, the calibration's
    count)."""
    c = model.config
    counts = expert_counts(model, torch.get_num_threads(), ks, cached=cached, up_to=max(ks),
                           samples=EXPERT_SAMPLES)
    if counts is None:
        raise ValueError("experts_touched: counted by a mixture of experts' native forward; "
                         "the model has none")
    e, used = c.num_experts, c.experts_per_token
    woken = dict(counts)
    return {"experts_touched": {str(k): woken[k] for k in ks},
            "experts_uniform": {str(k): e * (1 - (1 - used / e) ** k) for k in ks},
            "experts": e, "experts_used": used}


def _status_mb(field: str) -> float:
    """This process's ``status_mb`` (0 where unreadable)."""
    return status_mb(field) or 0.0


def _batched(model: Any, threads: int, args: argparse.Namespace,
             one_seq_ms: dict[int, float], one_seq_experts: dict[int, float]) -> dict[str, Any]:
    """{"batched": ...} (``moe_batch.batched_curve``) where sequences per forward are
    asked for (``--batch-seqs``; default: a mixture of experts'), else {}."""
    seqs = (default_seqs(bool(model.config.moe)) if args.batch_seqs is None
            else args.batch_seqs)
    if not seqs:
        return {}
    plan = BatchPlan(tuple(seqs), tuple(args.batch_ks), args.cached, args.repeats,
                     EXPERT_SAMPLES)
    return {"batched": batched_curve(model, threads, plan, one_seq_ms, one_seq_experts)}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if args.threads:
        torch.set_num_threads(args.threads)
    baseline = _status_mb("VmRSS")
    t0 = time.perf_counter()
    # (the batched curve's one chain of B x k rows too: a mixture's default B at most)
    chain = max(*args.ks, max(args.batch_ks) * max(args.batch_seqs or default_seqs(True)))
    max_len = max((*args.contexts, args.cached)) + chain + 8
    engine = Engine.load(args.gguf, max_len=max(max_len, args.prefill + 8, 1024),
                         threads=args.threads)
    load_s = time.perf_counter() - t0
    # A first load writes the repack cache in the background: done before any timing.
    engine.wait_for_repack_cache()
    cache_write_s = time.perf_counter() - t0 - load_s
    model, threads = engine.model, engine.threads
    ids = prompt_ids(engine.tokenizer)
    out: dict[str, Any] = {"load_s": load_s, "cache_write_wait_s": cache_write_s,
                           "threads": threads,
                           "baseline_rss_mb": baseline, "prompt_tokens": len(ids)}
    if args.only == "batched":
        out |= _batched(model, threads, args, {}, {})
        return out | {"rss_mb": _status_mb("VmRSS"), "peak_rss_mb": _status_mb("VmHWM")}
    if args.only != "prefill":
        out["ar"] = engine_ar(engine, ids, args.new_tokens, args.repeats)
    if args.only == "decode":
        return out
    # Prefill: chunks of 128 and P rows (last row's logits) at positions 0 and 512, the
    # engine's prefill forward (its prefill_chunk is 512); P at 0 is the reported rate
    # (alone for --only prefill).
    sizes, starts = (((args.prefill,), (0,)) if args.only == "prefill"
                     else (tuple(sorted({PREFILL_SMALL, args.prefill})), PREFILL_STARTS))
    pgrid = grid_times(model, model.new_cache(1, max(starts) + max(sizes) + 2),
                       threads, sizes, starts, logits="last", repeats=args.repeats)
    out["prefill_tok_s"] = args.prefill / pgrid[0][args.prefill]
    if args.only == "prefill":
        return out
    # Verification: chains of k rows after each context; the one at --cached is the
    # reported curve, all of them the curve's decode grid.
    contexts = tuple(sorted(set(args.contexts) | {args.cached}))
    cache = model.new_cache(1, max(contexts) + max(args.ks) + 2)
    grid = grid_times(model, cache, threads, args.ks, contexts, repeats=args.repeats, warmup=2)
    out["cost_ms"] = {str(k): 1000 * grid[args.cached][k] for k in args.ks}
    if model.config.moe:
        out.update(experts_touched(model, tuple(args.ks), args.cached))
    out |= _batched(model, threads, args,
                    {int(k): v for k, v in out["cost_ms"].items()},
                    {int(k): v for k, v in out.get("experts_touched", {}).items()})
    wb = quantized_bytes_per_token(model)
    out["weight_bytes"] = wb
    out["resident_weight_mb"] = model.weight_bytes() / 1e6
    out["achieved_gb_s"] = wb["total"] / (out["ar"]["decode_ms_per_tok"] / 1000) / 1e9
    if args.curve_out:
        decode = CostGrid(tuple(args.ks), contexts,
                          tuple(tuple(grid[c][k] for k in args.ks) for c in contexts))
        prefill = CostGrid(sizes, PREFILL_STARTS,
                           tuple(tuple(pgrid[s][n] for n in sizes) for s in PREFILL_STARTS))
        # per_seq (the price of a further sequence in one batch) is not measured: the
        # replay prices one sequence at a time.
        curve = CostCurve(tuple(args.ks), tuple(grid[args.cached][k] for k in args.ks), 0.0,
                          f"scale:{Path(args.gguf).name}:{threads}", decode, prefill)
        Path(args.curve_out).write_text(json.dumps(curve.to_json(), indent=1), encoding="utf-8")
    out["rss_mb"] = _status_mb("VmRSS")
    out["peak_rss_mb"] = _status_mb("VmHWM")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m recallspec.bench.scale.ours")
    p.add_argument("gguf")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--ks", type=positive_ints, default=(1, 2, 4, 8, 16, 32))
    p.add_argument("--cached", type=int, default=512)
    p.add_argument("--contexts", type=positive_ints, default=(128, 512, 1024))
    p.add_argument("--curve-out", default=None)
    p.add_argument("--only", choices=("decode", "prefill", "batched"), default=None,
                   help="AR decode or prefill only (one side of bench scale's paired "
                   "rounds), or the batched verification curve only")
    p.add_argument("--batch-seqs", type=seq_counts, default=None,
                   help="sequences per forward of the batched verification curve "
                   f"(default: {','.join(map(str, default_seqs(True)))} for a mixture of "
                   "experts, none for a dense model; 0: none)")
    p.add_argument("--batch-ks", type=positive_ints, default=BATCH_KS,
                   help="draft rows per sequence of the batched verification curve")
    args = p.parse_args(argv)
    res = measure(args)
    sys.stdout.write(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
