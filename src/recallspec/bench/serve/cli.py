"""`recallspec bench serve`: our server (and peers) under load.

    recallspec bench serve [--workload spec_bench|multiturn|agent|rag] --targets ours-off,llamacpp \
        --rates 0.5,1,2 --out DIR [--url URL]

See ``bench/serve/command.py`` for what is measured. The parser reads the light settings
modules (targets' names, workloads); the handler imports the benchmark itself when it
runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from recallspec.bench.common.args import config_from_args, csv_list
from recallspec.bench.common.report import print_report
from recallspec.bench.common.suites import SuiteSelection
from recallspec.bench.serve.config import (
    DEFAULT_TARGETS,
    PREFIX_TARGETS,
    TARGETS,
    ServeBenchConfig,
)
from recallspec.bench.serve.workloads import MAX_TURNS, WORKLOADS, Workload
from recallspec.errors import DataError
from recallspec.params import DEFAULT_WEIGHT_FORMAT, WEIGHT_FORMATS


def register(bsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    w = Workload()
    sv = bsub.add_parser("serve", help="OpenAI servers under Poisson load: ours (speculation "
                         "off, fixed, cost-aware; prefix cache on or off), llama.cpp's and "
                         "vLLM's, one at a time, on single requests, chats, an agent's loop "
                         "or questions over shared documents")
    sv.add_argument("--workload", default=w.name, choices=WORKLOADS,
                    help="spec_bench: Spec-Bench first turns, one request per session; "
                    "multiturn: MT-Bench and ShareGPT chats; agent: a coding agent's loop "
                    "with tool results; rag: questions over shared documents; extract: JSON-schema "
                    "extraction; bfcl / bfcl_multiturn: BFCL tool calls, single and multi-turn")
    sv.add_argument("--targets", default=None, help=f"comma-separated: {', '.join(TARGETS)} "
                    f"(unavailable peers are skipped with a note; default: "
                    f"{','.join(DEFAULT_TARGETS)} for spec_bench, {','.join(PREFIX_TARGETS)} "
                    "for the others)")
    sv.add_argument("--rates", default="0.5,1,2,4",
                    help="offered loads: sessions started per second (spec_bench: requests/s)")
    sv.add_argument("--sessions", type=int, default=w.sessions,
                    help="every workload but spec_bench: sessions per rate")
    most = ", ".join(f"{k} {v}" for k, v in MAX_TURNS.items() if v > 1)
    sv.add_argument("--turns", type=int, default=w.turns,
                    help="multiturn / agent / rag: requests per session (MT-Bench has 2; "
                    f"at most: {most})")
    sv.add_argument("--documents", type=int, default=w.documents,
                    help="rag: documents the sessions share")
    sv.add_argument("--per-category", type=int, default=2,
                    help="spec_bench: questions per category (6 categories)")
    sv.add_argument("--limit", type=int, default=None, help="spec_bench: first N of those")
    sv.add_argument("--categories", default=None,
                    help="spec_bench: comma-separated categories to keep")
    sv.add_argument("--max-tokens", type=int, default=128)
    sv.add_argument("--seed", type=int, default=0, help="arrival times and session order")
    sv.add_argument("--url", default=None, help="an already running server on 127.0.0.1 "
                    "(targets then only choose request fields: ours-* pick drafter and mode)")
    sv.add_argument("--model", default=None, help="ours and llama.cpp (GGUF); default SmolLM2")
    sv.add_argument("--dtype", default=DEFAULT_WEIGHT_FORMAT, choices=WEIGHT_FORMATS)
    sv.add_argument("--threads", type=int, default=None, help="per server (default: all CPUs)")
    sv.add_argument("--max-batch-size", type=int, default=8,
                    help="ours: KV slots; vLLM: --max-num-seqs")
    sv.add_argument("--context", type=int, default=None,
                    help="every server's context length per sequence (ours: --max-len; "
                    "llama-server: -c is this x --max-batch-size); default: 2048 for "
                    "spec_bench, else what the longest session needs (at least 2048)")
    sv.add_argument("--fixed-drafter", default="pld", help="drafter of ours-fixed")
    sv.add_argument("--adaptive-drafter", default=None,
                    help="drafter of ours-adaptive (default: the engine's, else sam+recycling)")
    sv.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request")
    sv.add_argument("--start-timeout", type=float, default=900.0, help="seconds per server start")
    sv.add_argument("--vllm-python", default=".venv-vllm/bin/python")
    sv.add_argument("--vllm-model", default="build/smollm2-hf",
                    help="transformers directory vLLM serves (make build/smollm2-hf/config.json)")
    sv.add_argument("--data-dir", default=None, help="benchmark data (default: ../shared/data)")
    sv.add_argument("--out", default="bench_out/serve", help="output directory")
    sv.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    # The benchmark itself (the engine, httpx) only when it runs: see the module docstring.
    from recallspec.bench.serve.command import run_serve_bench
    from recallspec.bench.serve.report import render_markdown

    try:
        rates = tuple(float(r) for r in csv_list(args.rates) or ())
    except ValueError:
        raise DataError(f"--rates: not numbers: {args.rates!r}") from None
    workload = Workload(args.workload, args.sessions, args.turns, args.documents,
                        SuiteSelection(args.per_category, args.limit, csv_list(args.categories)))
    cfg = config_from_args(ServeBenchConfig, args, targets=csv_list(args.targets) or (),
                           rates=rates, workload=workload)
    out = Path(args.out)
    rep = run_serve_bench(cfg, out)
    print_report(render_markdown(rep), rep["machine"],
                 f"serve.json, serve.md and serve.png in {out}")
    return 0
