"""The default drafting policies: the drafter and batch mode of every request that names
none on the command line and in the demo (``recallspec generate``, ``make demo``, one of
the bench's default methods: ``POLICY``) and in the server (``recallspec serve``:
``SERVE_POLICY``).

Chosen by measurement (docs/BENCHMARKS.md, "The default policy"): on this project's
2-core CPUs with the native quantized forward, ``llma`` (fixed, EMS batch mode) was the
fastest lossless method on Spec-Bench overall (1.47x and 1.36x AR in two runs; the
cost-aware ``portfolio:mode=adaptive`` tied it overall but lost up to 7% per category to
its per-step Python cost) and never below 1x AR on the demo's prompts. Speculation is
lossless, so the choice changes speed only. Serving batches requests, and there the
cost-aware sizing pays for its Python: at 4 requests/s on Spec-Bench prompts the server
delivered 348 tok/s with ``portfolio:mode=adaptive`` against 267 with ``llma`` and 285
without speculation (tied at lower loads; docs/BENCHMARKS.md, "Serving"). A module of
its own, free of imports, so that the command line reads it without loading torch.
"""

from __future__ import annotations

DEFAULT_DRAFTER = "llma"
DEFAULT_MODE = "ems"  # runtime/modes.py; "adaptive" would add cost-aware draft sizing
# The same as one drafter spec string (``name:key=value:...``, mode= included).
POLICY = DEFAULT_DRAFTER if DEFAULT_MODE == "ems" else f"{DEFAULT_DRAFTER}:mode={DEFAULT_MODE}"

SERVE_DRAFTER = "portfolio"
SERVE_MODE = "adaptive"
SERVE_POLICY = f"{SERVE_DRAFTER}:mode={SERVE_MODE}"
