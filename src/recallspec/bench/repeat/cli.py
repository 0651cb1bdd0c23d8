"""`recallspec bench repeat`: repeating workloads through our server, with and without
response memory.

    recallspec bench repeat [--workloads self_consistency,code_edit,reask,spec_bench] --out DIR

See ``bench/repeat/command.py`` for what is measured. The parser reads the light settings
module (``bench/repeat/workloads.py``); the handler imports the benchmark itself when it
runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from recallspec.bench.common.args import config_from_args, csv_list
from recallspec.bench.common.report import print_report
from recallspec.bench.repeat.workloads import WORKLOADS, RepeatConfig
from recallspec.params import DEFAULT_WEIGHT_FORMAT, WEIGHT_FORMATS


def register(bsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def run_repeat(args: argparse.Namespace) -> int:
    # The benchmark itself (the engine, httpx) only when it runs: see the module docstring.
    from recallspec.bench.repeat.command import run_repeat_bench
    from recallspec.bench.repeat.report import render_markdown

    cfg = config_from_args(RepeatConfig, args, workloads=csv_list(args.workloads) or (),
                           drafters=csv_list(args.drafters) or ())
    out = Path(args.out)
    rep = run_repeat_bench(cfg, out)
    print_report(render_markdown(rep), rep["machine"],
                 f"report.json, report.md and report.png in {out}")
    return 0
