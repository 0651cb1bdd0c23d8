#!/usr/bin/env python
"""REST vs CREST vs static SAM on the same corpora (issue 6).

Benchmarks and corpora (from the shared data, see ../shared/data/MANIFEST.json):

  mt_bench   chat corpus: ShareGPT (1000 + 500 filtered conversations) + Alpaca-style
             (LLaMA-Factory alpaca_en_demo, Stanford Alpaca seed tasks)
  humaneval  code corpus: CodeAlpaca 2k + MBPP

For each benchmark:

* REST at 1, 2, 4, ..., 100% of the corpus documents (a fixed random order, so every
  fraction is a superset of the smaller ones);
* CREST over the full corpus at a grid of top-t (multiple n = 1..max_n, t per n), with
  the REST default tree size (64 nodes) and with trees cut to the engine's draft budget
  (16 nodes, ``--budget-nodes``: the engine never uses more, so the MAT is the same);
* single-n ablation: one n, ``max_n * t`` n-grams (the same number of entries);
* ``sam`` static-only (``dynamic=False``): our suffix-automaton index on the same corpus;
* ``pld`` (prompt lookup, no corpus) as a reference.

Storage = bytes on disk (REST file, CREST SQLite file, SAM index file). MAT = exact
offline replay of recorded greedy ``ar`` answers (``recallspec.bench.replay.exact``: the
drafter sees exactly what it would see in the engine). Lookup latency = the drafter's
``propose`` time per step during the replay (median µs; CREST: on SQLite). The codecs
for CREST tree values are measured on the trees of one store. ``--real N`` also runs the
engine (AR vs the best configurations) on the first N answers of each benchmark for
wall-clock speedups and a token-identity check.

  .venv/bin/python benchmarks/experiments/exp_datastore.py --out bench_out/datastore \\
      --answers mt_bench=/tmp/ar_mt/answers/ar.jsonl humaneval=/tmp/ar_he/answers/ar.jsonl

Without ``--answers`` the ``ar`` answers are generated first (``recallspec bench --suite S
--methods ar --limit --questions``).

Feeds docs/DATASTORE.md, "Results": the notebook docs/history/benchmarks_2026-11.md, "REST
and CREST datastores (issue 6)" (run: docs/results/datastore/exp_datastore/).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from itertools import count
from pathlib import Path
from typing import Any

import numpy as np
from _common import utc_now

from recallspec.bench.replay.exact import ReplayConfig, load_ar_answers, replay_turn
from recallspec.data.paths import data_dir
from recallspec.decoding.tree import DraftTree
from recallspec.drafters.base import Drafter
from recallspec.drafters.registry import create_drafter
from recallspec.markdown import table_lines
from recallspec.models import load_tokenizer
from recallspec.recall.automata import StaticIndex
from recallspec.recall.datastore.crest import CrestConfig, build_crest, compute_rows, measure_codecs
from recallspec.recall.datastore.rest import RestDatastore, RetrievalConfig, build_rest
from recallspec.recall.datastore.tokenize import tokenize_corpus

CORPORA = {
    "mt_bench": ["sharegpt/mlenergy_ShareGPT_V3_filtered_1000.json",
                 "sharegpt/mlenergy_ShareGPT_V3_filtered_500.json",
                 "alpaca/llamafactory_alpaca_en_demo.json",
                 "alpaca/stanford_alpaca_seed_tasks.jsonl"],
    "humaneval": ["alpaca/codealpaca_code_alpaca_2k.json", "mbpp/mbpp.jsonl"],
}
FRACTIONS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0)


class Timed:
    """Wraps a drafter; records every propose() call's duration."""

    def __init__(self, inner: Drafter) -> None:
        self.inner = inner
        self.name = inner.name
        self.needs_logits = inner.needs_logits
        self.times: list[float] = []
        self.nodes: list[int] = []

    def start(self, rid: int, prompt: Sequence[int]) -> None:
        self.inner.start(rid, prompt)

    def propose(self, rid: int, max_nodes: int) -> DraftTree:
        t = time.perf_counter()
        tree = self.inner.propose(rid, max_nodes)
        self.times.append(time.perf_counter() - t)
        self.nodes.append(len(tree))
        return tree

    def observe(self, rid: int, accepted: Sequence[int], tree: DraftTree, logits: Any) -> None:
        self.inner.observe(rid, accepted, tree, logits)

    def stop(self, rid: int) -> None:
        self.inner.stop(rid)


def replay(records: list[dict[str, Any]], cfg: ReplayConfig, method: str,
           options: dict[str, Any]) -> dict[str, Any]:
    """MAT (pooled accept lengths), lookup µs median/p90, drafted nodes per step."""
    d = Timed(create_drafter(method, **options))
    rids = count()
    acc: list[int] = []
    for rec in records:
        c = rec["choices"][0]
        eos = rec.get("eos_token_ids") or []
        for p, toks, fin in zip(c["prompt_ids"], c["token_ids"], c["finish_reason"],
                                strict=True):
            acc += replay_turn(d, next(rids), p, toks, fin == "eos", eos, cfg)
    us = np.asarray(d.times) * 1e6
    return {"mat": statistics.fmean(acc) if acc else None, "steps": len(acc),
            "lookup_us_median": float(np.median(us)) if us.size else None,
            "lookup_us_p90": float(np.percentile(us, 90)) if us.size else None,
            "drafted_nodes_mean": float(np.mean(d.nodes)) if d.nodes else 0.0}


def ensure_answers(bench: str, given: dict[str, str], out: Path, limit: int) -> Path:
    if bench in given:
        return Path(given[bench])
    run = out / f"ar_{bench}"
    path = run / "answers" / "ar.jsonl"
    if not path.is_file():
        subprocess.run([sys.executable, "-m", "recallspec", "bench", "--suite", bench,
                        "--methods", "ar", "--limit", str(limit), "--max-new-tokens", "128",
                        "--out", str(run), "--resume", "--no-progress"], check=True)
    return path


def run_benchmark(bench: str, answers: Path, args: argparse.Namespace, work: Path,
                  tok: Any) -> dict[str, Any]:
    records, settings = load_ar_answers(answers)
    cfg = ReplayConfig(max_new_tokens=int(settings.get("max_new_tokens", 128)),
                       max_draft_nodes=int(settings.get("max_draft_nodes", 16)))
    fp = tok.fingerprint
    root = data_dir(args.data_dir)
    files = [str(root / f) for f in CORPORA[bench] if (root / f).is_file()]
    t0 = time.perf_counter()
    docs = [d for d in tokenize_corpus(files, tok, progress=True, desc=f"{bench} corpus")
            if len(d)]
    tok_s = time.perf_counter() - t0
    order = np.random.default_rng(0).permutation(len(docs))
    docs = [docs[i] for i in order]
    res: dict[str, Any] = {
        "corpus_files": [Path(f).name for f in files], "documents": len(docs),
        "corpus_tokens": int(sum(len(d) for d in docs)), "tokenize_seconds": tok_s,
        "answers": str(answers), "questions": len(records), "replay": vars(cfg), "rows": [],
    }
    rows: list[dict[str, Any]] = res["rows"]

    def add(kind: str, label: str, storage: int, build_s: float, method: str,
            options: dict[str, Any], **extra: Any) -> dict[str, Any]:
        r = replay(records, cfg, method, {**options, "tokenizer_fingerprint": fp}
                   if method != "pld" else options)
        row = {"kind": kind, "label": label, "storage_bytes": storage,
               "build_seconds": round(build_s, 3), "method": method, "options": options,
               **extra, **r}
        rows.append(row)
        print(f"[{bench}] {label:34} {storage:>12,} B  MAT {r['mat']:.3f}  "
              f"lookup {r['lookup_us_median']:.1f} µs", flush=True)
        return row

    add("pld", "pld (no corpus)", 0, 0.0, "pld", {})
    # REST at growing fractions of the corpus.
    for f in args.fractions:
        k = max(1, round(f * len(docs)))
        path = work / f"{bench}_rest_{round(f * 100):03d}.rest"
        t = time.perf_counter()
        ds = build_rest(docs[:k], vocab_size=tok.vocab_size, tokenizer_fingerprint=fp,
                        path=path)
        add("rest", f"REST {f:.0%}", ds.file_bytes, time.perf_counter() - t, "rest",
            {"datastore": str(path)}, fraction=f, corpus_tokens=ds.n_tokens)
        ds.close()
    full_path = work / f"{bench}_rest_100.rest"
    if not full_path.is_file():
        build_rest(docs, vocab_size=tok.vocab_size, tokenizer_fingerprint=fp, path=full_path)
    full = RestDatastore.open(full_path, expected_fingerprint=fp)
    # CREST: multiple n top-t, REST tree size and the engine's budget; single-n ablation.
    for nodes in (64, args.budget_nodes):
        for t_ in args.top_t:
            c = CrestConfig(max_n=args.max_n, top_t=t_,
                            retrieval=RetrievalConfig(tree_nodes=nodes))
            path = work / f"{bench}_crest_n{args.max_n}_t{t_}_k{nodes}.crest"
            b = build_crest(full, c, str(path))
            add("crest", f"CREST n<={args.max_n} t={t_} nodes={nodes}", b.storage_bytes,
                b.seconds, "crest", {"datastore": str(path)}, top_t=t_, tree_nodes=nodes,
                entries=b.n_entries, mean_tree_nodes=b.mean_tree_nodes)
    for n in range(1, args.max_n + 1):
        for t_ in args.single_t:
            c = CrestConfig(single_n=n, top_t=t_ * args.max_n,
                            retrieval=RetrievalConfig(tree_nodes=args.budget_nodes))
            path = work / f"{bench}_crest_single{n}_t{t_}.crest"
            b = build_crest(full, c, str(path))
            add("crest-single", f"CREST single n={n} t={t_ * args.max_n}", b.storage_bytes,
                b.seconds, "crest", {"datastore": str(path)}, single_n=n,
                top_t=t_ * args.max_n, tree_nodes=args.budget_nodes, entries=b.n_entries,
                mean_tree_nodes=b.mean_tree_nodes)
    # Static suffix-automaton index on the same corpus, static drafts only.
    path = work / f"{bench}.rsidx"
    t = time.perf_counter()
    StaticIndex.build(docs, tok.vocab_size, fp, path)
    sam_s = time.perf_counter() - t
    for opts in ({"tree": False}, {"tree": True, "delta": 0}):
        add("sam-static", f"sam static-only {opts}", path.stat().st_size, sam_s, "sam",
            {"index": str(path), "dynamic": False, **opts})
    # Codec choice, measured on the trees of a mid-size store.
    trees: list[DraftTree] = []
    compute_rows(full, CrestConfig(max_n=args.max_n, top_t=args.top_t[len(args.top_t) // 2]),
                 on_tree=trees.append)
    res["codecs"] = measure_codecs(trees, tok.vocab_size)
    res["codecs_trees"] = len(trees)
    full.close()
    res["summary"] = summarize(rows)
    return res


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    rest = [r for r in rows if r["kind"] == "rest"]
    best = max(rest, key=lambda r: r["mat"])
    crest = [r for r in rows if r["kind"] in ("crest", "crest-single")]
    reach = [r for r in crest if r["mat"] >= best["mat"]]
    smallest = min(reach, key=lambda r: r["storage_bytes"]) if reach else None
    best_crest = max(crest, key=lambda r: r["mat"])
    return {
        "rest_best": {k: best[k] for k in ("label", "mat", "storage_bytes")},
        "crest_best": {k: best_crest[k] for k in ("label", "mat", "storage_bytes")},
        "crest_smallest_reaching_rest_best": None if smallest is None else {
            k: smallest[k] for k in ("label", "mat", "storage_bytes", "lookup_us_median")},
        "storage_ratio": None if smallest is None
        else smallest["storage_bytes"] / best["storage_bytes"],
        "crest_lookup_us_median_max": max(r["lookup_us_median"] for r in crest),
    }


def real_runs(bench: str, res: dict[str, Any], answers: Path, n: int) -> dict[str, Any]:
    """Engine runs on the first n answers: AR vs the best configurations."""
    from recallspec.decoding.sampling import SamplingParams
    from recallspec.engine import Engine

    records, settings = load_ar_answers(answers)
    records = records[:n]
    eng = Engine.load(None, prefix_cache=False)  # every answer prefilled: methods compared
    params = SamplingParams(max_new_tokens=int(settings.get("max_new_tokens", 128)))
    rows = res["rows"]
    pick = {
        "rest": max((r for r in rows if r["kind"] == "rest"), key=lambda r: r["mat"]),
        "crest": max((r for r in rows if r["kind"] == "crest"), key=lambda r: r["mat"]),
        "sam-static": max((r for r in rows if r["kind"] == "sam-static"),
                          key=lambda r: r["mat"]),
    }
    prompts = [(p, t) for rec in records for p, t in
               zip(rec["choices"][0]["prompt_ids"], rec["choices"][0]["token_ids"],
                   strict=True)]
    out: dict[str, Any] = {"questions": len(records), "turns": len(prompts)}

    def timed(drafter: str, opts: dict[str, Any]) -> tuple[float, int, bool, float]:
        t = 0.0
        toks = steps = 0
        eng.generate(prompts[0][0], params, drafter=drafter, drafter_options=opts)  # warm
        same = True
        for p, ref in prompts:
            r = eng.generate(p, params, drafter=drafter, drafter_options=opts)
            t += r.wall_time
            toks += r.new_tokens
            steps += r.steps
            same &= r.token_ids[: len(ref)] == list(ref)
        return t, toks, same, toks / max(1, steps)

    ar_t, ar_toks, ar_same, _ = timed("none", {})
    out["ar"] = {"seconds": ar_t, "tokens": ar_toks, "identical_to_recorded": ar_same}
    for name, row in pick.items():
        s, toks, same, mat = timed(row["method"], row["options"])
        out[name] = {"label": row["label"], "seconds": s, "tokens": toks,
                     "speedup": ar_t / s if s else None, "mat": mat,
                     "identical_to_recorded": same}
        print(f"[{bench}] real {row['label']}: speedup {ar_t / s:.2f}x MAT {mat:.2f} "
              f"identical {same}", flush=True)
    return out


def render(res: dict[str, Any]) -> str:
    out = ["# Datastores: REST vs CREST vs static SAM", "",
           f"machine: {res['machine']}, date {res['date']}, command `{res['command']}`", ""]
    for bench, b in res["benchmarks"].items():
        out += [f"## {bench}", "",
                f"corpus: {', '.join(b['corpus_files'])} - {b['documents']:,} documents, "
                f"{b['corpus_tokens']:,} tokens; {b['questions']} recorded ar answers "
                f"({b['answers']}), replay max_new_tokens {b['replay']['max_new_tokens']}, "
                f"max_draft_nodes {b['replay']['max_draft_nodes']}", ""]
        out += table_lines(
            ["config", "storage bytes", "build s", "entries", "mean stored tree",
             "drafted nodes/step", "MAT", "lookup µs median", "p90"],
            [[r["label"], f"{r['storage_bytes']:,}", f"{r['build_seconds']:.2f}",
              r.get("entries", "-"),
              f"{r['mean_tree_nodes']:.1f}" if "mean_tree_nodes" in r else "-",
              f"{r['drafted_nodes_mean']:.1f}", f"{r['mat']:.3f}",
              f"{r['lookup_us_median']:.1f}", f"{r['lookup_us_p90']:.1f}"] for r in b["rows"]])
        s = b["summary"]
        out += ["", f"REST best: {s['rest_best']['label']} MAT {s['rest_best']['mat']:.3f} "
                f"at {s['rest_best']['storage_bytes']:,} B."]
        sm = s["crest_smallest_reaching_rest_best"]
        if sm:
            out.append(f"Smallest CREST reaching it: {sm['label']} MAT {sm['mat']:.3f} at "
                       f"{sm['storage_bytes']:,} B = {s['storage_ratio']:.3f} of REST's "
                       f"storage; lookup {sm['lookup_us_median']:.1f} µs median.")
        else:
            out.append("No CREST configuration reaches REST's best MAT.")
        out += ["", "CREST tree codecs (on "
                f"{b['codecs_trees']} trees): " + "; ".join(
                    f"{k} {v['bytes']:,.0f} B, decode {v['decode_us_median']:.1f} µs, "
                    f"encode {v['encode_us_median']:.1f} µs" for k, v in b["codecs"].items()),
                ""]
        if "real" in b:
            rr = b["real"]
            out.append(f"Real engine runs on {rr['questions']} questions ({rr['turns']} "
                       f"turns): AR {rr['ar']['seconds']:.1f} s; " + "; ".join(
                           f"{v['label']}: {v['speedup']:.2f}x, MAT {v['mat']:.2f}, "
                           f"identical {v['identical_to_recorded']}"
                           for k, v in rr.items() if isinstance(v, dict) and k != "ar"))
            out.append("")
    return "\n".join(out) + "\n"


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    benches = list(res["benchmarks"])
    fig, axes = plt.subplots(1, len(benches), figsize=(6.5 * len(benches), 4.5), squeeze=False)
    for ax, bench in zip(axes[0], benches, strict=True):
        rows = res["benchmarks"][bench]["rows"]
        series: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            if r["kind"] == "pld":
                continue
            key = r["kind"] if r["kind"] != "crest" else f"CREST nodes={r['tree_nodes']}"
            if r["kind"] == "crest-single":
                key = f"CREST single n={r['single_n']}"
            series.setdefault(key, []).append(r)
        for key, rs in series.items():
            rs = sorted(rs, key=lambda r: r["storage_bytes"])
            ax.plot([r["storage_bytes"] for r in rs], [r["mat"] for r in rs], "o-"
                    if len(rs) > 1 else "s", label=key, markersize=4)
        pld = next((r for r in rows if r["kind"] == "pld"), None)
        if pld:
            ax.axhline(pld["mat"], color="gray", ls=":", label="pld (no corpus)")
        ax.set_xscale("log")
        ax.set_xlabel("storage (bytes on disk)")
        ax.set_ylabel("MAT (exact replay)")
        ax.set_title(bench)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--answers", nargs="*", default=[], metavar="BENCH=PATH",
                    help="recorded ar answers (ar.jsonl) per benchmark")
    ap.add_argument("--benchmarks", default="mt_bench,humaneval")
    ap.add_argument("--questions", type=int, default=20,
                    help="questions per benchmark when ar answers are generated here")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--fractions", type=float, nargs="+", default=list(FRACTIONS))
    ap.add_argument("--top-t", type=int, nargs="+", default=[25, 50, 100, 200, 400, 800, 1600])
    ap.add_argument("--single-t", type=int, nargs="+", default=[100, 400])
    ap.add_argument("--max-n", type=int, default=4)
    ap.add_argument("--budget-nodes", type=int, default=16)
    ap.add_argument("--real", type=int, default=0, metavar="N",
                    help="also run the engine on the first N answers (AR vs best configs)")
    args = ap.parse_args()
    out = Path(args.out)
    work = out / "stores"
    work.mkdir(parents=True, exist_ok=True)
    given = dict(a.split("=", 1) for a in args.answers)
    tok = load_tokenizer(None)
    res: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {platform.node()}",
        "date": utc_now(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "settings": {k: v for k, v in vars(args).items() if k != "answers"},
        "benchmarks": {},
    }
    for bench in args.benchmarks.split(","):
        answers = ensure_answers(bench, given, out, args.questions)
        b = run_benchmark(bench, answers, args, work, tok)
        if args.real > 0:
            b["real"] = real_runs(bench, b, answers, args.real)
        res["benchmarks"][bench] = b
        (out / "results.json").write_text(json.dumps(res, indent=1))
    (out / "report.md").write_text(render(res))
    plot(res, out / "mat_vs_storage.png")
    print(f"wrote {out}/results.json, report.md, mat_vs_storage.png")


if __name__ == "__main__":
    main()
