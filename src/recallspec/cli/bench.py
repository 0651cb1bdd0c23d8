"""`recallspec bench`: the benchmark suite and its sub-commands.

    recallspec bench --suite NAME [--methods ar,pld,...] ...   run a suite (no sub-command)
    recallspec bench report --out DIR                          re-render a run's report
    recallspec bench replay --answers DIR/answers/ar.jsonl --methods pld:mode=fixed,llma:mode=fixed
    recallspec bench replay --answers ... --methods ar,llma:mode=fixed,portfolio,oracle \
        --predict-time [--curve FILE] [--model-topk] [--out FILE]
    recallspec bench runtime [--model M] [--json] [--out DIR]
    recallspec bench serve --targets ours-off,llamacpp --rates 0.5,1,2 --out DIR [--url URL]
    recallspec bench repeat [--workloads self_consistency,code_edit,reask,spec_bench] --out DIR
    recallspec bench scale [--shapes S,S] [--quants Q4_K_M] [--answers DIR] [--out DIR]

Only the ``bench`` parser is made here: its own options (the suite's) come from
``bench/suite/cli.py``, and each sub-command from the module named in
``recallspec.bench.SUBCOMMANDS`` (a ``bench/<name>/cli.py`` with ``register(subparsers)``
that sets ``handler`` on its parser, exactly like a top-level command module). A new
benchmark touches only ``bench/``.

Every ``recallspec`` invocation builds all the parsers: only light modules (settings,
names) are imported for them; each handler imports its benchmark (torch, the engine)
when it runs.
"""

from __future__ import annotations

import argparse
import importlib

from recallspec.bench import SUBCOMMANDS
from recallspec.bench.suite.cli import add_suite_arguments


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench", help="benchmark suites, acceptance replay and runtime benchmarks",
        description="Without a sub-command: run a benchmark suite (needs --suite).",
    )
    add_suite_arguments(p)
    bsub = p.add_subparsers(dest="bench_command", metavar="SUBCOMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(name).register(bsub)
