#!/usr/bin/env python
"""SAM-Decoding experiments (issue 4): the paper's tables on our models and this machine.

Stages (each resumable: bench runs use --resume, finished stages are skipped):

  index     corpus indexes: the raw shared corpora (Alpaca-style, GSM8K train, ShareGPT)
            and, with --selfgen FILE (from `recallspec corpus generate`), the
            self-generated corpus
  table     Table 1/2 layout: per-category speedup and MAT of ar, pld, recycling, sam,
            sam+recycling, sam+draft-model (fixed sizes, mode=fixed; and sam+recycling
            cost-aware) on spec_bench (--per-category), humaneval and
            mbpp (--limit), per model; one interleaved bench run per suite and model
  ablation  Table 3: sam+recycling without the static SAM, without the dynamic SAM,
            without Token Recycling (= sam), on spec_bench (--per-category), all
            cost-aware (mode=adaptive)
  grid      Figure 2: delta x tau in 1..8 (delta by exact replay of the sam drafter; tau
            needs model logits, so real runs of sam+recycling on --grid-per-category),
            fixed sizes (mode=fixed)
  sizes     Figure 3: fixed draft sizes (--sizes, default 4, 8, 10, 16, 20..70;
            mode=fixed) of sam+recycling, plus the cost-aware setting
            (mode=adaptive), on --grid-per-category, engine max_draft_nodes 80

Every bench report checks token identity with ar per question. Results: DIR/<stage>/...
(bench outputs, each with report.md and speedup.png) and DIR/exp_sam.json + exp_sam.md +
exp_sam_sizes.png + exp_sam_tau.png.

  .venv/bin/python benchmarks/experiments/exp_sam.py --out bench_out/sam \\
      --models smollm2-135m gemma3-270m --stages index table ablation grid sizes \\
      --per-category 20 --limit 40

Feeds the notebook docs/history/benchmarks_2026-11.md, "SAM-Decoding (issue 4):
`sam+recycling` and cost-aware sizing" (runs: docs/results/sam/).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from recallspec.bench.common.suites import SuiteSelection
from recallspec.bench.replay.exact import (
    ReplayConfig,
    load_ar_answers,
    replay_answers,
    replay_report,
)
from recallspec.bench.suite.report import write_report
from recallspec.bench.suite.runner import BenchConfig, run_bench
from recallspec.cli import main as cli
from recallspec.data.paths import data_dir
from recallspec.markdown import table_lines
from recallspec.models import load_tokenizer

STAGES = ("index", "table", "ablation", "grid", "sizes")


def _bench(out: Path, suite: str, methods: list[str], model: str, sel: SuiteSelection,
           tokens: int, nodes: int = 16) -> dict[str, Any]:
    cfg = BenchConfig(suite=suite, methods=tuple(methods), model=model, selection=sel,
                      max_new_tokens=tokens, max_draft_nodes=nodes)
    run_bench(cfg, out, resume=True)
    return write_report(out)


def _overall(rep: dict[str, Any]) -> dict[str, dict[str, float]]:
    return {m: {k: v["stats"]["overall"][k] for k in ("mat", "speedup", "identical_to_ar")}
            for m, v in rep["methods"].items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m"])
    ap.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    ap.add_argument("--per-category", type=int, default=20)
    ap.add_argument("--limit", type=int, default=40, help="humaneval / mbpp questions")
    ap.add_argument("--grid-per-category", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--selfgen", type=Path, default=None, help="self-generated corpus .jsonl")
    ap.add_argument("--sizes", nargs="+", type=int, default=[4, 8, 10, 16, 20, 30, 40, 50, 60, 70],
                    help="fixed draft sizes of the sizes stage (the paper's 10..70 and the "
                    "small sizes a CPU prefers)")
    ap.add_argument("--suites", nargs="+", default=["spec_bench", "humaneval", "mbpp"],
                    choices=["spec_bench", "humaneval", "mbpp"], help="table stage suites")
    ap.add_argument("--methods", nargs="+", default=None,
                    help="table stage methods instead of the default list; {index} and "
                    "{selfgen} stand for the raw and self-generated index paths")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    res_path = a.out / "exp_sam.json"
    res: dict[str, Any] = json.loads(res_path.read_text()) if res_path.is_file() else {}

    def save() -> None:
        res_path.write_text(json.dumps(res, indent=1))
        (a.out / "exp_sam.md").write_text(render(res))

    root = data_dir()
    raw = [*(root / "alpaca").glob("*.json*"), root / "gsm8k" / "train.jsonl",
           *(root / "sharegpt").glob("*.json*")]
    for model in a.models:
        idx = a.out / f"raw-{model}.rsidx"
        if "index" in a.stages and not idx.exists():
            cli(["index", "build", "--model", model, "--corpus", *map(str, raw), "--out", str(idx)])
        sg = a.out / f"selfgen-{model}.rsidx" if a.selfgen is not None else None
        if sg is not None and not sg.exists():
            cli(["index", "build", "--model", model, "--corpus", str(a.selfgen),
                 "--out", str(sg)])
        ix = f"index={idx}"
        sb = SuiteSelection(per_category=a.per_category)
        if "table" in a.stages:
            # The paper's tables size drafts fixed (stated: a drafter named without a
            # sizing is cost-aware), beside our cost-aware sam+recycling.
            fx = "mode=fixed"
            methods = a.methods or [
                "ar", f"pld:{fx}", f"recycling:{fx}", f"sam:{ix}:{fx}",
                f"sam+recycling:{ix}:{fx}", f"sam+recycling:{ix}:mode=adaptive",
                f"sam+draft-model:{ix}:{fx}",
                *([f"sam+recycling:index={sg}:{fx}"] if sg is not None else []),
            ]
            methods = [m.replace("{index}", str(idx)).replace("{selfgen}", str(sg))
                       for m in methods]
            sels = {"spec_bench": sb, "humaneval": SuiteSelection(limit=a.limit),
                    "mbpp": SuiteSelection(limit=a.limit)}
            for suite, sel in ((s, sels[s]) for s in a.suites):
                rep = _bench(a.out / "table" / model / suite, suite, methods, model, sel,
                             a.max_new_tokens)
                res.setdefault("table", {}).setdefault(model, {})[suite] = _overall(rep)
                save()
        if "ablation" in a.stages:
            # All variants size their drafts cost-aware (our sam+recycling setting), so
            # each row removes one draft source, not a sizing choice.
            ca = "mode=adaptive"
            methods = ["ar", f"sam+recycling:{ix}:{ca}", f"sam+recycling:{ca}",
                       f"sam+recycling:{ix}:dynamic=false:{ca}", f"sam:{ix}:{ca}"]
            rep = _bench(a.out / "ablation" / model, "spec_bench", methods, model, sb,
                         a.max_new_tokens)
            res.setdefault("ablation", {})[model] = _overall(rep)
            save()
        gsel = SuiteSelection(per_category=a.grid_per_category)
        if "grid" in a.stages:
            tau = ["ar", *(f"sam+recycling:{ix}:tau={t}:mode=fixed" for t in range(1, 9))]
            rep = _bench(a.out / "grid" / model, "spec_bench", tau, model, gsel, a.max_new_tokens)
            res.setdefault("grid_tau", {})[model] = _overall(rep)
            recs, _ = load_ar_answers(a.out / "grid" / model / "answers" / "ar.jsonl")
            rcfg = ReplayConfig(max_new_tokens=a.max_new_tokens)
            fp = load_tokenizer(model).fingerprint
            deltas = {
                f"sam:delta={d}": replay_answers(
                    recs, "sam", rcfg,
                    {"index": str(idx), "delta": d, "tokenizer_fingerprint": fp})
                for d in range(1, 9)
            }
            res.setdefault("grid_delta_replay", {})[model] = {
                m: v["overall"]["mat"] for m, v in replay_report(recs, deltas).items()}
            save()
        if "sizes" in a.stages:
            # Each size fixed (stated), against the cost-aware setting's line.
            sizes = ["ar", *(f"sam+recycling:{ix}:max_tokens={n}:template=tr80:mode=fixed"
                             for n in a.sizes),
                     f"sam+recycling:{ix}:max_tokens=70:template=tr80:mode=adaptive"]
            rep = _bench(a.out / "sizes" / model, "spec_bench", sizes, model, gsel,
                         a.max_new_tokens, nodes=80)
            res.setdefault("sizes", {})[model] = _overall(rep)
            save()
    save()
    plot(res, a.out)


def render(res: dict[str, Any]) -> str:
    lines = ["# SAM-Decoding experiments", ""]
    for stage in ("table", "ablation", "grid_tau", "sizes"):
        for model, block in res.get(stage, {}).items():
            suites = block if stage == "table" else {"spec_bench": block}
            for suite, methods in suites.items():
                lines += [f"## {stage}: {model}, {suite}", ""]
                lines += table_lines(
                    ["method", "MAT", "speedup vs ar", "identical to ar"],
                    [[m, f"{s['mat']:.2f}", f"{s['speedup']:.2f}x", f"{s['identical_to_ar']:.0%}"]
                     for m, s in methods.items()])
                lines.append("")
    for model, mats in res.get("grid_delta_replay", {}).items():
        lines += [f"## delta (exact replay of sam): {model}", ""]
        lines += table_lines(["method", "MAT"], [[m, f"{v:.3f}"] for m, v in mats.items()])
        lines.append("")
    return "\n".join(lines)


def plot(res: dict[str, Any], out: Path) -> None:
    """exp_sam_sizes.png (speedup and MAT against the fixed draft size, the cost-aware
    setting as a line) and exp_sam_tau.png (speedup and MAT against tau)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return

    def figure(stage: str, key: str, label: str, fname: str) -> None:
        blocks = res.get(stage, {})
        if not blocks:
            return
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        for model, methods in blocks.items():
            pts = sorted((int(m.split(f"{key}=")[1].split(":")[0]), v)
                         for m, v in methods.items() if f"{key}=" in m and "adaptive" not in m)
            adaptive = [v for m, v in methods.items() if "mode=adaptive" in m]
            for ax, stat in zip(axes, ("speedup", "mat"), strict=True):
                line = ax.plot([x for x, _ in pts], [v[stat] for _, v in pts], marker="o",
                               label=f"{model}, fixed")[0]
                for v in adaptive:
                    ax.axhline(v[stat], ls="--", color=line.get_color(),
                               label=f"{model}, cost-aware")
                ax.set_xlabel(label)
                ax.set_ylabel("speedup vs ar" if stat == "speedup" else "mean accepted tokens")
                ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=120)
        plt.close(fig)

    figure("sizes", "max_tokens", "draft size cap (max_tokens)", "exp_sam_sizes.png")
    figure("grid_tau", "tau", "tau", "exp_sam_tau.png")


if __name__ == "__main__":
    main()
