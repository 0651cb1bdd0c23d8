"""``recallspec bench repeat``: workloads that repeat themselves, served with and without
the response memory (``recallspec serve --memory-tokens``). The workloads and the
settings: ``bench/repeat/workloads.py``.

For every drafter, two fresh servers run side by side (an empty memory, a cold Token
Recycling table each): one without the memory (``--memory-tokens 0``), one with it.
The conversations, workloads in the order given, go to both, one request at a time,
the arms taking turns going first from one conversation to the next: the two arms see
the same requests in the same order, differ only by the memory, and share whatever
the machine's load does to the timings. Per request: output tokens, client-side wall time, the
server's speculation figures, the output token ids (greedy workloads: identical in both
arms, the memory being lossless). ``report.py`` turns the records into tokens/s,
speedups and the identity check.

Writes ``report.json`` (rewritten after every server, so an interrupted run keeps what
it measured), ``report.md`` and ``report.png`` under the output directory and the
servers' logs in ``logs/``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from recallspec.bench.common.machine import machine_info
from recallspec.bench.repeat.report import comparisons, render_markdown, summaries, write_plot
from recallspec.bench.repeat.workloads import Conversation, RepeatConfig, load_workloads
from recallspec.bench.serve.client import WARMUP_MESSAGE
from recallspec.bench.serve.config import ServeBenchConfig
from recallspec.bench.serve.targets import Target, launched
from recallspec.engine import EngineConfig
from recallspec.errors import DataError

# Twice the server's gauge refresh (``server/engine_loop.STATE_INTERVAL``): the memory
# figures read at the end include the last answers.
GAUGE_WAIT_S = 1.0


@dataclass
class Record:
    """One request's outcome (a row of ``report.json``'s records)."""

    server: str  # "<drafter>/<memory|no-memory>"
    drafter: str
    memory: bool
    workload: str
    conversation: str
    turn: int  # 0 = the first user turn
    sample: int
    ok: bool = False
    error: str | None = None
    seconds: float | None = None  # client wall time of the request
    output_tokens: int = 0
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    mean_acceptance_length: float | None = None
    steps: int | None = None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    temperature: float | None = None  # 0 = greedy


# ---- the client ------------------------------------------------------------------------
def chat(client: Any, model: str, messages: list[dict[str, str]], *, max_tokens: int,
         temperature: float, seed: int | None, tenant: str, rec: Record) -> None:
    """One non-streamed chat request, filling ``rec``; the server's and the network's
    failures become ``rec.error``."""
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens,
                            "temperature": temperature, "user": tenant,
                            "recallspec": {"return_token_ids": True}}
    if seed is not None:
        body["seed"] = seed
    t0 = time.perf_counter()
    try:
        r = client.post("/v1/chat/completions", json=body)
        rec.seconds = time.perf_counter() - t0
        if r.status_code != 200:
            rec.error = f"HTTP {r.status_code}: {r.text[:300]}"
            return
        obj = r.json()
        ch = obj["choices"][0]
        rec.text = ch["message"]["content"]
        rec.token_ids = list(ch.get("token_ids") or [])
        rec.finish_reason = ch.get("finish_reason")
        rec.output_tokens = int(obj["usage"]["completion_tokens"])
        rec.prompt_tokens = int(obj["usage"]["prompt_tokens"])
        spec = (obj.get("metrics") or {}).get("speculative_decoding") or {}
        rec.mean_acceptance_length = spec.get("mean_acceptance_length")
        rec.steps = spec.get("num_steps")
        rec.ok = True
    except Exception as e:  # a failed request is a result, not a crash
        rec.seconds = rec.seconds or time.perf_counter() - t0
        rec.error = f"{type(e).__name__}: {e}"


def run_conversation(client: Any, srv: _Launch, c: Conversation,
                     cfg: RepeatConfig) -> list[Record]:
    """One conversation against one server, one request at a time: every turn with the
    conversation so far (the server's own earlier answers), or alone without history."""
    temperature = cfg.temperature_for(c.workload)
    greedy = temperature == 0.0
    recs: list[Record] = []
    messages: list[dict[str, str]] = []
    for turn, text in enumerate(c.turns):
        if not c.history:
            messages = []
        messages.append({"role": "user", "content": text})
        last: Record | None = None
        for k in range(c.samples):
            last = Record(srv.name, srv.drafter, srv.memory, c.workload, c.id, turn, k,
                          temperature=temperature)
            chat(client, srv.model, messages, max_tokens=cfg.tokens_for(c.workload),
                 temperature=temperature,
                 seed=None if greedy else 1000 * cfg.seed + k, tenant=c.tenant, rec=last)
            recs.append(last)
        if last is None or not last.ok:
            break  # a later turn needs this answer
        messages.append({"role": "assistant", "content": last.text})
    return recs


def memory_gauges(base: str) -> dict[str, float]:
    """The server's ``recallspec:memory_*`` samples (summed over labels)."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
        if line.startswith("recallspec:memory_"):
            key, value = line.rsplit(" ", 1)
            name = key.split("{", 1)[0]
            out[name] = out.get(name, 0.0) + float(value)
    return out


# ---- the run -----------------------------------------------------------------------------
def run_repeat_bench(cfg: RepeatConfig, out: Path, *,
                     log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Both arms of every drafter over every conversation (interleaved, see the module
    docstring); writes and returns the report."""
    if log is None:
        def log(msg: str) -> None:
            print(msg, file=sys.stderr, flush=True)
    convs = load_workloads(cfg)
    out.mkdir(parents=True, exist_ok=True)
    rep: dict[str, Any] = {
        "config": {**dataclasses.asdict(cfg), "threads": cfg.threads or os.cpu_count(),
                   "memory_prompt_tail": EngineConfig().memory_prompt_tail,
                   "max_tokens_per_workload": {w: cfg.tokens_for(w) for w in cfg.workloads}},
        "machine": machine_info(),
        "conversations": [dataclasses.asdict(c) for c in convs],
        "servers": {}, "records": [],
    }
    records: list[Record] = []
    for drafter in cfg.drafters:
        names = [f"{drafter}/{'memory' if m else 'no-memory'}" for m in (False, True)]
        infos = [{"drafter": drafter, "memory_tokens": cfg.memory_tokens if m else 0}
                 for m in (False, True)]
        rep["servers"].update(zip(names, infos, strict=True))
        try:
            with contextlib.ExitStack() as stack:
                arms = []
                for name, info, memory in zip(names, infos, (False, True), strict=True):
                    srv = stack.enter_context(_server(cfg, name, drafter, memory, out))
                    info.update(argv=srv.argv, start_s=srv.start_s)
                    log(f"{name}: {srv.base} ready after {srv.start_s or 0:.0f} s")
                    client = stack.enter_context(httpx.Client(
                        base_url=srv.base, timeout=httpx.Timeout(cfg.request_timeout)))
                    warm = Record(name, drafter, memory, "warm-up", "-", 0, 0)
                    chat(client, srv.model, [{"role": "user", "content": WARMUP_MESSAGE}],
                         max_tokens=8, temperature=0.0, seed=None, tenant="warm-up", rec=warm)
                    if not warm.ok:
                        raise DataError(f"{name}: the warm-up request failed: {warm.error}")
                    arms.append((client, srv))
                t0 = time.perf_counter()
                for i, conv in enumerate(convs):  # the arms take turns going first
                    for client, srv in arms if i % 2 == 0 else arms[::-1]:
                        records += run_conversation(client, srv, conv, cfg)
                    if (i + 1) % 4 == 0 or i + 1 == len(convs):
                        log(f"  {drafter}: {i + 1}/{len(convs)} conversations")
                        _write(rep, records, out)
                infos[1]["run_s"] = infos[0]["run_s"] = round(time.perf_counter() - t0, 2)
                time.sleep(GAUGE_WAIT_S)
                for (_, srv), info in zip(arms, infos, strict=True):
                    info["memory_gauges"] = memory_gauges(srv.base)
        except DataError as e:  # a server that fails to start or serve: noted, next drafter
            for info in infos:
                info.setdefault("failed", str(e))
            log(f"{drafter}: failed: {e}")
        _write(rep, records, out)
    return _write(rep, records, out, final=True)


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)


@dataclass
class _Launch:
    name: str  # "<drafter>/<memory|no-memory>"
    drafter: str
    memory: bool
    base: str
    model: str
    argv: list[str]
    start_s: float | None


def _serve_config(cfg: RepeatConfig) -> ServeBenchConfig:
    """The settings ``serve/targets.launched`` reads, as ``bench serve``'s config: one
    KV slot (requests go one at a time), our context, model, dtype and threads."""
    return ServeBenchConfig(targets=("ours-adaptive",), rates=(1.0,), model=cfg.model,
                            dtype=cfg.dtype, threads=cfg.threads, max_batch_size=1,
                            context=cfg.context, start_timeout=cfg.start_timeout,
                            request_timeout=cfg.request_timeout, data_dir=cfg.data_dir)


@contextlib.contextmanager
def _server(cfg: RepeatConfig, name: str, drafter: str, memory: bool, out: Path
            ) -> Iterator[_Launch]:
    extra = ("--memory-tokens", str(cfg.memory_tokens if memory else 0))
    t = Target(f"ours-{_slug(name)}", "ours", f"recallspec serve, {drafter}", drafter,
               cfg.mode, extra_args=extra)
    with launched(t, _serve_config(cfg), out / "logs" / f"{_slug(name)}.log") as srv:
        yield _Launch(name, drafter, memory, srv.base, srv.model, srv.argv, srv.start_s)


def _write(rep: dict[str, Any], records: list[Record], out: Path,
           final: bool = False) -> dict[str, Any]:
    rep["records"] = [dataclasses.asdict(r) for r in records]
    rep["summaries"] = summaries(rep["records"])
    rep["comparisons"] = comparisons(rep["records"])
    (out / "report.json").write_text(json.dumps(rep, indent=1), encoding="utf-8")
    if final:
        (out / "report.md").write_text(render_markdown(rep), encoding="utf-8")
        rep["plot"] = str(out / "report.png") if write_plot(rep, out / "report.png") else None
        (out / "report.json").write_text(json.dumps(rep, indent=1), encoding="utf-8")
    return rep
