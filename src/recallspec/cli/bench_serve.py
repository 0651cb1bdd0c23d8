"""`recallspec bench serve` and `recallspec bench repeat`: our server (and peers) under load.

    recallspec bench serve [--workload spec_bench|multiturn|agent|rag] --targets ours-off,llamacpp \
        --rates 0.5,1,2 --out DIR [--url URL]
    recallspec bench repeat [--workloads self_consistency,code_edit,reask,spec_bench] --out DIR

See ``bench/serve.py`` and ``bench/repeat.py`` for what is measured.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from recallspec.cli.bench import config_from_args, csv_list, print_report
from recallspec.errors import DataError
from recallspec.params import DEFAULT_WEIGHT_FORMAT, WEIGHT_FORMATS


def register_bench(bsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _register_serve(bsub)
    _register_repeat(bsub)


def _register_serve(bsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from recallspec.bench.serve_targets import DEFAULT_TARGETS, PREFIX_TARGETS, TARGETS
    from recallspec.bench.serve_workloads import MAX_TURNS, WORKLOADS, Workload

    w = Workload()
    sv = bsub.add_parser("serve", help="OpenAI servers under Poisson load: ours (speculation "
                         "off, fixed, cost-aware; prefix cache on or off), llama.cpp's and "
                         "vLLM's, one at a time, on single requests, chats, an agent's loop "
                         "or questions over shared documents")
    sv.add_argument("--workload", default=w.name, choices=WORKLOADS,
                    help="spec_bench: Spec-Bench first turns, one request per session; "
                    "multiturn: MT-Bench and ShareGPT chats; agent: a coding agent's loop "
                    "with tool results; rag: questions over shared documents")
    sv.add_argument("--targets", default=None, help=f"comma-separated: {', '.join(TARGETS)} "
                    f"(unavailable peers are skipped with a note; default: "
                    f"{','.join(DEFAULT_TARGETS)} for spec_bench, {','.join(PREFIX_TARGETS)} "
                    "for the others)")
    sv.add_argument("--rates", default="0.5,1,2,4",
                    help="offered loads: sessions started per second (spec_bench: requests/s)")
    sv.add_argument("--sessions", type=int, default=w.sessions,
                    help="multiturn / agent / rag: sessions per rate")
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


def _register_repeat(bsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from recallspec.bench.repeat_workloads import WORKLOADS, RepeatConfig

    d = RepeatConfig()

    rp = bsub.add_parser("repeat", help="repeating workloads (self-consistency, multi-turn "
                         "code editing, re-asked prompts; Spec-Bench as control) through the "
                         "server, with and without response memory")
    rp.add_argument("--workloads", default=",".join(d.workloads),
                    help=f"comma-separated: {', '.join(WORKLOADS)}")
    rp.add_argument("--drafters", default=",".join(d.drafters),
                    help="comma-separated drafters, each run without and with memory")
    rp.add_argument("--mode", default=d.mode,
                    help="the servers' --mode (default adaptive: cost-aware draft sizing)")
    rp.add_argument("--memory-tokens", type=int, default=d.memory_tokens,
                    help="--memory-tokens of the memory arm (per tenant)")
    rp.add_argument("--questions", type=int, default=d.questions,
                    help="self_consistency: GSM8K questions")
    rp.add_argument("--samples", type=int, default=d.samples,
                    help="self_consistency: samples each")
    rp.add_argument("--temperature", type=float, default=d.temperature, help="self_consistency")
    rp.add_argument("--tenancy", choices=["question", "shared"], default=d.tenancy,
                    help="self_consistency: a tenant per question, or one for all")
    rp.add_argument("--tasks", type=int, default=d.tasks,
                    help="code_edit: HumanEval + MBPP tasks")
    rp.add_argument("--follow-ups", type=int, default=d.follow_ups,
                    help="code_edit: turns after the first")
    rp.add_argument("--code-edit-history", action=argparse.BooleanOptionalAction,
                    default=d.code_edit_history,
                    help="code_edit: follow-ups with the conversation so far (default, as a "
                    "chat client sends them) or, --no-code-edit-history, each a fresh "
                    "conversation restating the task (the previous answer only in memory)")
    rp.add_argument("--reask-prompts", type=int, default=d.reask_prompts,
                    help="reask: Spec-Bench first turns, each re-sent in a fresh conversation")
    rp.add_argument("--reask-times", type=int, default=d.reask_times,
                    help="reask: sends of each prompt (the first and the re-sends)")
    rp.add_argument("--reask-temperature", type=float, default=d.reask_temperature,
                    help="reask: sampling temperature (default 0: greedy)")
    rp.add_argument("--prompts", type=int, default=d.prompts, help="spec_bench: first turns")
    rp.add_argument("--max-tokens", type=int, default=d.max_tokens,
                    help="per request (default: 128 self_consistency and spec_bench, 192 "
                    "code_edit)")
    rp.add_argument("--seed", type=int, default=d.seed, help="self_consistency: sampling seeds")
    rp.add_argument("--model", default=d.model, help="GGUF file, HF directory or alias")
    rp.add_argument("--dtype", default=DEFAULT_WEIGHT_FORMAT, choices=WEIGHT_FORMATS)
    rp.add_argument("--threads", type=int, default=d.threads,
                    help="per server (default: all CPUs)")
    rp.add_argument("--context", type=int, default=d.context, help="the servers' --max-len")
    rp.add_argument("--request-timeout", type=float, default=d.request_timeout,
                    help="seconds per request")
    rp.add_argument("--start-timeout", type=float, default=d.start_timeout,
                    help="seconds per server start")
    rp.add_argument("--data-dir", default=d.data_dir,
                    help="benchmark data (default: ../shared/data)")
    rp.add_argument("--out", default="bench_out/repeat", help="output directory")
    rp.set_defaults(handler=run_repeat)


def run_serve(args: argparse.Namespace) -> int:
    from recallspec.bench.serve import ServeBenchConfig, run_serve_bench
    from recallspec.bench.serve_report import render_markdown
    from recallspec.bench.serve_workloads import Workload
    from recallspec.bench.suites import SuiteSelection

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


def run_repeat(args: argparse.Namespace) -> int:
    from recallspec.bench.repeat import run_repeat_bench
    from recallspec.bench.repeat_report import render_markdown
    from recallspec.bench.repeat_workloads import RepeatConfig

    cfg = config_from_args(RepeatConfig, args, workloads=csv_list(args.workloads) or (),
                           drafters=csv_list(args.drafters) or ())
    out = Path(args.out)
    rep = run_repeat_bench(cfg, out)
    print_report(render_markdown(rep), rep["machine"],
                 f"report.json, report.md and report.png in {out}")
    return 0
