"""The KV-cache format end to end (issue 18 item 2, "chosen by measurement"): the same
questions and methods on a float32 and a float16 KV cache, in one run, blocks alternating.

    .venv/bin/python scripts/exp_kv_dtype.py [--suite spec_bench] [--per-category 3]
        [--methods none llma portfolio] [--max-new-tokens 128] [--repeats 2]
        [--out bench_out/kv_dtype]

Greedy, chat template, EOS ignored; ``portfolio`` runs cost-aware (adaptive), the
other drafters at fixed sizes (mode="fixed"). Each repeat
runs every (method, cache) over all questions, the order of the caches swapped every
repeat; tok/s = generated tokens / wall time (prefill included); the median over repeats.
Checks that each method's answers equal plain decoding's on the same cache, and counts
the answers the two caches share. Writes OUT.json and OUT.md. Run it alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from recallspec import Engine, SamplingParams
from recallspec.bench.suites import SuiteSelection, load_suite

KVS = ("float32", "float16")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default="spec_bench")
    ap.add_argument("--per-category", type=int, default=3)
    ap.add_argument("--methods", nargs="+", default=["none", "llma", "portfolio"])
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default="bench_out/kv_dtype")
    args = ap.parse_args()
    prompts = [q.turns[0] for q in load_suite(args.suite, SuiteSelection(args.per_category))]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    engines = {kv: Engine.load(kv_dtype=kv, prefix_cache=False) for kv in KVS}
    prompt_tokens = [len(engines["float32"].encode_prompt(p, chat=True)) for p in prompts]
    speed: dict[tuple[str, str], list[float]] = {}
    answers: dict[tuple[str, str], list[list[int]]] = {}
    for rep in range(args.repeats):
        for method in args.methods:
            for kv in KVS if rep % 2 == 0 else KVS[::-1]:
                eng = engines[kv]
                # portfolio cost-aware, the other drafters at fixed sizes (stated: a drafter
                # named without a sizing is cost-aware by default)
                extra: dict[str, Any] = {
                    "mode": "adaptive" if method == "portfolio" else "fixed"}
                eng.generate(prompts[0], params, chat=True, drafter=method, **extra)  # warm
                t0, tokens, outs = time.perf_counter(), 0, []
                for p in prompts:
                    r = eng.generate(p, params, chat=True, drafter=method, **extra)
                    tokens += len(r.token_ids)
                    outs.append(list(r.token_ids))
                speed.setdefault((method, kv), []).append(tokens / (time.perf_counter() - t0))
                answers[(method, kv)] = outs
                print(f"repeat {rep} {method} {kv}: {speed[(method, kv)][-1]:.1f} tok/s",
                      flush=True)
    rows = []
    for method in args.methods:
        med = {kv: statistics.median(speed[(method, kv)]) for kv in KVS}
        rows.append({
            "method": method, **{f"tok_s_{kv}": med[kv] for kv in KVS},
            "float16_over_float32": med["float16"] / med["float32"],
            **{f"identical_to_ar_{kv}": sum(a == b for a, b in zip(
                answers[(method, kv)], answers[("none", kv)], strict=True)) for kv in KVS},
            "runs": {kv: speed[(method, kv)] for kv in KVS},
        })
    shared = sum(a == b for a, b in zip(answers[("none", "float32")],
                                        answers[("none", "float16")], strict=True))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"suite": args.suite, "questions": len(prompts), "prompt_tokens": prompt_tokens,
            "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
            "ar_answers_shared_by_both_caches": shared}
    out.with_suffix(".json").write_text(json.dumps({**meta, "rows": rows}, indent=1),
                                        encoding="utf-8")
    n = len(prompts)
    lines = [f"{args.suite}: {n} questions (prompts {min(prompt_tokens)}-{max(prompt_tokens)} "
             f"tokens), {args.max_new_tokens} new tokens, median of {args.repeats} repeats; "
             f"plain decoding's answers equal on both caches: {shared}/{n}", "",
             "| method | float32 KV tok/s | float16 KV tok/s | float16 / float32 "
             "| = own AR (f32 / f16) |", "|---|---:|---:|---:|---|"]
    lines += [f"| {r['method']} | {r['tok_s_float32']:.1f} | {r['tok_s_float16']:.1f} "
              f"| {r['float16_over_float32']:.3f}x | {r['identical_to_ar_float32']}/{n} / "
              f"{r['identical_to_ar_float16']}/{n} |" for r in rows]
    md = "\n".join(lines) + "\n"
    out.with_suffix(".md").write_text(md, encoding="utf-8")
    print(md)


if __name__ == "__main__":
    main()
