"""Two versions of recallspec timed question by question in one run (issue 36: "the
same run before and after the change, our ar and default policy within 3% of each
other's tok/s and every answer identical"; issue 61 asks the same of its redesign).

    .venv/bin/python benchmarks/experiments/exp_before_after.py \\
        --before-python WT/.venv/bin/python --after-python .venv/bin/python
        [--per-category 8] [--max-new-tokens 128] [--repeats 2] [--model M]
        [--methods ar,portfolio] [--out bench_out/i36_ab]

Each version runs in its own long-lived worker process (a Python whose ``recallspec``
is that version), holding one engine. A light venv over a worktree of the old version,
with this checkout's compiled modules::

    git worktree add --detach WT REV && python3 -m venv --without-pip WT/.venv
    SP=WT/.venv/lib/python3.11/site-packages
    echo WT/src > $SP/wt.pth; echo $PWD/.venv/lib/python3.11/site-packages > $SP/main.pth
    ln -s $PWD/.venv/lib/python3.11/site-packages/recallspec/*.so WT/src/recallspec/

The driver asks them in turn to answer one question with one method and waits for the
answer, so only one computes at a time and the two answers of a pair are timed seconds
apart: a shared VM's drift within minutes cancels from the per-question ratios, which
block-wise runs could not show to 3%. The pair's order alternates. Methods: plain
decoding (``ar``) and the default policy (``portfolio``, cost-aware sizing); both versions
must read the same cost curve (copy one to the other's cache key first). Writes OUT.json
(per question and method: both times, both answers) and OUT.md.

Feeds the before/after checks of the notebook docs/history/benchmarks_2026-11-27_to_12-01.md
("Named drafters against plain decoding (issue 36, 2026-11-28)" and the kernel changes of
issue 37 after it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from typing import Any

from _common import write_outputs

from recallspec.markdown import table_lines

WORKER = r"""
import importlib, json, sys, time
from recallspec import Engine, SamplingParams
from recallspec.errors import DataError
for name in ("common.suites", "suites"):  # the suites' module now, and before issue 61
    try:
        suites = importlib.import_module("recallspec.bench." + name)
        break
    except ImportError:
        continue
SuiteSelection, load_suite = suites.SuiteSelection, suites.load_suite
per_category, max_new = int(sys.argv[1]), int(sys.argv[2])
model = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else None
qs = load_suite("spec_bench", SuiteSelection(per_category=per_category))
try:  # prefix cache off where there is one: both versions prefill every answer
    eng = Engine.load(model, drafter="none", prefix_cache=False)
except TypeError:
    eng = Engine.load(model, drafter="none")
p = SamplingParams(max_new_tokens=max_new)
try:  # a base model without a chat template (Gemma-3-270M) answers the plain text
    eng.prompt_ids("x", chat=True)
    chat = True
except DataError:
    chat = False
KW = {"ar": {"drafter": "none"}, "portfolio": {"drafter": "portfolio", "mode": "adaptive"}}
print(json.dumps(len(qs)), flush=True)
for line in sys.stdin:
    i, method = json.loads(line)
    t0 = time.perf_counter()
    r = eng.generate(qs[i].turns[0], p, chat=chat, **KW[method])
    print(json.dumps([time.perf_counter() - t0, r.token_ids]), flush=True)
"""
METHODS = ("ar", "portfolio")


class Worker:
    def __init__(self, python: str, per_category: int, max_new: int, model: str = "") -> None:
        self.p = subprocess.Popen(
            [python, "-c", WORKER, str(per_category), str(max_new), model],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.n = int(self._read())

    def _read(self) -> Any:
        assert self.p.stdout is not None
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited with {self.p.wait()}")
        return json.loads(line)

    def ask(self, i: int, method: str) -> tuple[float, list[int]]:
        assert self.p.stdin is not None
        self.p.stdin.write(json.dumps([i, method]) + "\n")
        self.p.stdin.flush()
        t, ids = self._read()
        return float(t), list(ids)

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        self.p.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before-python", required=True)
    ap.add_argument("--after-python", default=sys.executable)
    ap.add_argument("--per-category", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--model", default="", help="GGUF file or alias (default: the default)")
    ap.add_argument("--methods", default=",".join(METHODS), help="of: " + ", ".join(METHODS))
    ap.add_argument("--out", default="bench_out/i36_ab")
    a = ap.parse_args()
    methods = [m for m in a.methods.split(",") if m]
    if not methods or any(m not in METHODS for m in methods):
        ap.error(f"--methods: a comma-separated subset of {', '.join(METHODS)}")
    w = {"before": Worker(a.before_python, a.per_category, a.max_new_tokens, a.model),
         "after": Worker(a.after_python, a.per_category, a.max_new_tokens, a.model)}
    n = w["before"].n
    for wk in w.values():  # warm-up: each method once (curves, drafters' first use)
        for m in methods:
            wk.ask(0, m)
    rows: list[dict[str, Any]] = []
    for i in range(n):
        for m in methods:
            times: dict[str, list[float]] = {"before": [], "after": []}
            ids: dict[str, list[int]] = {}
            for rep in range(a.repeats):
                order = ("before", "after") if (i + rep) % 2 == 0 else ("after", "before")
                for v in order:
                    t, got = w[v].ask(i, m)
                    times[v].append(t)
                    ids.setdefault(v, got)
            rows.append({"question": i, "method": m, "tokens": len(ids["after"]),
                         "before_s": statistics.median(times["before"]),
                         "after_s": statistics.median(times["after"]),
                         "same_answer": ids["before"] == ids["after"],
                         "before_ids": ids["before"], "after_ids": ids["after"]})
        print(f"{i + 1}/{n}", flush=True)
    for wk in w.values():
        wk.close()
    summary: dict[str, Any] = {}
    for m in methods:
        rs = [r for r in rows if r["method"] == m]
        tok = sum(r["tokens"] for r in rs)
        tb, ta = sum(r["before_s"] for r in rs), sum(r["after_s"] for r in rs)
        summary[m] = {"before_tok_s": tok / tb, "after_tok_s": tok / ta, "after_vs_before": tb / ta,
                      "median_question_ratio": statistics.median(r["before_s"] / r["after_s"]
                                                                 for r in rs),
                      "identical": sum(r["same_answer"] for r in rs), "questions": len(rs)}
    ar = {v: [r[f"{v}_ids"] for r in rows if r["method"] == "ar"] for v in ("before", "after")}
    for v in ("before", "after") if set(METHODS) <= set(methods) else ():
        port = [r[f"{v}_ids"] for r in rows if r["method"] == "portfolio"]
        summary[f"portfolio_equals_ar_{v}"] = sum(x == y for x, y in zip(port, ar[v], strict=True))
    lines = table_lines(
        ["method", "before tok/s", "after tok/s", "after/before (sum)", "median per question",
         "same answer"],
        [[m, f"{s['before_tok_s']:.1f}", f"{s['after_tok_s']:.1f}",
          f"{s['after_vs_before']:.3f}x", f"{s['median_question_ratio']:.3f}x",
          f"{s['identical']}/{s['questions']}"] for m, s in ((m, summary[m]) for m in methods)])
    if "portfolio_equals_ar_before" in summary:
        lines += ["", f"portfolio answers equal to ar: before "
                  f"{summary['portfolio_equals_ar_before']}/{n}, after "
                  f"{summary['portfolio_equals_ar_after']}/{n}"]
    write_outputs(a.out, {"args": vars(a), "summary": summary, "rows": rows}, lines)


if __name__ == "__main__":
    main()
