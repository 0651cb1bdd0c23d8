"""`recallspec bench runtime`: AR tokens/s against transformers and native llama.cpp,
the verification cost curve and the memory-bandwidth fraction.

    recallspec bench runtime [--model M] [--json] [--out DIR]

See ``bench/runtime/command.py``; the handler imports it when it runs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from recallspec.bench.common.args import csv_list


def register(bsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rt = bsub.add_parser("runtime", help="AR tokens/s vs transformers, verification cost curve, "
                                         "memory-bandwidth fraction")
    rt.add_argument("--model", default=None)
    rt.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    rt.add_argument("--out", default=None, help="also write runtime.json/.md/.png here")
    rt.add_argument("--repeats", type=int, default=5)
    rt.add_argument("--new-tokens", type=int, default=128)
    rt.add_argument("--dtypes", default="quantized,float32",
                    help="our weight formats to time: quantized, float32, bfloat16")
    rt.add_argument("--no-llamacpp", action="store_true",
                    help="skip native llama.cpp (otherwise run when `make peers` built it)")
    rt.add_argument("--no-hf", action="store_true", help="skip the transformers comparison")
    rt.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    rt.set_defaults(handler=run_runtime)


def run_runtime(args: argparse.Namespace) -> int:
    from recallspec.bench.runtime.command import (
        RuntimeConfig,
        render_runtime_markdown,
        run_runtime_bench,
    )

    cfg = RuntimeConfig(
        model=args.model, repeats=args.repeats, new_tokens=args.new_tokens,
        dtypes=csv_list(args.dtypes) or (), hf=not args.no_hf, threads=args.threads,
        llamacpp=not args.no_llamacpp,
    )
    res = run_runtime_bench(cfg, out=Path(args.out) if args.out else None)
    print(json.dumps(res, indent=2) if args.json else render_runtime_markdown(res))
    return 0
