"""Start-up time and resident memory of ``recallspec serve`` with default settings (but
``--max-batch-size 8``) against ``llama-server -np 8`` on one GGUF, under a burst of
concurrent clients, some of which disconnect mid-answer (issue 38).

    .venv/bin/python benchmarks/experiments/exp_serve_memory.py --model PATH.gguf [--clients 64]
        [--max-tokens 64] [--disconnect 0.25] [--ctx-per-slot 4096]
        [--targets ours,llamacpp] [--out bench_out/serve_memory/NAME]

Each server is started as a child process, one at a time: ``start_s`` is process start
-> ``/v1/models`` answers (cold: the first start on this machine also repacks the
weights and measures our cost curve; run twice to see a warm start). Then all clients
send a Spec-Bench question at once (streamed, greedy); a seeded ``--disconnect`` share
of them closes the stream after its first few chunks. The server's resident memory
(VmRSS of its process group, sampled every 0.1 s) is reported at ready, at its peak and
after the burst, beside the GGUF file's size; ours also reports its ``/metrics`` KV and
prefix-cache figures after the burst. llama-server gets ``-c`` = ``--ctx-per-slot`` x 8
(the same positions per slot as our default ``max_len``), its KV cache in float16,
reserved at start. Writes OUT.json and OUT.md.

Feeds docs/BENCHMARKS.md, "Memory and start-up" (commands [M3], [M4]).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from _common import utc_now, write_outputs

from recallspec.bench.common.llamacpp import ServerConfig, binary
from recallspec.bench.common.suites import SuiteSelection, load_suite
from recallspec.bench.serve.targets import free_port
from recallspec.markdown import table_lines

SLOTS = 8


def group_rss(pgid: int) -> int:
    """Resident bytes of every process in the group (the server and its workers)."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.getpgid(int(pid)) != pgid:
                continue
            with open(f"/proc/{pid}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except (OSError, ProcessLookupError, ValueError):
            continue
    return total


class Sampler(threading.Thread):
    def __init__(self, pgid: int) -> None:
        super().__init__(daemon=True)
        self.pgid, self.peak, self.stop = pgid, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, group_rss(self.pgid))
            time.sleep(0.1)


async def client(base: str, model: str, q: str, max_tokens: int, drop_after: int | None,
                 extra: dict[str, Any]) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": q}], "stream": True,
            "max_tokens": max_tokens, "temperature": 0, **extra}
    async with httpx.AsyncClient(timeout=3600) as c, c.stream(
            "POST", f"{base}/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            return f"status {r.status_code}: {(await r.aread())[:160]!r}"
        chunks = 0
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                chunks += 1
                if drop_after is not None and chunks >= drop_after:
                    return "disconnected"
        return "done"


async def burst(base: str, model: str, qs: list[str], max_tokens: int,
                disconnect: float, extra: dict[str, Any]) -> dict[str, int]:
    rng = random.Random(0)
    drops = [rng.randint(1, 8) if rng.random() < disconnect else None for _ in qs]
    got = await asyncio.gather(*(client(base, model, q, max_tokens, d, extra)
                                 for q, d in zip(qs, drops, strict=True)),
                               return_exceptions=True)
    out: dict[str, int] = {}
    for g in got:
        k = g if isinstance(g, str) else f"error {type(g).__name__}"
        out[k] = out.get(k, 0) + 1
    return out


def metrics(base: str) -> dict[str, float]:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    want = ("kv_cache_resident_tokens", "kv_cache_budget_tokens", "prefix_cache_resident",
            "prefix_cache_budget_tokens", "prefix_cache_hits_total", "prefix_cache_queries_total")
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"recallspec:(\w+)\{[^}]*\} ([0-9.e+]+)", line)
        if m and any(m.group(1).startswith(w) for w in want):
            out[m.group(1)] = float(m.group(2))
    return out


def run_target(name: str, args: argparse.Namespace, qs: list[str], log: Path) -> dict[str, Any]:
    port = free_port()
    threads = str(os.cpu_count() or 1)
    if name == "ours":
        argv = [sys.executable, "-m", "recallspec", "serve", "--model", args.model,
                "--host", "127.0.0.1", "--port", str(port), "--max-batch-size", str(SLOTS)]
    else:
        argv = ServerConfig(args.model, int(threads), ctx_per_slot=args.ctx_per_slot,
                            parallel=SLOTS).argv(binary("llama-server"), port)
    base = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    with open(log, "wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        model = ""
        while not model:
            if proc.poll() is not None:
                raise SystemExit(f"{name} exited ({proc.returncode}); see {log}")
            try:
                model = httpx.get(f"{base}/v1/models", timeout=2).json()["data"][0]["id"]
            except (httpx.HTTPError, KeyError, IndexError, ValueError):
                time.sleep(0.25)
        start_s = time.perf_counter() - t0
        ready = group_rss(proc.pid)
        sampler = Sampler(proc.pid)
        sampler.start()
        t1 = time.perf_counter()
        # llama-server's prompt cache asked for (its default); ours refuses unknown fields
        extra = {} if name == "ours" else {"cache_prompt": True}
        outcomes = asyncio.run(burst(base, model, qs, args.max_tokens, args.disconnect, extra))
        burst_s = time.perf_counter() - t1
        time.sleep(1.0)
        sampler.stop.set()
        sampler.join()
        rec: dict[str, Any] = {
            "target": name, "argv": argv, "start_s": round(start_s, 2),
            "burst_s": round(burst_s, 2), "outcomes": outcomes,
            "rss_ready_mb": round(ready / 1e6), "rss_peak_mb": round(sampler.peak / 1e6),
            "rss_after_mb": round(group_rss(proc.pid) / 1e6)}
        if name == "ours":
            rec["metrics"] = metrics(base)
        return rec
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a GGUF file")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--disconnect", type=float, default=0.25)
    ap.add_argument("--ctx-per-slot", type=int, default=4096)
    ap.add_argument("--targets", default="ours,llamacpp")
    ap.add_argument("--out", default="bench_out/serve_memory/run")
    ap.add_argument("--shortest", action="store_true",
                    help="the clients' questions: the shortest of Spec-Bench (a burst of many "
                         "clients on a slow model in minutes), not the first 10 per category")
    args = ap.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)  # the servers' logs go beside OUT
    if args.shortest:
        qs = sorted((q.turns[0] for q in load_suite("spec_bench", SuiteSelection())), key=len)
        qs = qs[: args.clients]
    else:
        qs = [q.turns[0] for q in load_suite("spec_bench", SuiteSelection(per_category=10))]
    qs = (qs * (args.clients // len(qs) + 1))[: args.clients]
    file_mb = round(Path(args.model).stat().st_size / 1e6)
    recs = []
    for name in args.targets.split(","):
        print(f"{name} ...", file=sys.stderr, flush=True)
        recs.append(run_target(name, args, qs, out.parent / f"{out.name}-{name}.log"))
        print(json.dumps(recs[-1]), file=sys.stderr, flush=True)
    rep = {"model": args.model, "file_mb": file_mb, "clients": args.clients,
           "max_tokens": args.max_tokens, "disconnect": args.disconnect,
           "ctx_per_slot": args.ctx_per_slot, "slots": SLOTS,
           "date": utc_now(), "targets": recs}
    lines = [f"# Serve memory: {Path(args.model).name} ({file_mb} MB file), {args.clients} "
             f"clients at once{' (shortest questions)' if args.shortest else ''}, "
             f"{args.max_tokens} tokens, {args.disconnect:.0%} disconnect "
             f"({rep['date']})", ""]
    lines += table_lines(
        ["target", "start s", "burst s", "RSS ready MB", "RSS peak MB", "peak / file",
         "RSS after MB", "outcomes"],
        [[r["target"], r["start_s"], r["burst_s"], r["rss_ready_mb"], r["rss_peak_mb"],
          f"{r['rss_peak_mb'] / file_mb:.2f}", r["rss_after_mb"], r["outcomes"]] for r in recs])
    for r in recs:
        if "metrics" in r:
            lines += ["", f"ours /metrics after the burst: {r['metrics']}"]
    write_outputs(out, rep, lines)


if __name__ == "__main__":
    main()
