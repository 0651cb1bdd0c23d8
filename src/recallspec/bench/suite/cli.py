"""`recallspec bench --suite NAME` and `recallspec bench report`: run a benchmark suite,
re-render a run's report.

    recallspec bench --suite NAME [--methods ar,pld,...] ...   run a suite (no sub-command)
    recallspec bench report --out DIR                          re-render a run's report

The suite's options are the ``bench`` parser's own (``add_suite_arguments``, called by
``cli/bench.py``); ``register`` adds ``report``. The handlers import the suite (torch, the
engine) when they run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from recallspec.bench.common.args import csv_list
from recallspec.bench.common.report import print_report
from recallspec.bench.common.suites import SuiteSelection
from recallspec.errors import DataError
from recallspec.params import DEFAULT_WEIGHT_FORMAT, MAX_DRAFT_NODES, WEIGHT_FORMATS
from recallspec.policy import POLICY

# AR, the two simplest drafters (each sized cost-aware, as any named drafter) and the
# default policy (recallspec/policy.py).
DEFAULT_METHODS = f"ar,pld,llma,{POLICY}"


def add_suite_arguments(p: argparse.ArgumentParser) -> None:
    """The suite's options and handler, on the ``bench`` parser itself."""
    p.add_argument("--suite", help="spec_bench, mt_bench, humaneval, mbpp, gsm8k, cnndm, "
                                    "rag_extractive (or rag-extractive) or demo")
    p.add_argument("--methods", default=DEFAULT_METHODS,
                   help="comma-separated: ar, drafter specs (pld, llma, sam:index=x.rsidx, ...: "
                        "cost-aware sizing unless :mode=fixed), hf-greedy, hf-pld, "
                        "llamacpp-greedy, llamacpp-ngram-simple / -ngram-mod / -ngram-map-k / "
                        "-ngram-map-k4v / -ngram-cache (native llama.cpp: make peers) "
                        f"(default {DEFAULT_METHODS})")
    p.add_argument("--model", default=None, help="GGUF file, HF directory or alias")
    p.add_argument("--limit", type=int, default=None, help="first N questions (after subsetting)")
    p.add_argument("--per-category", type=int, default=None,
                   help="fixed stratified subset: N evenly spaced questions per category")
    p.add_argument("--categories", default=None, help="comma-separated categories to keep")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=1, help="time each question R times (median)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--dtype", default=DEFAULT_WEIGHT_FORMAT, choices=WEIGHT_FORMATS,
                   help="weights: auto = a GGUF's own blocks (quantized kernel), float32 = "
                        "the dequantized reference")
    p.add_argument("--max-draft-nodes", type=int, default=MAX_DRAFT_NODES)
    p.add_argument("--out", default="bench_out", help="output directory (default bench_out)")
    p.add_argument("--resume", action="store_true", help="skip questions already answered")
    p.add_argument("--overwrite", action="store_true", help="discard existing answers in --out")
    p.add_argument("--data-dir", default=None, help="benchmark data (default: ../shared/data)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.set_defaults(handler=run_suite, bench_parser=p)


def register(bsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rp = bsub.add_parser("report", help="re-render report.json/.md/plots of a run directory")
    rp.add_argument("--out", required=True)
    rp.set_defaults(handler=run_report)


def run_suite(args: argparse.Namespace) -> int:
    from recallspec.bench.suite.report import render_markdown, write_report
    from recallspec.bench.suite.runner import BenchConfig, run_bench

    if not args.suite:
        args.bench_parser.error("--suite is required (or give a sub-command)")
    if args.resume and args.overwrite:
        raise DataError("--resume and --overwrite exclude each other")
    if args.threads is not None:
        import torch

        if args.threads < 1:
            raise DataError("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    cfg = BenchConfig(
        suite=args.suite, methods=csv_list(args.methods) or (), model=args.model,
        selection=SuiteSelection(args.per_category, args.limit, csv_list(args.categories)),
        max_new_tokens=args.max_new_tokens, repeats=args.repeats,
        temperature=args.temperature, max_draft_nodes=args.max_draft_nodes, dtype=args.dtype,
        data_dir=args.data_dir,
    )
    out = Path(args.out)
    run_bench(cfg, out, resume=args.resume, overwrite=args.overwrite,
              progress=not args.no_progress)
    rep = write_report(out)
    print_report(render_markdown(rep), rep["machine"],
                 f"answers, report.json, report.md and plots in {out}")
    return 0


def run_report(args: argparse.Namespace) -> int:
    from recallspec.bench.suite.report import render_markdown, write_report

    out = Path(args.out)
    if not (out / "answers").is_dir():
        raise DataError(f"{out} has no answers/ directory")
    print(render_markdown(write_report(out)))
    return 0
