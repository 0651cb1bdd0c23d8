"""Reports computed from answer files only (so a resumed run reports all its answers).

Definitions (as Spec-Bench's evaluation/speed.py):
  * MAT (mean accepted tokens): mean of all per-step accept lengths of the group,
    pooled over questions and turns (the prefill token is not a step).
  * tokens/s: per question, total new tokens / total wall time over its turns; the
    group's value is the mean over questions.
  * speedup: the method's tokens/s / its baseline's tokens/s (ratio of means),
    both over the questions the two have in common. A method's baseline is its own
    greedy decoding (``ar`` for ours, ``hf-greedy`` for hf-*, ...); ``speedup_vs_ar``
    compares everyone to our ``ar``.
  * identical: fraction of common questions whose generated token ids (every turn)
    equal the baseline's.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recallspec.bench.common.answers import iter_answer_files, read_answers
from recallspec.bench.common.llamacpp import peer_info
from recallspec.bench.common.machine import machine_info
from recallspec.bench.common.method import baseline_of
from recallspec.bench.common.report import num, peer_line, pyplot
from recallspec.markdown import table_lines

OVERALL = "overall"


def _speed(rec: dict[str, Any]) -> float:
    c = rec["choices"][0]
    t = sum(c["wall_time"])
    return sum(c["new_tokens"]) / t if t > 0 else 0.0


def _tokens(rec: dict[str, Any]) -> list[list[int]]:
    return [list(x) for x in rec["choices"][0]["token_ids"]]


def group_stats(
    recs: Sequence[dict[str, Any]], base: Sequence[dict[str, Any]] | None,
) -> dict[str, Any]:
    """Stats of one method over one group of questions, vs. an optional baseline group."""
    accepts = [a for r in recs for a in r["choices"][0]["accept_lengths"]]
    out: dict[str, Any] = {
        "questions": len(recs),
        "new_tokens": sum(sum(r["choices"][0]["new_tokens"]) for r in recs),
        "steps": len(accepts),
        "mat": statistics.fmean(accepts) if accepts else None,
        "tokens_per_s": statistics.fmean(_speed(r) for r in recs) if recs else None,
    }
    if base is None:
        return out
    b_by = {str(r["question_id"]): r for r in base}
    common = [r for r in recs if str(r["question_id"]) in b_by]
    out["common_questions"] = len(common)
    if common:
        mine = statistics.fmean(_speed(r) for r in common)
        theirs = statistics.fmean(_speed(b_by[str(r["question_id"])]) for r in common)
        out["speedup"] = mine / theirs if theirs > 0 else None
        out["identical"] = statistics.fmean(
            float(_tokens(r) == _tokens(b_by[str(r["question_id"])])) for r in common
        )
    else:
        out["speedup"] = out["identical"] = None
    return out


def build_report(out_dir: Path) -> dict[str, Any]:
    answers = {m: read_answers(p) for m, p in iter_answer_files(out_dir)}
    run_meta: dict[str, Any] = {}
    if (out_dir / "run.json").is_file():
        run_meta = json.loads((out_dir / "run.json").read_text(encoding="utf-8"))
    order = list(run_meta.get("config", {}).get("methods", []))
    methods = [m for m in order if m in answers] + sorted(m for m in answers if m not in order)
    cats: list[str] = []
    for m in methods:
        for r in answers[m]:
            if r["category"] not in cats:
                cats.append(r["category"])
    report: dict[str, Any] = {
        "out_dir": str(out_dir),
        "run": run_meta,
        "machine": machine_info(),
        "peer": _peer(run_meta, methods),
        "methods": {},
        "categories": cats,
    }
    for m in methods:
        base_name = baseline_of(m)
        per: dict[str, Any] = {}
        for cat in [*cats, OVERALL]:
            sel = lambda rs, c=cat: [r for r in rs if c == OVERALL or r["category"] == c]  # noqa: E731
            recs = sel(answers[m])
            if not recs:
                continue
            st = group_stats(recs, sel(answers[base_name]) if base_name in answers else None)
            if "ar" in answers:
                vs_ar = group_stats(recs, sel(answers["ar"]))
                st["speedup_vs_ar"] = vs_ar.get("speedup")
                st["identical_to_ar"] = vs_ar.get("identical")
            per[cat] = st
        hist: dict[str, int] = {}
        for r in answers[m]:
            for a in r["choices"][0]["accept_lengths"]:
                hist[str(a)] = hist.get(str(a), 0) + 1
        report["methods"][m] = {
            "baseline": base_name if base_name in answers else None,
            "stats": per,
            "accept_length_histogram": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
        }
    return report


# What a CPU user runs otherwise: every method's tokens/s is also shown against it.
PEER_BASELINE = "llamacpp-greedy"


def render_markdown(rep: dict[str, Any]) -> str:
    lines = ["# Benchmark report", ""]
    cfg = rep.get("run", {}).get("config", {})
    if cfg:
        lines += [
            f"suite `{cfg.get('suite')}`, model `{cfg.get('model') or 'default'}`, "
            f"dtype {cfg.get('dtype')}, max_new_tokens {cfg.get('max_new_tokens')}, "
            f"temperature {cfg.get('temperature')}, repeats {cfg.get('repeats')}; "
            f"machine: {rep['machine']['cpu']}, {rep['machine']['torch_threads']} threads, "
            f"{rep['machine'].get('kernels', 'kernels not recorded')}, "
            f"load {rep['machine'].get('loadavg_1m')} at report time",
            "",
        ]
    lines += peer_line(rep.get("peer"))
    overall = []
    for m, info in rep["methods"].items():
        s = info["stats"].get(OVERALL, {})
        overall.append([
            m, info["baseline"] or "-", str(s.get("questions", 0)), num(s.get("mat")),
            num(s.get("tokens_per_s"), ".1f"), num(s.get("speedup"), ".2f", "x"),
            num(s.get("speedup_vs_ar"), ".2f", "x"), num(_pct(s.get("identical")), ".0f", "%"),
            num(_pct(s.get("identical_to_ar")), ".0f", "%")])
    lines += ["## Overall", "", *table_lines(
        ["method", "baseline", "questions", "MAT", "tokens/s", "speedup vs baseline",
         "speedup vs ar", "identical to baseline", "identical to ar"], overall)]
    lines += render_peer_headline(rep)
    methods = list(rep["methods"])
    cats = [*rep["categories"], OVERALL]
    peer = rep["methods"].get(PEER_BASELINE)
    if peer is not None:
        rows = []
        for cat in cats:
            base = peer["stats"].get(cat, {}).get("tokens_per_s")
            tps = [rep["methods"][m]["stats"].get(cat, {}).get("tokens_per_s") for m in methods]
            rows.append([cat, *(num(t / base if t and base else None, ".2f", "x") for t in tps)])
        lines += ["", f"## Per category: tokens/s vs {PEER_BASELINE} (same run)", "",
                  *table_lines(["category", *methods], rows)]
    rows = []
    for cat in cats:
        stats = [rep["methods"][m]["stats"].get(cat) for m in methods]
        rows.append([cat, *("-" if st is None else
                            f"{num(st.get('speedup'), '.2f', 'x')} ({num(st.get('mat'))})"
                            for st in stats)])
    lines += ["", "## Per category: speedup vs own baseline (MAT)", "",
              *table_lines(["category", *methods], rows)]
    return "\n".join(lines) + "\n"


def _overall_tps(rep: dict[str, Any], m: str) -> float:
    return float(rep["methods"][m]["stats"].get(OVERALL, {}).get("tokens_per_s") or 0.0)


def _peer(run_meta: dict[str, Any], methods: list[str]) -> dict[str, Any] | None:
    """The native llama.cpp build that answered the ``llamacpp-*`` methods: as the run
    recorded it (``run.json``'s ``methods_info``), else (runs written before it was
    recorded) the ``peer.json`` of the binaries built now, marked as read at report time."""
    peers = [m for m in methods if m.startswith("llamacpp-")]
    if not peers:
        return None
    recorded = run_meta.get("methods_info", {})
    for m in peers:
        if recorded.get(m):
            return {**recorded[m], "recorded_by": "recorded by the run"}
    return {**peer_info(), "recorded_by": "read at report time: the run did not record it"}


def render_peer_headline(rep: dict[str, Any]) -> list[str]:
    """Our fastest method against native llama.cpp's greedy decoding and its fastest
    n-gram speculation type (``llamacpp-<type>``), per category, with how many answers
    each side's speculation left identical to its own greedy answers. [] without the
    peer's greedy run."""
    ms = rep["methods"]
    if PEER_BASELINE not in ms:
        return []
    ours = [m for m in ms if not m.startswith(("llamacpp-", "hf-")) and m != "ar"]
    ngram = [m for m in ms if m.startswith("llamacpp-") and m != PEER_BASELINE]
    if not ours:
        return []
    best = max(ours, key=lambda m: _overall_tps(rep, m))
    theirs = max(ngram, key=lambda m: _overall_tps(rep, m)) if ngram else None
    heads = ["category", f"ours: {best}", PEER_BASELINE] + ([theirs] if theirs else [])
    heads += ["ours / greedy"] + (["ours / best n-gram"] if theirs else [])
    heads += [f"{best} = our ar"] + ([f"{theirs} = its greedy"] if theirs else [])

    def stat(m: str, cat: str) -> dict[str, Any]:
        return dict(ms[m]["stats"].get(cat) or {})

    def same(m: str, cat: str, key: str) -> str:
        st = stat(m, cat)
        frac, n = st.get(key), st.get("questions")
        return "-" if frac is None or not n else f"{round(frac * n)}/{n}"

    rows = []
    for cat in [*rep["categories"], OVERALL]:
        t = {m: stat(m, cat).get("tokens_per_s") for m in (best, PEER_BASELINE, theirs) if m}
        cells = [cat] + [num(t[m], ".1f") for m in t]
        g = t[PEER_BASELINE]
        cells.append(num(t[best] / g if t[best] and g else None, ".2f", "x"))
        if theirs:
            n = t[theirs]
            cells.append(num(t[best] / n if t[best] and n else None, ".2f", "x"))
        cells.append(same(best, cat, "identical_to_ar"))
        if theirs:
            cells.append(same(theirs, cat, "identical"))
        rows.append(cells)
    return ["", "## Against native llama.cpp (same run)", "",
            "Our fastest method and llama-server's greedy decoding and its fastest n-gram "
            "type over the whole run, tokens/s; identical answers counted against each "
            "side's own greedy (AR) answers.", "", *table_lines(heads, rows)]


def _pct(x: float | None) -> float | None:
    return None if x is None else 100.0 * x


def write_plots(rep: dict[str, Any], out_dir: Path) -> list[Path]:
    """speedup.png (per category and method) and accept_hist.png; [] without matplotlib."""
    plt = pyplot()
    if plt is None:
        return []
    written = []
    methods = [m for m in rep["methods"] if m != rep["methods"][m]["baseline"]]
    cats = [*rep["categories"], OVERALL]
    if methods:
        fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(cats)), 4))
        width = 0.8 / len(methods)
        for i, m in enumerate(methods):
            vals = [
                (rep["methods"][m]["stats"].get(c) or {}).get("speedup") or 0.0 for c in cats
            ]
            ax.bar([j + i * width for j in range(len(cats))], vals, width, label=m)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cats))], cats, rotation=30,
                      ha="right")
        ax.set_ylabel("speedup vs own greedy")
        # Beside the axes, not over them: with 6+ methods a legend inside hides bars.
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        p = out_dir / "speedup.png"
        fig.savefig(p, dpi=100, bbox_inches="tight")
        plt.close(fig)
        written.append(p)
    hists = {m: info["accept_length_histogram"] for m, info in rep["methods"].items()
             if info["accept_length_histogram"] and m in methods}
    if hists:
        fig, axes = plt.subplots(1, len(hists), figsize=(4 * len(hists), 3), squeeze=False)
        for ax, (m, h) in zip(axes[0], hists.items(), strict=True):
            total = sum(h.values())
            ax.bar([int(k) for k in h], [v / total for v in h.values()])
            ax.set_title(m)
            ax.set_xlabel("accept length (tokens/step)")
        axes[0][0].set_ylabel("fraction of steps")
        fig.tight_layout()
        p = out_dir / "accept_hist.png"
        fig.savefig(p, dpi=100)
        plt.close(fig)
        written.append(p)
    return written


def write_report(out_dir: Path) -> dict[str, Any]:
    rep = build_report(out_dir)
    (out_dir / "report.json").write_text(json.dumps(rep, indent=2), encoding="utf-8")
    (out_dir / "report.md").write_text(render_markdown(rep), encoding="utf-8")
    rep["plots"] = [str(p) for p in write_plots(rep, out_dir)]
    return rep
