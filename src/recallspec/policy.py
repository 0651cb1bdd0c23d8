"""The default drafting policy: the drafter and batch mode of every request that names
none on the command line, in the demo (``recallspec generate``, ``make demo``, one of the
bench's default methods: ``POLICY``) and in the server (``recallspec serve``:
``SERVE_POLICY``).

Chosen by measurement (docs/BENCHMARKS.md, "The default policy"): on this project's
2-core CPUs with the native quantized forward, the cost-aware ``portfolio`` (several
recalled chains a step, the one promising the most tokens per second drafted at its
best size) was 0.975-1.095x the best fixed drafter (of ``pld``, ``llma``,
``sam:max_tokens=4``, same run) on each of seven workloads (Spec-Bench, CNN/DailyMail,
MT-Bench, HumanEval, MBPP, GSM8K, extractive RAG; real runs, 3 repeats) and 1.15-1.66x
over AR (on fp32 weights 0.995-1.088x and 1.14-1.48x); in exact replay no fixed size of
those drafters beat it by more than 1%. Serving batches requests, where cost-aware sizing
also pays: at 4 requests/s on Spec-Bench prompts the server delivered 348 tok/s with it
against 267 with ``llma`` and 285 without speculation. Speculation is lossless, so the
choice changes speed only. A module of its own, free of imports, so that the command
line reads it without loading torch.
"""

from __future__ import annotations

DEFAULT_DRAFTER = "portfolio"
DEFAULT_MODE = "adaptive"  # runtime/modes.py: cost-aware draft sizing
# The same as one drafter spec string (``name:key=value:...``, mode= included).
POLICY = DEFAULT_DRAFTER if DEFAULT_MODE == "ems" else f"{DEFAULT_DRAFTER}:mode={DEFAULT_MODE}"

SERVE_DRAFTER = "portfolio"
SERVE_MODE = "adaptive"
SERVE_POLICY = f"{SERVE_DRAFTER}:mode={SERVE_MODE}"
