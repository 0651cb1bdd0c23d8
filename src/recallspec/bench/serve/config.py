"""The settings of ``recallspec bench serve`` and the names of the servers it compares
(``bench/serve/targets.py`` builds and starts them, ``bench/serve/command.py`` runs them).

Light on purpose (no torch): the CLI builds its parser from these names and defaults.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from recallspec.bench.common.llamacpp import SPEC_TYPES
from recallspec.bench.serve.agents import AGENT_WORKLOADS
from recallspec.bench.serve.workloads import Workload
from recallspec.errors import DataError

OURS_TARGETS = ("ours-off", "ours-fixed", "ours-adaptive", "ours-memory")
NOCACHE = "-nocache"  # an ours target's name + this: the same with --no-prefix-cache
LLAMACPP_TARGETS = ("llamacpp", *(f"llamacpp-{t}" for t in SPEC_TYPES))
TARGETS = (*OURS_TARGETS, *(t + NOCACHE for t in OURS_TARGETS), *LLAMACPP_TARGETS,
           "vllm", "vllm-ngram")
# What runs without --targets: for Spec-Bench, each server plain and with its
# prompt-lookup-like speculation; for the workloads that repeat a prefix (multiturn,
# agent, rag), ours with the prefix cache on and off, and llama-server with its own.
DEFAULT_TARGETS = ("ours-off", "ours-fixed", "ours-adaptive", "llamacpp", "llamacpp-ngram-simple",
                   "vllm", "vllm-ngram")
PREFIX_TARGETS = ("ours-adaptive", "ours-adaptive-nocache", "ours-off", "ours-off-nocache",
                  "llamacpp")


# The tool-call and structured-output workloads: ours constrained plain, with the default
# policy, and with it plus response memory; llama-server --jinja with the same template.
AGENT_TARGETS = ("ours-off", "ours-adaptive", "ours-memory", "llamacpp")
MEMORY_TOKENS = 1 << 16  # ours-memory: --memory-tokens (per tenant)


def default_targets(workload: str) -> tuple[str, ...]:
    if workload in AGENT_WORKLOADS:
        return AGENT_TARGETS
    return DEFAULT_TARGETS if workload == "spec_bench" else PREFIX_TARGETS


DEFAULT_RATES = (0.5, 1.0, 2.0, 4.0)


@dataclass(frozen=True)
class ServeBenchConfig:
    workload: Workload = field(default_factory=Workload)
    targets: tuple[str, ...] = ()  # () = the workload's (default_targets)
    rates: tuple[float, ...] = DEFAULT_RATES  # sessions started per second
    max_tokens: int = 128
    seed: int = 0  # arrival times and the sessions' order
    url: str | None = None  # an already running server instead of starting targets
    model: str | None = None  # ours and llama.cpp (its GGUF file); vLLM: vllm_model
    dtype: str = "auto"  # ours: --dtype of `recallspec serve`
    threads: int | None = None  # per server; default all CPUs
    max_batch_size: int = 8  # ours: KV slots; vLLM: --max-num-seqs
    # Every server's context length (ours: --max-len; llama-server: per slot). None: the
    # workload's (workloads.default_context), set by run_serve_bench before any
    # server starts.
    context: int | None = None
    fixed_drafter: str = "pld"
    adaptive_drafter: str | None = None  # default: the server's (policy.SERVE_DRAFTER)
    request_timeout: float = 600.0
    start_timeout: float = 900.0  # vLLM's CPU start is slow on a small machine
    vllm_python: str = ".venv-vllm/bin/python"
    vllm_model: str = "build/smollm2-hf"
    data_dir: str | None = None

    def __post_init__(self) -> None:
        if not self.targets:  # the default depends on the workload: set once, here
            object.__setattr__(self, "targets", default_targets(self.workload.name))
        if not self.rates:
            raise DataError("give at least one rate")
        for t in self.targets:
            if t not in TARGETS:
                raise DataError(f"unknown serve target {t!r}; available: {', '.join(TARGETS)}")
        if any(not 0 < r < float("inf") for r in self.rates):
            raise DataError("--rates must be positive numbers (sessions per second)")
        if self.max_tokens < 1 or self.max_batch_size < 1 or (
                self.context is not None and self.context < 2):
            raise DataError("--max-tokens and --max-batch-size must be >= 1, --context >= 2")
        if self.threads is not None and self.threads < 1:
            raise DataError("--threads must be >= 1")
        if self.request_timeout <= 0 or self.start_timeout <= 0:
            raise DataError("timeouts must be > 0")

    @property
    def n_threads(self) -> int:
        return self.threads or os.cpu_count() or 1

    @property
    def context_len(self) -> int:
        """``context``, once given or resolved (a server is never started before)."""
        if self.context is None:
            raise DataError("the context length is set from the workload before servers start")
        return self.context
