"""The default drafting policy: the drafter (and its sizing) of every request that names
none on the command line, in the demo (``recallspec generate``, ``make demo``, one of the
bench's default methods: ``POLICY``) and in the server (``recallspec serve``:
``SERVE_POLICY``).

Chosen by measurement (docs/history/benchmarks_2026-11.md, "The default policy" and
"Seven workloads"): on this project's 2-core CPUs with the native quantized forward, the
cost-aware ``portfolio`` (several recalled chains a step, the one promising the most
tokens per second drafted at its best size) was on par with the best fixed drafter (of
``pld``, ``llma``, ``sam:max_tokens=4``, same run) on each of seven workloads
(Spec-Bench, CNN/DailyMail, MT-Bench, HumanEval, MBPP, GSM8K, extractive RAG; real runs,
3 repeats), a little behind at worst, and beat AR on all of them (on fp32 weights too);
in exact replay no fixed size of those drafters beat it by more than a sliver. Serving
batches requests, where cost-aware sizing also pays: on Spec-Bench prompts at a steady
request rate the server delivered more tokens per second with it than with ``llma`` or
without speculation. Speculation is lossless, so the choice changes speed only. A module
of its own, free of imports, so that the command line reads it without loading torch.
"""

from __future__ import annotations

DEFAULT_DRAFTER = "portfolio"
# As a drafter spec (``drafters/spec.py``). Cost-aware sizing is every named drafter's
# default anyway; the spec states it so that the method keeps its name in benchmark
# answer files and reports (``portfolio:mode=adaptive.jsonl``).
POLICY = f"{DEFAULT_DRAFTER}:mode=adaptive"

SERVE_DRAFTER = "portfolio"
SERVE_POLICY = f"{SERVE_DRAFTER}:mode=adaptive"
