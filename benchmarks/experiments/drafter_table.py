"""Every drafter named with its default options against plain decoding (issue 36:
">= 0.95x AR on the demo prompts and on instruction prompts with an Alpaca index").

    .venv/bin/python benchmarks/experiments/drafter_table.py --index I.rsidx --rest R.rest \\
        --crest C.crest [--suites demo spec_bench] [--per-category 2] [--max-new-tokens 128]
        [--repeats 3] [--out bench_out/drafters/table]

Build the Alpaca stores first (the tokenizer is the default model's):

    recallspec index build --corpus ../shared/data/alpaca/llamafactory_alpaca_en_demo.json \\
        --chat-template --out I.rsidx
    recallspec datastore build --kind rest --corpus <the same> --chat-template --out R.rest
    recallspec datastore build --kind crest --from-rest R.rest --out C.crest

Drift-robust by interleaving: one engine; for each question and repeat, plain decoding
and every drafter answer it in turn, each round starting at another method (a drafter's
instance stays warm across questions, as in a server). A method's tok/s is its
generated tokens over the sum of its per-question median times (prefill included); its
ratio to plain decoding comes from the same questions, timed minutes apart at most.
Greedy, chat template. Checks every answer against plain decoding's. Writes OUT.json
and OUT.md. Run it alone.

Feeds docs/BENCHMARKS.md, "Speculation: Spec-Bench on the real models" (command [S4]).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from _common import write_outputs

from recallspec import Engine, SamplingParams
from recallspec.bench.common.suites import SuiteSelection, load_suite
from recallspec.markdown import table_lines


def drafters(a: argparse.Namespace) -> list[str]:
    return ["sam", f"sam:index={a.index}", "sam+recycling", "pld", "llma", "recycling",
            f"rest:datastore={a.rest}", f"crest:datastore={a.crest}"]


def run_suite(eng: Engine, suite: str, a: argparse.Namespace) -> dict[str, Any]:
    sel = SuiteSelection(per_category=a.per_category) if suite != "demo" else SuiteSelection()
    prompts = [q.turns[0] for q in load_suite(suite, sel)]
    params = SamplingParams(max_new_tokens=a.max_new_tokens)
    methods = ["none", *drafters(a)]
    for m in methods:  # warm-up: each drafter opened, bound and used once
        eng.generate(prompts[0], SamplingParams(max_new_tokens=8), chat=True, drafter=m)
    times: dict[str, list[float]] = {m: [] for m in methods}
    tokens: dict[str, int] = dict.fromkeys(methods, 0)
    same: dict[str, int] = dict.fromkeys(methods, 0)
    for i, p in enumerate(prompts):
        per: dict[str, list[float]] = {m: [] for m in methods}
        ref: list[int] | None = None
        for rep in range(a.repeats):
            # Each round starts at another method (no method always runs first, after
            # another's cache footprint); plain decoding still answers first once, so
            # every drafter's answer is checked against it.
            shift = (i + rep) % len(methods) if rep else 0
            for m in methods[shift:] + methods[:shift]:
                t0 = time.perf_counter()
                r = eng.generate(p, params, chat=True, drafter=m)
                per[m].append(time.perf_counter() - t0)
                if m == "none" and ref is None:
                    ref = r.token_ids
                elif m != "none" and r.token_ids == ref and len(per[m]) == 1:
                    same[m] += 1
        for m in methods:
            times[m].append(statistics.median(per[m]))
            tokens[m] += len(ref or [])
        print(f"{suite} {i + 1}/{len(prompts)}", flush=True)
    base = tokens["none"] / sum(times["none"])
    rows = {}
    for m in methods:
        tps = tokens[m] / sum(times[m])
        rows[m] = {"tokens_per_s": tps, "vs_ar": tps / base, "identical": same[m] if m != "none"
                   else len(prompts), "questions": len(prompts)}
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--index", required=True)
    ap.add_argument("--rest", required=True)
    ap.add_argument("--crest", required=True)
    ap.add_argument("--suites", nargs="+", default=["demo", "spec_bench"])
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench_out/drafters/table")
    a = ap.parse_args()
    # Prefix cache off: every method answers each question several times, and a reused
    # prompt would time decoding alone for all but the first answer.
    eng = Engine.load(drafter="none", prefix_cache=False)
    res = {s: run_suite(eng, s, a) for s in a.suites}
    header = ["drafter (default options)", *(f"{s}: tok/s, vs ar, = ar" for s in a.suites)]
    rows = [["ar" if m == "none" else m,
             *(f"{res[s][m]['tokens_per_s']:.1f}, {res[s][m]['vs_ar']:.2f}x, "
               f"{res[s][m]['identical']}/{res[s][m]['questions']}" for s in a.suites)]
            for m in res[a.suites[0]]]
    write_outputs(a.out, {"args": vars(a), "results": res}, table_lines(header, rows))


if __name__ == "__main__":
    main()
