"""Benchmarks: one sub-package per ``recallspec bench`` sub-command, helpers in ``common/``.

    common/   what several benchmarks share: answer files, the question suites, prompts,
              method names, the machine, native llama.cpp, transformers peers, model
              shapes and their random-weight GGUFs, report cells
    suite/    ``recallspec bench --suite``: every method answers every question
              (runner, methods, report; EMS-SD's padded batch layouts)
    peers/    the peer methods (``llamacpp-*``, ``hf-*``) in child processes
    runtime/  ``bench runtime``: decode, verification cost and bandwidth vs peers
    scale/    ``bench scale``: ours vs llama.cpp at published shapes (a child per model)
    replay/   ``bench replay``: exact acceptance replay and its time prediction
    serve/    ``bench serve``: OpenAI servers under Poisson load
    repeat/   ``bench repeat``: repeating workloads with and without response memory

Each sub-command's package holds its command line in ``cli.py``: ``register(subparsers)``
adds its parser and sets ``handler`` (``suite/cli.py`` also gives the ``bench`` parser its
own options and adds ``report``). ``SUBCOMMANDS`` names those modules, in the order
``recallspec bench --help`` lists the sub-commands; ``cli/bench.py`` imports each by name,
so a new benchmark is a sub-package here and a line in ``SUBCOMMANDS``. A ``cli.py`` reads
only light modules (``common/args.py``, the settings in ``scale/config.py``,
``serve/config.py``, ``repeat/workloads.py``) to build its parser; its handler imports
the benchmark (torch, the engine) when it runs.
"""

from __future__ import annotations

SUBCOMMANDS: tuple[str, ...] = (
    "recallspec.bench.suite.cli",    # report (and the suite's options on `bench` itself)
    "recallspec.bench.replay.cli",
    "recallspec.bench.runtime.cli",
    "recallspec.bench.serve.cli",
    "recallspec.bench.repeat.cli",
    "recallspec.bench.scale.cli",
)
