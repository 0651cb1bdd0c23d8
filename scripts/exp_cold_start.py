"""Time to first token of a GGUF from a fresh process: ours on the first run (nothing
cached: the GGUF's conversion and repack) and on a later run (the repack cache read),
against native llama-server (process start to its first completed token), in one run.

Each measurement is a new process (Python, torch and the model imported and loaded as
a user's command would); ours with the ``none`` drafter (plain decoding), so that no
cost curve is measured (the curve, when a policy needs one, comes after this and is
cached per model: ``runtime/cost_calibration.py``). Cold runs use a fresh
``RECALLSPEC_CACHE_DIR`` each; the GGUF itself stays in the page cache for both engines
(the script reads it first).
The first-run process also writes the repack cache in the background: its end is
reported apart (``exit_s``), since the model answers before it.

Every process starts after ``--pause`` seconds of idle (default 5): VMs that return freed
memory to their host (virtio-balloon free page reporting, as on our Firecracker
measuring VMs, ~2 s after a free) fault it back in at ~1-3 s per GB, so a process
started right after another freed its memory would find that memory still backed and
start faster than on a machine that had been idle, whichever engine it is. Both
engines' first runs allocate fresh memory (ours: the repacked weights; llama-server:
its own repacked Q4_0/Q4_K buffers, the KV cache).

    .venv/bin/python scripts/exp_cold_start.py --model PATH.gguf --repeats 3 \
        --out bench_out/cold_start

Writes OUT/cold_start.json and OUT/cold_start.md (medians over the repeats).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROMPT = "Explain in one paragraph why the sky is blue."

# Runs in the child: load, one greedy token, report seconds since the parent's t0 (wall
# clock, shared by both processes).
_CHILD = """
import json, os, sys, time
t0 = float(os.environ["COLD_T0"])
from recallspec import Engine, SamplingParams
t_import = time.time() - t0
e = Engine.load(sys.argv[1], threads=int(sys.argv[2]), drafter="none")
t_load = time.time() - t0
r = e.generate(sys.argv[3], SamplingParams(max_new_tokens=1))
t_first = time.time() - t0
print(json.dumps({"import_s": t_import, "load_s": t_load, "first_token_s": t_first,
                  "tokens": len(r.token_ids)}), flush=True)
"""


def ours(model: Path, threads: int, cache_dir: Path) -> dict[str, Any]:
    env = dict(os.environ, RECALLSPEC_CACHE_DIR=str(cache_dir), COLD_T0=repr(time.time()))
    # Modules' bytecode cached as a user's install has it (pip compiles it at install; an
    # editable install writes it on first import): a shell that sets
    # PYTHONDONTWRITEBYTECODE would recompile our ~60 modules in every run (~0.2 s).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(model), str(threads), PROMPT],
                          env=env, capture_output=True, text=True, check=False)
    exit_s = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"ours failed: {proc.stderr.strip()[-2000:]}")
    out = dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    out["exit_s"] = exit_s
    return out


def llamacpp(model: Path, threads: int) -> dict[str, Any]:
    from recallspec.bench import llamacpp as lc
    from recallspec.models import load_tokenizer

    ids = load_tokenizer(str(model)).encode_prompt(PROMPT)
    t0 = time.perf_counter()
    with lc.LlamaServer(lc.ServerConfig(str(model), threads, ctx_per_slot=1024)) as srv:
        ready = time.perf_counter() - t0
        srv.complete(ids, 1)
        first = time.perf_counter() - t0
    return {"ready_s": ready, "first_token_s": first}


def median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="a GGUF file")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench_out/cold_start"))
    ap.add_argument("--pause", type=float, default=5.0,
                    help="idle seconds before each process starts (see above; 0: none)")
    ap.add_argument("--no-peer", action="store_true",
                    help="ours only (e.g. an older checkout's, for a before/after)")
    args = ap.parse_args()
    if not args.model.is_file():
        raise SystemExit(f"--model {args.model}: no such file")
    args.out.mkdir(parents=True, exist_ok=True)
    args.model.read_bytes()  # the file in the page cache for both engines
    runs: dict[str, list[dict[str, Any]]] = {"ours_first": [], "ours_later": [], "llamacpp": []}
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="cold-", dir=args.out) as tmp:
            time.sleep(args.pause)
            runs["ours_first"].append(ours(args.model, args.threads, Path(tmp)))
            time.sleep(args.pause)
            runs["ours_later"].append(ours(args.model, args.threads, Path(tmp)))
        if not args.no_peer:
            time.sleep(args.pause)
            runs["llamacpp"].append(llamacpp(args.model, args.threads))
        last = {name: rows[-1]["first_token_s"] for name, rows in runs.items() if rows}
        print(f"repeat {i + 1}/{args.repeats}: " + ", ".join(
            f"{name} {s:.1f} s" for name, s in last.items()), file=sys.stderr, flush=True)
    if args.no_peer:
        runs["llamacpp"] = [{"ready_s": float("nan"), "first_token_s": float("nan")}]
    lc_first = median(runs["llamacpp"], "first_token_s")
    summary = {
        "ours_first_token_s": median(runs["ours_first"], "first_token_s"),
        "ours_first_load_s": median(runs["ours_first"], "load_s"),
        "ours_first_exit_s": median(runs["ours_first"], "exit_s"),
        "ours_later_token_s": median(runs["ours_later"], "first_token_s"),
        "ours_import_s": median(runs["ours_later"], "import_s"),
        "llamacpp_ready_s": median(runs["llamacpp"], "ready_s"),
        "llamacpp_first_token_s": lc_first,
    }
    summary["first_vs_llamacpp"] = summary["ours_first_token_s"] / lc_first
    summary["later_vs_llamacpp"] = summary["ours_later_token_s"] / lc_first
    res = {"model": str(args.model), "file_mb": args.model.stat().st_size / 1e6,
           "threads": args.threads, "repeats": args.repeats, "pause_s": args.pause,
           "prompt": PROMPT,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "summary": summary, "runs": runs}
    (args.out / "cold_start.json").write_text(json.dumps(res, indent=2))
    s = summary
    md = (f"Time to first token from a fresh process, {args.model.name} "
          f"({res['file_mb']:,.0f} MB), {args.threads} threads, medians of {args.repeats}, "
          f"{args.pause:g} s idle before each process ({res['date']}).\n\n"
          "| | ours first run | ours later run | llama-server |\n|---|---|---|---|\n"
          f"| first token s | {s['ours_first_token_s']:.2f} | {s['ours_later_token_s']:.2f} | "
          f"{s['llamacpp_first_token_s']:.2f} |\n"
          f"| vs llama-server | {s['first_vs_llamacpp']:.2f}x | {s['later_vs_llamacpp']:.2f}x "
          "| 1.00x |\n\n"
          f"Ours: Python + torch + recallspec import {s['ours_import_s']:.2f} s; first run "
          f"loaded at {s['ours_first_load_s']:.2f} s, its process ended at "
          f"{s['ours_first_exit_s']:.2f} s (the background repack cache write); "
          f"llama-server ready (/health) at {s['llamacpp_ready_s']:.2f} s.\n")
    (args.out / "cold_start.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
