#!/usr/bin/env python
"""EMS-SD's Table 2 on our engine (issue 7): batched speculative decoding with and
without padding, and cost-aware adaptive drafting, at several batch sizes.

Prompts: Spec-Bench's summarisation questions, then CNN/DailyMail articles (the rows with
the article), through the chat template. For each batch size, in the same run:

  plain     plain batched greedy decoding (no drafter) at that batch size: the baseline
  <drafter>/<mode> for modes vanilla (padded inputs + padded KV), unpad-kv, unpad-input,
            ems (both unpadded) and adaptive (ems + cost-aware draft sizes); the padded
            layouts are recallspec.bench.suite.padded_layouts, installed into the engine for
            their runs (the engine itself decodes ems only); all but adaptive draft
            fixed sizes

tokens/s = generated tokens / wall time of the whole generate() call (prefill included,
identical for every mode); speedup = tokens/s over plain's at the same batch size.
Every run's tokens are compared with plain's, per prompt. Plus a continuous-batching run
with Poisson arrivals (throughput and mean latency vs request rate, with and without
speculation). Writes exp_batch.json, exp_batch.md, exp_batch.png; --resume keeps the
configurations already in exp_batch.json; --render-only rewrites the Markdown and the
plot from it.

--blocks K splits the prompts into K consecutive blocks and runs every configuration of a
batch size on one block before the next block (in an order rotated from block to block),
so a slow spell of a noisy machine hits all configurations alike. Totals are summed over
the blocks; the median of the per-block speedups is reported beside the total one.

  .venv/bin/python benchmarks/experiments/exp_batch.py --out bench_out/batch --prompts 96 \\
      --batch-sizes 1 2 4 8 16 24

Feeds docs/USAGE.md, "Batches" (the padded layouts are an ablation, compared here), and
the notebook docs/history/benchmarks_2026-11.md, "Batched speculative decoding, EMS-SD
layout (issue 7)" (runs: docs/results/batch/).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

from _common import utc_now

from recallspec.bench.common.prompting import conversation_ids
from recallspec.bench.common.suites import SuiteSelection, load_suite
from recallspec.bench.suite.padded_layouts import padded_layout
from recallspec.decoding.sampling import SamplingParams
from recallspec.engine import Engine, EngineConfig
from recallspec.markdown import table_lines

MODES = ("vanilla", "unpad-kv", "unpad-input", "ems", "adaptive")
DRAFTERS = {"llma": {}, "draft-model": {"layers": 8, "gamma": 4}}


def prompts(engine: Engine, n: int, max_prompt: int, data: str | None) -> list[list[int]]:
    qs = load_suite("spec_bench", SuiteSelection(categories=("summarization",)), data)
    qs += load_suite("cnndm", None, data)
    out = []
    for q in qs:
        ids = conversation_ids(engine.tokenizer, [q.turns[0]], [])
        if len(ids) <= max_prompt:
            out.append(ids)
        if len(out) == n:
            break
    return out


def run_one(eng: Engine, ps: list[list[int]], params: SamplingParams, drafter: str,
            mode: str, arrivals: list[float] | None = None) -> dict[str, Any]:
    opts = DRAFTERS.get(drafter, {})
    # A mode is a batch layout at fixed sizes, or "adaptive": the ems layout, cost-aware.
    layout, sizing = ("ems", "adaptive") if mode == "adaptive" else (mode, "fixed")
    with padded_layout(eng, layout) as pad:
        t0 = time.perf_counter()
        res = eng.generate(ps, params, drafter=drafter, drafter_options=opts, mode=sizing,
                           arrivals=arrivals)
        wall = time.perf_counter() - t0
    st = eng.stats
    toks = sum(r.new_tokens for r in res)
    acc = [a for r in res for a in r.accept_lengths]
    return {
        "drafter": drafter, "mode": mode, "wall_s": wall, "new_tokens": toks,
        "tokens_per_s": toks / wall, "decode_tokens_per_s": st.decode_tokens_per_s,
        "decode_tokens": st.decode_only_tokens, "decode_s": st.decode_only_s,
        "verified_tokens": st.new_tokens, "accepted": sum(acc), "accept_steps": len(acc),
        "mat": sum(acc) / len(acc) if acc else 0.0,
        "steps": st.steps, "rows": st.rows, "padding_rows": pad.rows,
        "kv_padding": pad.kv_entries, "padding_ratio": pad.ratio(st.new_tokens),
        "draft_nodes": st.draft_nodes, "forward_s": st.forward_s, "draft_s": st.draft_s,
        "mean_latency_s": sum(r.latency for r in res) / len(res),
        "token_ids": [r.token_ids for r in res],
        "errors": [r.error for r in res if r.error],
        "prompts": len(ps),
    }


def merge_blocks(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One configuration's result over consecutive prompt blocks: counts and times
    summed, rates recomputed from the sums, token ids concatenated in prompt order."""
    out = dict(parts[0])
    for k in ("wall_s", "new_tokens", "decode_tokens", "decode_s", "verified_tokens",
              "accepted", "accept_steps", "steps", "rows", "padding_rows", "kv_padding",
              "draft_nodes", "forward_s", "draft_s", "prompts"):
        out[k] = sum(p[k] for p in parts)
    out["tokens_per_s"] = out["new_tokens"] / out["wall_s"]
    out["decode_tokens_per_s"] = out["decode_tokens"] / max(out["decode_s"], 1e-9)
    out["mat"] = out["accepted"] / max(out["accept_steps"], 1)
    out["padding_ratio"] = out["padding_rows"] / max(out["verified_tokens"], 1)
    out["mean_latency_s"] = (sum(p["mean_latency_s"] * p["prompts"] for p in parts)
                             / out["prompts"])
    out["token_ids"] = [t for p in parts for t in p["token_ids"]]
    out["errors"] = [e for p in parts for e in p["errors"]]
    out["blocks"] = len(parts)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--data", default=None, help="data dir (default: $RECALLSPEC_DATA_DIR)")
    ap.add_argument("--prompts", type=int, default=96)
    ap.add_argument("--max-prompt", type=int, default=1024, help="skip longer prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 24])
    ap.add_argument("--drafters", nargs="+", default=list(DRAFTERS))
    ap.add_argument("--modes", nargs="+", default=list(MODES))
    ap.add_argument("--rates", type=float, nargs="*", default=[0.5, 1.0, 2.0, 4.0],
                    help="Poisson request rates (req/s) for the continuous-batching run")
    ap.add_argument("--poisson-batch", type=int, default=8)
    ap.add_argument("--poisson-prompts", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=1,
                    help="interleave configurations over this many prompt blocks")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--render-only", action="store_true")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "exp_batch.json"
    if a.render_only:
        done = json.loads(path.read_text())
        (a.out / "exp_batch.md").write_text(render(done))
        plot(done, a.out / "exp_batch.png")
        return
    res: dict[str, Any] = json.loads(path.read_text()) if a.resume and path.is_file() else {}
    res.setdefault("runs", {})
    res["machine"] = {"node": platform.node(), "processor": platform.processor(),
                      "date": utc_now()}
    res["config"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}

    def save() -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(res))
        tmp.replace(path)
        (a.out / "exp_batch.md").write_text(render(res))

    eng0 = Engine.load(a.model, max_batch_size=max([*a.batch_sizes, a.poisson_batch]))
    ps = prompts(eng0, a.prompts, a.max_prompt, a.data)
    size = -(-len(ps) // max(a.blocks, 1))
    blocks = [ps[i : i + size] for i in range(0, len(ps), size)]
    res["prompts"] = {"count": len(ps), "mean_len": sum(map(len, ps)) / len(ps)}
    params = SamplingParams(max_new_tokens=a.max_new_tokens)
    curve = eng0.cost_curve()
    res["cost_curve"] = {"tokens": curve.tokens, "seconds": curve.seconds,
                         "per_seq": curve.per_seq}
    # Warm-up (first forwards, drafter construction) outside any timing.
    eng0.generate(ps[:2], SamplingParams(max_new_tokens=8), drafter="llma")
    for bs in a.batch_sizes:
        cfg = EngineConfig(max_batch_size=bs, prefix_cache=False)  # every run prefilled
        eng = Engine(eng0.model, eng0.tokenizer, cfg)
        runs = res["runs"].setdefault(str(bs), {})
        # One sequence has nothing to pad: the padded layouts are ems there.
        modes = a.modes if bs > 1 else [m for m in a.modes if m in ("ems", "adaptive")]
        todo = [("none", "ems")] + [(d, m) for d in a.drafters for m in modes]
        keys = ["plain" if d == "none" else f"{d}/{m}" for d, m in todo]
        parts = res.setdefault("blocks", {}).setdefault(str(bs), {})
        for k, block in enumerate(blocks):
            # Rotate the order from block to block: a configuration that always ran
            # first (or last) in a block could carry a systematic effect of its place.
            rot = k % len(todo)
            for key, (d, m) in zip(keys[rot:] + keys[:rot], todo[rot:] + todo[:rot], strict=True):
                done = parts.setdefault(key, [])
                if key in runs or len(done) > k:
                    continue
                done.append(run_one(eng, block, params, d, m))
                if len(blocks) > 1:
                    print(f"bs={bs:>2} {key:<24} block {k + 1}/{len(blocks)}: "
                          f"{done[-1]['tokens_per_s']:.1f} tok/s", flush=True)
                save()
        for key in keys:
            if key in runs:
                continue
            r = merge_blocks(parts[key])
            for part in parts[key]:
                part.pop("token_ids", None)  # kept once, in the merged result
            base = runs.get("plain")
            if base is not None:
                r["identical"] = sum(x == y for x, y in zip(r["token_ids"], base["token_ids"],
                                                            strict=True)) / len(ps)
                r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"]
                r["decode_speedup"] = r["decode_tokens_per_s"] / base["decode_tokens_per_s"]
                if len(parts.get("plain", [])) == len(parts[key]):  # plain ran in blocks too
                    r["block_speedup_median"] = statistics.median(
                        p["tokens_per_s"] / b["tokens_per_s"]
                        for p, b in zip(parts[key], parts["plain"], strict=True))
            else:
                r["identical"], r["speedup"], r["decode_speedup"] = 1.0, 1.0, 1.0
            runs[key] = r
            print(f"bs={bs:>2} {key:<24} {r['tokens_per_s']:7.1f} tok/s  "
                  f"x{r['speedup']:.2f} (decode x{r['decode_speedup']:.2f})  "
                  f"MAT {r['mat']:.2f}  pad {r['padding_ratio']:.2f}  "
                  f"identical {r['identical']:.0%}", flush=True)
            save()
    # Continuous batching with Poisson arrivals.
    pois = res.setdefault("poisson", {})
    cfg = EngineConfig(max_batch_size=a.poisson_batch, prefix_cache=False)
    eng = Engine(eng0.model, eng0.tokenizer, cfg)
    pp = ps[: a.poisson_prompts]
    for rate in a.rates:
        rng = random.Random(0)
        t, arr = 0.0, []
        for _ in pp:
            arr.append(t)
            t += rng.expovariate(rate)
        for d, m in (("none", "ems"), ("llma", "ems"), ("llma", "adaptive")):
            key = f"{rate}/{d}/{m}"
            if key in pois:
                continue
            r = run_one(eng, pp, params, d, m, arrivals=arr)
            r["rate"] = rate
            pois[key] = r
            print(f"rate {rate}/s {d}/{m}: {r['tokens_per_s']:.1f} tok/s, mean latency "
                  f"{r['mean_latency_s']:.2f} s", flush=True)
            save()
    save()
    plot(res, a.out / "exp_batch.png")


def _by_batch(res: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(batch size, its runs), smallest batch first (the JSON keeps run order)."""
    return sorted(res["runs"].items(), key=lambda kv: int(kv[0]))


def render(res: dict[str, Any]) -> str:
    lines = ["# Batched speculative decoding (EMS-SD Table 2 layout)", "",
             f"{res['machine']['date']}, {res['machine']['processor']}; "
             f"prompts: {res.get('prompts')}; config: {res['config']}", "",
             "Speedup over plain batched greedy decoding at the same batch size, end to end "
             "(prefill included) / decode phase only (steps without prompt rows); MAT; "
             "input padding ratio (padding rows per generated token); with --blocks, the "
             "median of the per-block speedups; identical to plain.", ""]
    keys: list[str] = []
    for runs in res["runs"].values():
        keys += [k for k in runs if k not in keys]
    rows = []
    for bs, runs in _by_batch(res):
        cells = []
        for k in keys:
            r = runs.get(k)
            cells.append("" if r is None else (
                f"{r['tokens_per_s']:.1f} / {r['decode_tokens_per_s']:.1f} tok/s" if k == "plain"
                else f"{r['speedup']:.2f}x / {r['decode_speedup']:.2f}x (MAT {r['mat']:.2f}, "
                f"pad {r['padding_ratio']:.2f}"
                + (f", block median {r['block_speedup_median']:.2f}x"
                   if "block_speedup_median" in r else "")
                + f"{'' if r['identical'] == 1.0 else ', NOT IDENTICAL'})"))
        rows.append([bs, *cells])
    lines += table_lines(["batch", *keys], rows)
    lines += checks(res)
    if res.get("poisson"):
        lines += ["", "Continuous batching, Poisson arrivals:", ""]
        lines += table_lines(
            ["rate (req/s)", "method", "tokens/s", "mean latency (s)"],
            [[r["rate"], f"{r['drafter']}/{r['mode']}", f"{r['tokens_per_s']:.1f}",
              f"{r['mean_latency_s']:.2f}"] for r in res["poisson"].values()])
    return "\n".join(lines) + "\n"


def checks(res: dict[str, Any]) -> list[str]:
    """The issue's goals per drafter and batch size: EMS-SD over vanilla, adaptive over
    plain, and adaptive over EMS-SD where EMS-SD loses to plain."""
    drafters = sorted({k.split("/")[0] for r in res["runs"].values() for k in r if "/" in k})
    out = ["", "Goals: EMS-SD ≥ vanilla (≥ 1.3x at batch 8); adaptive ≥ 0.95x plain; "
           "adaptive ≥ EMS-SD where EMS-SD < 1.0x.", ""]
    rows = []
    for d in drafters:
        for bs, runs in _by_batch(res):
            ems, van, ada = (runs.get(f"{d}/{m}") for m in ("ems", "vanilla", "adaptive"))
            ev = f"{ems['tokens_per_s'] / van['tokens_per_s']:.2f}" if ems and van else None
            ap = f"{ada['speedup']:.2f}" if ada else None
            ae = (f"{ada['tokens_per_s'] / ems['tokens_per_s']:.2f}"
                  + (" (EMS-SD < 1)" if ems["speedup"] < 1.0 else "")) if ada and ems else None
            rows.append([d, bs, ev, ap, ae])
    return out + table_lines(
        ["drafter", "batch", "EMS-SD / vanilla", "adaptive / plain", "adaptive / EMS-SD"], rows)


def plot(res: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    pois = list(res.get("poisson", {}).values())
    fig, axes = plt.subplots(1, 3 if pois else 1, figsize=(15 if pois else 7, 4), squeeze=False)
    ax = axes[0][0]
    bss = sorted(int(b) for b in res["runs"])
    keys = sorted({k for r in res["runs"].values() for k in r if k != "plain"})
    for k in keys:
        ys = [res["runs"][str(b)].get(k, {}).get("speedup") for b in bss]
        ax.plot(bss, ys, marker="o", label=k)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(bss, [str(b) for b in bss])
    ax.set_xlabel("batch size")
    ax.set_ylabel("speedup vs plain batched greedy")
    ax.legend(fontsize=7)
    if pois:
        methods = sorted({f"{r['drafter']}/{r['mode']}" for r in pois})
        for i, (field, label) in enumerate((("tokens_per_s", "tokens/s"),
                                            ("mean_latency_s", "mean latency (s)"))):
            ax = axes[0][i + 1]
            for m in methods:
                rs = sorted((r for r in pois if f"{r['drafter']}/{r['mode']}" == m),
                            key=lambda r: r["rate"])
                name = "plain" if m.startswith("none/") else m
                ax.plot([r["rate"] for r in rs], [r[field] for r in rs], marker="o", label=name)
            ax.set_xlabel("Poisson arrival rate (requests/s)")
            ax.set_ylabel(label)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
