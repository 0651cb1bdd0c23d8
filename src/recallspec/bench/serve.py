"""``recallspec bench serve``: OpenAI-compatible servers under Poisson load.

Spec-Bench first turns, as chat messages, are sent at each offered rate to each target
in turn (ours with speculation off, fixed and cost-aware; llama.cpp's and vLLM's
servers; ``serve_targets.py``), streamed with ``temperature`` 0. Every target gets the
same prompts in the same order at the same arrival times (one seed), on the same
machine, one server at a time: each is started as a child process on a free loopback
port (a fresh one for each rate), warmed up with one short request, driven at the
rate, and stopped before the next starts (``--url`` drives an already running server
instead). Per request: TTFT, inter-token latencies, end-to-end latency, output tokens
(``serve_client.py``); per target and rate: throughput and p50 / p99 latencies
(``serve_report.py``).

Writes ``serve.json`` (config, machine, targets, every request record, summaries;
rewritten after each rate, so an interrupted run keeps what it measured),
``serve.md`` and ``serve.png`` under the output directory, and server logs in ``logs/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recallspec.bench.llamacpp import available, peer_info
from recallspec.bench.serve_client import Prompt, RequestRecord, poisson_arrivals, run_rate, warm_up
from recallspec.bench.serve_report import render_markdown, summaries, write_plot
from recallspec.bench.serve_targets import (
    DEFAULT_TARGETS,
    TARGETS,
    Running,
    Target,
    check_loopback,
    launched,
    make_target,
    served_model,
    unavailable,
)
from recallspec.bench.suites import SuiteSelection, load_suite
from recallspec.errors import DataError

DEFAULT_RATES = (0.5, 1.0, 2.0, 4.0)


@dataclass(frozen=True)
class ServeBenchConfig:
    targets: tuple[str, ...] = DEFAULT_TARGETS
    rates: tuple[float, ...] = DEFAULT_RATES
    selection: SuiteSelection = field(default_factory=lambda: SuiteSelection(per_category=2))
    max_tokens: int = 128
    seed: int = 0  # arrival times and the prompts' order
    url: str | None = None  # an already running server instead of starting targets
    model: str | None = None  # ours and llama.cpp (its GGUF file); vLLM: vllm_model
    dtype: str = "auto"  # ours: --dtype of `recallspec serve`
    threads: int | None = None  # per server; default all CPUs
    max_batch_size: int = 8  # ours: KV slots; vLLM: --max-num-seqs
    context: int = 2048  # every server's context length (Spec-Bench prompts fit)
    fixed_drafter: str = "pld"
    adaptive_drafter: str | None = None  # default: serve_targets.default_adaptive_drafter
    request_timeout: float = 600.0
    start_timeout: float = 900.0  # vLLM's CPU start is minutes on a small machine
    vllm_python: str = ".venv-vllm/bin/python"
    vllm_model: str = "build/smollm2-hf"
    data_dir: str | None = None

    def __post_init__(self) -> None:
        if not self.targets or not self.rates:
            raise DataError("give at least one target and one rate")
        for t in self.targets:
            if t not in TARGETS:
                raise DataError(f"unknown serve target {t!r}; available: {', '.join(TARGETS)}")
        if any(not 0 < r < float("inf") for r in self.rates):
            raise DataError("--rates must be positive numbers (requests per second)")
        if self.max_tokens < 1 or self.max_batch_size < 1 or self.context < 2:
            raise DataError("--max-tokens and --max-batch-size must be >= 1, --context >= 2")
        if self.threads is not None and self.threads < 1:
            raise DataError("--threads must be >= 1")
        if self.request_timeout <= 0 or self.start_timeout <= 0:
            raise DataError("timeouts must be > 0")

    @property
    def n_threads(self) -> int:
        return self.threads or os.cpu_count() or 1


def load_prompts(cfg: ServeBenchConfig) -> list[Prompt]:
    """The selected Spec-Bench first turns in a seeded shuffle, so categories mix over
    the arrival sequence (the suite lists them category by category)."""
    qs = load_suite("spec_bench", cfg.selection, cfg.data_dir)
    prompts = [Prompt(str(q.question_id), q.category, q.turns[0]) for q in qs]
    random.Random(cfg.seed).shuffle(prompts)
    return prompts


def run_serve_bench(cfg: ServeBenchConfig, out: Path, *,
                    log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every target at every rate; write and return the report (``serve.json``)."""
    from recallspec.bench.report import _machine

    if log is None:
        def log(msg: str) -> None:
            print(msg, file=sys.stderr, flush=True)
    base = check_loopback(cfg.url) if cfg.url else None
    targets = [make_target(name, cfg) for name in cfg.targets]
    extras = {t.name: t.request_fields(launched=base is None) for t in targets}  # fail early
    prompts = load_prompts(cfg)
    out.mkdir(parents=True, exist_ok=True)
    rep: dict[str, Any] = {
        "config": {**{k: v for k, v in dataclasses.asdict(cfg).items() if k != "selection"},
                   "selection": dataclasses.asdict(cfg.selection), "threads": cfg.n_threads,
                   "requests": len(prompts)},
        "machine": _machine(),
        "prompts": [dataclasses.asdict(p) for p in prompts],  # in arrival order
        "arrivals": {str(r): poisson_arrivals(len(prompts), r, cfg.seed) for r in cfg.rates},
        "targets": {}, "records": [], "summaries": [],
    }
    records: list[RequestRecord] = []
    for t in targets:
        info: dict[str, Any] = {"description": t.description, "skipped": None, "start_s": {}}
        rep["targets"][t.name] = info
        if t.kind == "llamacpp" and available():  # the build that answers: commit, flags
            info["peer"] = {**peer_info(), "recorded_by": "recorded by the run"}
        why = None if base else unavailable(t, cfg)
        if why:
            info["skipped"] = why
            log(f"{t.name}: skipped: {why}")
            continue
        try:
            for rate in cfg.rates:
                recs = _run_one(t, rate, cfg, base, out, prompts, rep["arrivals"][str(rate)],
                                extras[t.name], info, log)
                records += recs
                s = summaries(recs)[0]
                log(f"{t.name} @ {rate:g} req/s: {s['completed']}/{s['requests']} ok, "
                    f"{_fmt(s['output_tok_per_s'])} tok/s, e2e p50 {_fmt(s['e2e_s']['p50'])} s")
                _write(rep, records, out)
        except DataError as e:  # a target that fails to start or serve: noted, next one
            info["failed"] = str(e)
            log(f"{t.name}: failed: {e}")
    return _write(rep, records, out, final=True)


def _run_one(t: Target, rate: float, cfg: ServeBenchConfig, base: str | None, out: Path,
             prompts: list[Prompt], arrivals: list[float], extra: dict[str, Any],
             info: dict[str, Any], log: Callable[[str], None]) -> list[RequestRecord]:
    """One target at one rate on a server of its own. A fresh server per rate: every
    rate sends the same prompts, and state a server keeps across requests (vLLM's
    prefix cache, our Token Recycling table) would otherwise have seen them already.
    A server given by ``--url`` keeps its state across rates."""
    with _server(t, cfg, base, out / "logs" / f"{t.name}-{rate:g}.log") as srv:
        info.update(model=srv.model, base=srv.base, argv=srv.argv, env=srv.env)
        info["start_s"][str(rate)] = srv.start_s
        if srv.start_s is not None:
            log(f"{t.name}: {srv.base} ({srv.model}) ready after {srv.start_s:.0f} s")
        err = asyncio.run(warm_up(srv.base, srv.model, extra, cfg.request_timeout))
        if err:
            raise DataError(f"{t.name}: the warm-up request failed: {err}")
        return asyncio.run(run_rate(srv.base, srv.model, t.name, prompts, arrivals, rate,
                                    cfg.max_tokens, extra, cfg.request_timeout))


@contextlib.contextmanager
def _server(t: Target, cfg: ServeBenchConfig, base: str | None, log: Path
            ) -> Iterator[Running]:
    if base is not None:
        yield Running(base, served_model(base))
        return
    with launched(t, cfg, log) as srv:
        yield srv


def _write(rep: dict[str, Any], records: list[RequestRecord], out: Path,
           final: bool = False) -> dict[str, Any]:
    rep["records"] = [dataclasses.asdict(r) for r in records]
    rep["summaries"] = summaries(records)
    (out / "serve.json").write_text(json.dumps(rep, indent=1), encoding="utf-8")
    if final:
        (out / "serve.md").write_text(render_markdown(rep), encoding="utf-8")
        rep["plot"] = str(out / "serve.png") if write_plot(rep, out / "serve.png") else None
    return rep


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"
