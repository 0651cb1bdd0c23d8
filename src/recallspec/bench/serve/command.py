"""``recallspec bench serve``: OpenAI-compatible servers under Poisson load.

A workload (``workloads.py``: Spec-Bench first turns, multi-turn chats, an agent's
loop, questions over shared documents) is a list of sessions; at each offered rate
(sessions per second) the sessions start at Poisson arrival times and send their
streamed chat requests (``temperature`` 0) one after another, each when the previous
answer has ended (``client.py``). Each target in turn (ours with speculation off,
fixed and cost-aware, with the prefix cache on or off; llama.cpp's and vLLM's servers;
``targets.py``) gets the same sessions in the same order at the same arrival times
(one seed), on the same machine, one server at a time: each is started as a child
process on a free loopback port (a fresh one for each rate), warmed up with one short
request, driven at the rate, and stopped before the next starts (``--url`` drives an
already running server instead). Every server gets the context the longest session
needs (``workloads.default_context``) unless ``--context`` says. Per request:
session, turn, TTFT, inter-token latencies, end-to-end latency, output and cached prompt
tokens; per target and rate: throughput and p50 / p99 latencies, TTFT also over turns
>= 2 (``report.py``).

Writes ``serve.json`` (config, workload, machine, sessions, arrival times, targets,
every request record, summaries, the prefix-cache comparison; rewritten after each
rate, so an interrupted run keeps what it measured), ``serve.md`` and ``serve.png``
under the output directory, and server logs in ``logs/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from recallspec.bench.common.llamacpp import available, peer_info
from recallspec.bench.common.machine import machine_info
from recallspec.bench.common.report import num
from recallspec.bench.serve.client import (
    RequestRecord,
    poisson_arrivals,
    run_sessions,
    warm_up,
)
from recallspec.bench.serve.config import ServeBenchConfig
from recallspec.bench.serve.report import prefix_rows, render_markdown, summaries, write_plot
from recallspec.bench.serve.targets import (
    Running,
    Target,
    check_loopback,
    launched,
    make_target,
    served_model,
    unavailable,
)
from recallspec.bench.serve.workloads import Session, default_context, load_sessions
from recallspec.errors import DataError


def run_serve_bench(cfg: ServeBenchConfig, out: Path, *,
                    log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every target at every rate; write and return the report (``serve.json``)."""
    if log is None:
        def log(msg: str) -> None:
            print(msg, file=sys.stderr, flush=True)
    base = check_loopback(cfg.url) if cfg.url else None
    targets = [make_target(name, cfg) for name in cfg.targets]
    extras = {t.name: t.request_fields(launched=base is None) for t in targets}  # fail early
    sessions = load_sessions(cfg.workload, cfg.seed, cfg.data_dir)
    if cfg.context is None:
        cfg = dataclasses.replace(
            cfg, context=default_context(cfg.workload, sessions, cfg.max_tokens))
    out.mkdir(parents=True, exist_ok=True)
    rep: dict[str, Any] = {
        "config": {**dataclasses.asdict(cfg), "threads": cfg.n_threads,
                   "sessions": len(sessions),
                   "requests": sum(len(s.turns) for s in sessions)},
        "workload": {"name": cfg.workload.name, "description": cfg.workload.description,
                     "history": any(s.history and len(s.turns) > 1 for s in sessions)},
        "machine": machine_info(),
        "sessions": [s.record() for s in sessions],  # in arrival order
        "arrivals": {str(r): poisson_arrivals(len(sessions), r, cfg.seed) for r in cfg.rates},
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
                recs = _run_one(t, rate, cfg, base, out, sessions, rep["arrivals"][str(rate)],
                                extras[t.name], info, log)
                records += recs
                s = summaries(recs)[0]
                log(f"{t.name} @ {rate:g} sessions/s: {s['completed']}/{s['requests']} ok, "
                    f"{num(s['output_tok_per_s'])} tok/s, TTFT p50 "
                    f"{num(s['ttft_s']['p50'])} s (turns >= 2: "
                    f"{num(s['ttft_later_s']['p50'])} s), e2e p50 {num(s['e2e_s']['p50'])} s")
                _write(rep, records, out)
        except DataError as e:  # a target that fails to start or serve: noted, next one
            info["failed"] = str(e)
            log(f"{t.name}: failed: {e}")
    return _write(rep, records, out, final=True)


def _run_one(t: Target, rate: float, cfg: ServeBenchConfig, base: str | None, out: Path,
             sessions: list[Session], arrivals: list[float], extra: dict[str, Any],
             info: dict[str, Any], log: Callable[[str], None]) -> list[RequestRecord]:
    """One target at one rate on a server of its own. A fresh server per rate: every
    rate sends the same sessions, and state a server keeps across requests (prefix
    caches, our Token Recycling table) would otherwise have seen them already. A server
    given by ``--url`` keeps its state across rates."""
    with _server(t, cfg, base, out / "logs" / f"{t.name}-{rate:g}.log") as srv:
        info.update(model=srv.model, base=srv.base, argv=srv.argv, env=srv.env)
        info["start_s"][str(rate)] = srv.start_s
        if srv.start_s is not None:
            log(f"{t.name}: {srv.base} ({srv.model}) ready after {srv.start_s:.0f} s")
        err = asyncio.run(warm_up(srv.base, srv.model, extra, cfg.request_timeout))
        if err:
            raise DataError(f"{t.name}: the warm-up request failed: {err}")
        return asyncio.run(run_sessions(srv.base, srv.model, t.name, cfg.workload.name,
                                        sessions, arrivals, rate, cfg.max_tokens, extra,
                                        cfg.request_timeout))


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
    rep["prefix_cache"] = prefix_rows(rep["summaries"])
    (out / "serve.json").write_text(json.dumps(rep, indent=1), encoding="utf-8")
    if final:
        (out / "serve.md").write_text(render_markdown(rep), encoding="utf-8")
        rep["plot"] = str(out / "serve.png") if write_plot(rep, out / "serve.png") else None
    return rep
