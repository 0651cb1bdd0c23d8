"""Time to first token of a GGUF from a fresh process: ours on the first run (nothing
cached: the GGUF's conversion and repack) and on a later run (the repack cache read),
against native llama-server (process start to its first completed token), in one run.
``recallspec bench scale`` runs it per model (its TTFT columns);
``benchmarks/experiments/exp_cold_start.py`` runs it alone.

Each measurement is a new process (Python, torch and the model imported and loaded as
a user's command would); ours with the ``none`` drafter (plain decoding), so that no
cost curve is measured (the curve, when a policy needs one, comes after this and is
cached per model: ``cost/calibration.py``). First runs use a fresh
``RECALLSPEC_CACHE_DIR`` each, the later run the same one again; the GGUF itself stays
in the page cache for both engines (read first). The first-run process also writes the
repack cache in the background: its end is reported apart (``exit_s``), since the model
answers before it.

Every process starts after ``pause`` seconds of idle (default 5): VMs that return freed
memory to their host (virtio-balloon free page reporting, as on our Firecracker
measuring VMs, seconds after a free) fault it back in slowly, so a process started
right after another freed its memory would find that memory still backed and start
faster than on a machine that had been idle, whichever engine it is. Both
engines' first runs allocate fresh memory (ours: the repacked weights; llama-server:
its own repacked Q4_0/Q4_K buffers, the KV cache).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recallspec.bench.common import llamacpp as lc
from recallspec.bench.common.report import num
from recallspec.errors import DataError
from recallspec.markdown import table
from recallspec.models import load_tokenizer

PROMPT = "Explain in one paragraph why the sky is blue."

# Runs in the child: load, one greedy token (EOS or not), report seconds since the
# parent's t0 (wall clock, shared by both processes) and whether this load repacked the
# GGUF (a first run: it then writes the repack cache) or read the cache.
_CHILD = """
import json, os, sys, time
t0 = float(os.environ["COLD_T0"])
from recallspec import Engine, SamplingParams
t_import = time.time() - t0
e = Engine.load(sys.argv[1], threads=int(sys.argv[2]), drafter="none")
t_load = time.time() - t0
r = e.generate(sys.argv[3], SamplingParams(max_new_tokens=1, ignore_eos=True))
t_first = time.time() - t0
print(json.dumps({"import_s": t_import, "load_s": t_load, "first_token_s": t_first,
                  "tokens": len(r.token_ids),
                  "repacked": e.model.repack_cache_writer is not None}), flush=True)
"""


@dataclass(frozen=True)
class ColdStartConfig:
    threads: int = 2
    repeats: int = 1  # (first run, later run, llama-server) triples; medians reported
    pause_s: float = 5.0  # idle before each process (see above; 0: none)
    peer: bool = True  # llama-server too

    def __post_init__(self) -> None:
        if self.threads < 1 or self.repeats < 1 or self.pause_s < 0:
            raise DataError("cold start: need threads >= 1, repeats >= 1 and pause_s >= 0")


def ours_once(model: Path, threads: int, cache_dir: Path) -> dict[str, Any]:
    """One fresh process of ours with ``cache_dir`` as its cache."""
    env = dict(os.environ, RECALLSPEC_CACHE_DIR=str(cache_dir), COLD_T0=repr(time.time()))
    # Modules' bytecode cached as a user's install has it (pip compiles it at install; an
    # editable install writes it on first import): a shell that sets
    # PYTHONDONTWRITEBYTECODE would recompile all our modules in every run.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(model), str(threads), PROMPT],
                          env=env, capture_output=True, text=True, check=False)
    exit_s = time.perf_counter() - t0
    if proc.returncode != 0:
        raise DataError(f"cold start: ours failed on {model}: {proc.stderr.strip()[-2000:]}")
    out = dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    out["exit_s"] = exit_s
    return out


def llamacpp_once(model: Path, threads: int) -> dict[str, Any]:
    """One fresh llama-server: /health answered, then its first completed token."""
    ids = load_tokenizer(str(model)).encode_prompt(PROMPT)
    t0 = time.perf_counter()
    with lc.LlamaServer(lc.ServerConfig(str(model), threads, ctx_per_slot=1024)) as srv:
        ready = time.perf_counter() - t0
        srv.complete(ids, 1)
        first = time.perf_counter() - t0
    return {"ready_s": ready, "first_token_s": first}


def measure(model: Path, cfg: ColdStartConfig, scratch: Path | None = None,
            say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """{"runs": every process's figures, "summary": their medians and ratios}; first
    runs' cache directories are made (and removed) under ``scratch`` (default: the
    system's temporary directory)."""
    if not model.is_file():
        raise DataError(f"cold start: no such file {model}")
    model.read_bytes()  # the file in the page cache for both engines
    runs: dict[str, list[dict[str, Any]]] = {"ours_first": [], "ours_later": [], "llamacpp": []}
    for i in range(cfg.repeats):
        with tempfile.TemporaryDirectory(prefix="cold-", dir=scratch) as tmp:
            for name in ("ours_first", "ours_later"):
                time.sleep(cfg.pause_s)
                runs[name].append(ours_once(model, cfg.threads, Path(tmp)))
        if cfg.peer:
            time.sleep(cfg.pause_s)
            runs["llamacpp"].append(llamacpp_once(model, cfg.threads))
        if say is not None:
            say(f"  cold start {i + 1}/{cfg.repeats}: " + ", ".join(
                f"{name} {rows[-1]['first_token_s']:.1f} s" for name, rows in runs.items()
                if rows))
    return {"threads": cfg.threads, "repeats": cfg.repeats, "pause_s": cfg.pause_s,
            "prompt": PROMPT, "runs": runs, "summary": summarize(runs)}


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, float | None]:
    """Medians over the repeats, and ours over llama-server's first token (None without
    it)."""
    def med(name: str, key: str) -> float | None:
        rows = runs.get(name) or []
        return statistics.median(r[key] for r in rows) if rows else None

    s = {"ours_first_token_s": med("ours_first", "first_token_s"),
         "ours_first_load_s": med("ours_first", "load_s"),
         "ours_first_exit_s": med("ours_first", "exit_s"),
         "ours_later_token_s": med("ours_later", "first_token_s"),
         "ours_import_s": med("ours_later", "import_s"),
         "llamacpp_ready_s": med("llamacpp", "ready_s"),
         "llamacpp_first_token_s": med("llamacpp", "first_token_s")}
    lc = s["llamacpp_first_token_s"]
    for ours, ratio in (("ours_first_token_s", "first_vs_llamacpp"),
                        ("ours_later_token_s", "later_vs_llamacpp")):
        value = s[ours]
        s[ratio] = None if lc is None or value is None else value / lc
    return s


def render_markdown(res: dict[str, Any], title: str) -> str:
    s = res["summary"]
    rows = [["first token s", num(s["ours_first_token_s"]), num(s["ours_later_token_s"]),
             num(s["llamacpp_first_token_s"])],
            ["vs llama-server", num(s["first_vs_llamacpp"], ".2f", "x"),
             num(s["later_vs_llamacpp"], ".2f", "x"), "1.00x"]]
    return (
        f"Time to first token from a fresh process, {title}, {res['threads']} threads, "
        f"medians of {res['repeats']}, {res['pause_s']:g} s idle before each process.\n\n"
        + table(["", "ours first run", "ours later run", "llama-server"], rows) + "\n\n"
        f"Ours: Python + torch + recallspec import {num(s['ours_import_s'])} s; first run "
        f"loaded at {num(s['ours_first_load_s'])} s, its process ended at "
        f"{num(s['ours_first_exit_s'])} s (the background repack cache write); "
        f"llama-server ready (/health) at {num(s['llamacpp_ready_s'])} s.\n")


__all__ = ["PROMPT", "ColdStartConfig", "llamacpp_once", "measure", "ours_once",
           "render_markdown", "summarize"]
