"""Paired prefill rounds of one GGUF: ours (a fresh process: one forward of a P-token
prompt chunk at position 0, last row's logits, median of R, as ``bench scale`` measures
``prefill_tok_s``) and llama-bench's ppP (median of R), back to back, the order
alternating: the prefill ratio least moved by a VM whose speed drifts within a run
(``bench scale`` measures the two sides minutes apart).

    .venv/bin/python scripts/exp_paired_prefill.py --gguf SHAPE.gguf --rounds 5 \
        [--prefill 512] [--repeats 3] [--threads 2] --out bench_out/paired_pp.json

Writes OUT (JSON: the rounds, their ratios, median, min, max) and prints the median.
Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

OURS = r"""
import json, sys, torch
from recallspec.engine import Engine
from recallspec.runtime.cost_calibration import grid_times
gguf, p, reps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
engine = Engine.load(gguf, max_len=p + 8, threads=threads)
engine.wait_for_repack_cache()
model = engine.model
g = grid_times(model, model.new_cache(1, p + 2), engine.threads, (p,), (0,), logits="last",
               repeats=reps)
print(json.dumps(p / g[0][p]))
"""


def ours(gguf: str, p: int, repeats: int, threads: int) -> float:
    r = subprocess.run([sys.executable, "-c", OURS, gguf, str(p), str(repeats), str(threads)],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"ours failed: {r.stderr.strip().splitlines()[-1:]}")
    return float(json.loads(r.stdout.strip().splitlines()[-1]))


def llama(gguf: str, p: int, repeats: int, threads: int) -> float:
    from recallspec.bench import llamacpp as lc

    rows = lc.llama_bench(gguf, threads, p=p, repeats=repeats)
    pp = [r for r in rows if int(r["n_prompt"]) == p and int(r["n_gen"]) == 0]
    if not pp:
        raise SystemExit(f"llama-bench wrote no pp{p} row")
    return statistics.median(p * 1e9 / float(ns) for ns in pp[0]["samples_ns"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    if a.rounds < 1 or a.prefill < 1 or a.repeats < 1:
        ap.error("--rounds, --prefill and --repeats must be >= 1")
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rounds = []
    for r in range(a.rounds):
        first = "ours" if r % 2 == 0 else "llamacpp"
        got: dict[str, float | str] = {"first": first}
        for side in (first, "llamacpp" if first == "ours" else "ours"):
            time.sleep(5)  # memory freed just before faults back fast on this VM: even out
            f = ours if side == "ours" else llama
            got[side] = f(a.gguf, a.prefill, a.repeats, a.threads)
        rounds.append(got)
        print(f"round {r + 1}: ours {got['ours']:.1f}, llama.cpp {got['llamacpp']:.1f} tok/s "
              f"({float(got['ours']) / float(got['llamacpp']):.2f}x)", flush=True)
    ratios = [float(x["ours"]) / float(x["llamacpp"]) for x in rounds]
    out = {"date": date, "gguf": a.gguf, "prefill": a.prefill, "threads": a.threads,
           "repeats": a.repeats, "rounds": rounds, "ratios": ratios,
           "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1))
    print(f"median {out['median']:.3f} (min {out['min']:.3f}, max {out['max']:.3f}) over "
          f"{len(ratios)} rounds -> {a.out}")


if __name__ == "__main__":
    main()
