"""Issue 64 item 1: one decode step of a model, part by part, each beside its floor.

One greedy token after ``--cached`` tokens (random ids), on ``--threads`` cores:

- the engine's step (``engine.generate`` without a drafter: the decode ms a token,
  ``bench/common/decode.engine_ar``), and the native forward of that one row alone
  (``cost/calibration.timed_forward``); their difference is the step's Python (the
  scheduler, the batch, verification and commit, detokenizing);
- the forward's own split (``NativeModel.profile``: the weight products, the
  activations' quantization, attention, the rest: norms, RoPE, KV writes, activations,
  residuals), each the median over ``--repeats`` forwards;
- each kind of weight matrix alone (the fused q/k/v, o, gate/up, down of every layer,
  then the head), one row through ``qlinear`` over every layer's matrix in turn, so that
  each is read from memory as in a step: its GB/s beside the stream's.

Floors: a part's bytes over the machine's measured streaming read (1 GiB read the way the
products read, with prefetch: ``bench/common/machine.stream_bandwidth``; weights and the
KV rows attention reads), and
its multiply-adds over ``--peak-gmacs`` (the integer dot's measured peak of all cores,
``benchmarks/kernels/vnni_peak.cpp``; at one row this floor is far below the bytes').

    .venv/bin/python benchmarks/experiments/exp_decode_profile.py --model SHAPE.gguf
        [--cached 512] [--threads 2] [--repeats 30] [--tokens 64]
        [--peak-gmacs 922] [--out bench_out/decode_profile/NAME]

Writes OUT.json and OUT.md. Run it alone on the machine (``uptime`` first).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import torch
from _common import utc_now, write_outputs

from recallspec.bench.common.decode import engine_ar, quantized_bytes_per_token
from recallspec.bench.common.machine import busy_warning, machine_info, stream_bandwidth
from recallspec.cost.calibration import median_time, random_ids, random_prefix, timed_forward
from recallspec.engine import Engine
from recallspec.kernels.qlinear import qlinear
from recallspec.markdown import table_lines
from recallspec.runtime.batch import SequenceInput, build_batch

PARTS = ("gemm", "quantize", "attention", "other")
GROUPS = ("qkv_w", "o_w", "gate_up_w", "down_w")


def forward_split(model: Any, cache: Any, meta: Any, threads: int, repeats: int,
                  ) -> dict[str, float]:
    """Milliseconds of one forward of ``meta``: the wall time's median with profiling
    off, and each part's median with it on (clock reads between the parts)."""
    run = timed_forward(model, cache, meta, threads)
    native = model.native
    wall = median_time(run, repeats, warmup=3)
    native.set_profiling(True)
    parts: dict[str, list[float]] = {p: [] for p in (*PARTS, "total")}
    try:
        for _ in range(repeats):
            native.profile(reset=True)
            run()
            prof = native.profile(reset=True)
            for p in parts:
                parts[p].append(float(prof[p]))
    finally:
        native.set_profiling(False)
    out = {p: 1e3 * statistics.median(v) for p, v in parts.items()}
    out["wall"] = 1e3 * wall
    return out


def group_products(model: Any, threads: int, repeats: int) -> dict[str, dict[str, float]]:
    """Each kind of matrix, one row through every layer's in turn (then the head): ms a
    token and bytes, the median over ``repeats`` passes."""
    layers = list(model.layers)
    groups: dict[str, list[Any]] = {g: [getattr(layer, g) for layer in layers] for g in GROUPS}
    groups["head"] = [model.lm_head_w]
    out: dict[str, dict[str, float]] = {}
    with torch.inference_mode():
        for name, ws in groups.items():
            if any(w is None or not hasattr(w, "nbytes") for w in ws):
                continue  # (a mixture's experts, or float weights: not this profile's)
            xs = [torch.randn(1, w.k) for w in ws]

            def one_pass(ws: list[Any] = ws, xs: list[torch.Tensor] = xs) -> None:
                for w, x in zip(ws, xs, strict=True):
                    qlinear(x, w, threads=threads)

            ms = 1e3 * median_time(one_pass, repeats)
            nbytes = sum(int(w.nbytes) for w in ws)
            macs = sum(int(w.n) * int(w.k) for w in ws)
            out[name] = {"ms": ms, "bytes": nbytes, "macs": macs,
                         "gb_s": nbytes / (ms / 1e3) / 1e9}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None,
                    help="a GGUF (a shape: recallspec bench scale); default: the default model")
    ap.add_argument("--cached", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=64, help="tokens of the engine's AR run")
    ap.add_argument("--peak-gmacs", type=float, default=None,
                    help="the integer dot's peak of all cores, G multiply-adds a second "
                         "(benchmarks/kernels/vnni_peak.cpp); omitted: no MAC floor")
    ap.add_argument("--out", default="bench_out/decode_profile/profile")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    machine = machine_info()
    warn = busy_warning(machine)
    if warn:
        print(warn)
    # The VM's bandwidth drifts: measured before and after the rest, floors from the
    # faster (a floor must not be above what the machine can do).
    streams = [stream_bandwidth(1024, 7)]
    engine = Engine.load(args.model, max_batch_size=1, threads=args.threads,
                         max_len=args.cached + args.tokens + 64)
    engine.wait_for_repack_cache()
    model, c = engine.model, engine.model.config
    if model.native is None:
        raise SystemExit("the model has no native forward (quantized weights only)")

    # The engine's decode step, end to end (decode-only ms a token, median of repeats).
    prompt = random_ids(model, args.cached, seed=1)
    ar = engine_ar(engine, prompt, args.tokens, max(3, args.repeats // 10))

    # The forward of that one row after ``cached`` tokens.
    cache = model.new_cache(1, args.cached + 8)
    slot = cache.allocate()
    with torch.inference_mode():
        ctx = random_prefix(model, cache, slot, args.cached, 1)
        meta = build_batch([SequenceInput(slot, args.cached, ctx[args.cached:], logits="all")])
        fwd = forward_split(model, cache, meta, args.threads, args.repeats)
    groups = group_products(model, args.threads, args.repeats)
    streams.append(stream_bandwidth(1024, 7))
    stream = max(streams, key=lambda st: st["read_gb_s"])
    read = stream["read_gb_s"] * 1e9

    wb = quantized_bytes_per_token(model)
    kv_bytes = (2 * c.num_layers * c.num_kv_heads * args.cached * c.head_dim
                * cache.k.element_size())
    head_ms = groups.get("head", {}).get("ms", float("nan"))
    layer_bytes = wb["total"] - wb["lm_head"]
    peak = args.peak_gmacs * 1e9 if args.peak_gmacs else None
    macs = sum(g["macs"] for g in groups.values())

    def floor(nbytes: float, n_macs: float = 0.0) -> float:
        t = nbytes / read
        if peak:
            t = max(t, n_macs / peak)
        return 1e3 * t

    rows_: list[tuple[str, float, float | None, str]] = [
        ("weight products (native gemm, head included)", fwd["gemm"],
         floor(wb["total"], macs), f"{wb['total'] / 1e6:,.0f} MB at the stream"),
        ("  of them the head alone (qlinear)", head_ms, floor(wb["lm_head"]),
         f"{wb['lm_head'] / 1e6:,.0f} MB"),
        ("activations' quantization", fwd["quantize"], 0.0, "row-local, in cache"),
        ("attention", fwd["attention"], floor(kv_bytes),
         f"{kv_bytes / 1e6:,.1f} MB of KV at {args.cached} cached"),
        ("other (norms, RoPE, KV writes, residuals, hand-offs between them)", fwd["other"],
         0.0, ""),
        ("native forward (its counter)", fwd["total"], floor(wb["total"] + kv_bytes, macs), ""),
        ("forward call (wall, Python's call and batch included)", fwd["wall"], None,
         f"outside the counter: {fwd['wall'] - fwd['total']:.2f} ms"),
        ("engine decode step (AR, ms a token)", ar["decode_ms_per_tok"],
         floor(wb["total"] + kv_bytes, macs),
         f"Python step over the forward: {ar['decode_ms_per_tok'] - fwd['wall']:.2f} ms"),
    ]
    group_rows = [
        [name, f"{g['ms']:.2f}", f"{g['bytes'] / 1e6:,.1f}", f"{g['gb_s']:.1f}",
         f"{100 * g['gb_s'] * 1e9 / read:.0f}%"]
        for name, g in groups.items()]
    sum_ms = sum(g["ms"] for g in groups.values())
    sum_bytes = sum(g["bytes"] for g in groups.values())
    group_rows.append(["all products (sum)", f"{sum_ms:.2f}", f"{sum_bytes / 1e6:,.1f}",
                       f"{sum_bytes / (sum_ms / 1e3) / 1e9:.1f}",
                       f"{100 * sum_bytes / (sum_ms / 1e3) / read:.0f}%"])
    name = Path(args.model).name if args.model else "the default model"
    reads = " / ".join(f"{st['read_gb_s']:.1f}" for st in streams)
    lines = [
        f"# One decode step of {name}, part by part ({utc_now()})", "",
        f"{machine['kernels']}; {args.threads} threads; "
        f"{args.cached} cached tokens; streaming read "
        f"{reads} GB/s (before / after; floors "
        f"from {stream['read_gb_s']:.1f})"
        + (f"; integer dot peak {args.peak_gmacs:,.0f} G MAC/s" if args.peak_gmacs else "")
        + (f". {warn}" if warn else "") + ".", "",
        f"Engine AR: {ar['decode_tok_s']:.1f} tok/s ({ar['decode_ms_per_tok']:.2f} ms a "
        f"token); the weights a token reads: {wb['total'] / 1e6:,.0f} MB (layers "
        f"{layer_bytes / 1e6:,.0f}, head {wb['lm_head'] / 1e6:,.0f}): "
        f"{wb['total'] / (ar['decode_ms_per_tok'] / 1e3) / 1e9:.1f} GB/s achieved, "
        f"{100 * wb['total'] / (ar['decode_ms_per_tok'] / 1e3) / read:.0f}% of the stream.", "",
        *table_lines(["part", "ms", "floor ms", "note"],
                     [[p, f"{ms:.2f}", "-" if f is None else f"{f:.2f}", note]
                      for p, ms, f, note in rows_]),
        "",
        "Each kind of matrix alone, one row through every layer's in turn (qlinear):", "",
        *table_lines(["matrices", "ms", "MB", "GB/s", "of the stream"], group_rows),
        "",
        f"`exp_decode_profile.py --model {name} --cached {args.cached} --threads "
        f"{args.threads} --repeats {args.repeats}`",
    ]
    data = {"date": utc_now(), "model": str(args.model), "machine": machine, "stream": stream,
            "streams": streams,
            "cached": args.cached, "threads": args.threads, "repeats": args.repeats,
            "peak_gmacs": args.peak_gmacs, "ar": ar, "forward_ms": fwd, "groups": groups,
            "weight_bytes": wb, "kv_bytes": kv_bytes,
            "rows": [{"part": p, "ms": ms, "floor_ms": f, "note": n} for p, ms, f, n in rows_]}
    write_outputs(args.out, data, lines)


if __name__ == "__main__":
    main()
