"""Hunt for answers that differ between processes: the same greedy questions answered in
N fresh processes, each answer compared with the first process's plain decoding.

    .venv/bin/python scripts/exp_identity_processes.py [--processes 20]
        [--methods ar portfolio:mode=adaptive] [--per-category 8] [--out bench_out/identity]

Why: on 2026-11-28, on a 2-vCPU KVM guest whose speed swung 30% within minutes, 2 of
about 40 fresh processes answered differently from all the others: once with
``portfolio`` and once with plain decoding (``ar``), each over a run of consecutive
questions (prompts 16-23 of 48, the first from its first generated token, i.e. the
prefill), the later questions identical again. 300 further answers in one process
(varied draft sizes, a CPU hog beside it) and 3 processes under a hog did not repeat it.
Each process here writes its answers to OUT/<i>-<method>.json; the summary lists every
(process, method, question, first differing position).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys
from recallspec import Engine, SamplingParams
from recallspec.bench.suites import SuiteSelection, load_suite
method, per_category, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
qs = load_suite("spec_bench", SuiteSelection(per_category=per_category))
eng = Engine.load(drafter="none")
p = SamplingParams(max_new_tokens=128)
d = "none" if method == "ar" else method
ids = [eng.generate(q.turns[0], p, chat=True, drafter=d).token_ids for q in qs]
json.dump(ids, open(out, "w"))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--processes", type=int, default=20)
    ap.add_argument("--methods", nargs="+", default=["ar", "portfolio:mode=adaptive"])
    ap.add_argument("--per-category", type=int, default=8)
    ap.add_argument("--out", default="bench_out/identity")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ref: list[list[int]] | None = None
    diffs = []
    for i in range(a.processes):
        for m in a.methods:
            f = out / f"{i}-{m.replace(':', '_')}.json"
            subprocess.run([sys.executable, "-c", CHILD, m, str(a.per_category), str(f)],
                           check=True)
            ids = json.loads(f.read_text())
            if ref is None:
                ref = ids
            for q, (x, y) in enumerate(zip(ids, ref, strict=True)):
                if x != y:
                    k = next((j for j, (s, t) in enumerate(zip(x, y, strict=False)) if s != t),
                             min(len(x), len(y)))
                    diffs.append({"process": i, "method": m, "question": q, "position": k})
            print(f"process {i} {m}: {sum(d['process'] == i and d['method'] == m for d in diffs)}"
                  " answers differ", flush=True)
    (out / "summary.json").write_text(json.dumps(diffs, indent=1))
    print(f"{len(diffs)} differing answers; {out / 'summary.json'}")


if __name__ == "__main__":
    main()
