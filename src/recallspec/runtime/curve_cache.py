"""Where a measured cost curve is kept: its cache key, and reading and writing it.

A curve is stored per ``curve_key`` (what it was measured for: model, machine, forward,
measuring method) and read back instead of measured again (``cost_calibration.py``
measures, and decides what is cached for good).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from recallspec.runtime.cost_curve import CostCurve

# How the curve is measured, part of the cache key: a curve cached by an earlier method
# is measured again (v2: sizes in interleaved rounds, non-decreasing in rows). A plan
# thinned to the budget (``calibration_plan.py``) is the same method on fewer points,
# cached under the same key: a full curve cached before budgets is kept (the better
# one), and a model whose full plan misses the budget is not measured again on every
# start. (Bump it when a change of the ladder makes the curves cached by the old one
# worse.)
CALIBRATION = "v2-interleaved-monotone"


def curve_key(model: Any, tokenizer_fingerprint: str, threads: int) -> str:
    """What a curve was measured for: the model (its tokenizer, shape, weight format and
    KV-cache dtype), the forward that runs it (native or Python, the kernel path, the
    kernels' build), the thread count, the CPU (with its family and model numbers), torch
    and the measuring method (``CALIBRATION``). (The forward and the kernels count: the
    native forward takes half the Python one's time on the same weights, and a faster
    1-row product changes what a draft row costs.)"""
    from recallspec.runtime.isa import ISA, cpu_identity, kernels_build

    c = model.config
    fmt = getattr(model, "weight_format", None) or str(getattr(model, "dtype", ""))
    fmt += f"/kv:{model.kv_dtype}"  # (a 16-bit cache: other attention cost)
    forward = "native" if getattr(model, "native", None) is not None else "python"
    parts = [
        tokenizer_fingerprint, str(c.num_layers), str(c.hidden_size), str(c.vocab_size), fmt,
        str(threads), cpu_identity(), torch.__version__, forward, ISA, kernels_build(),
        CALIBRATION,
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def read_curve(path: Path | None, key: str) -> CostCurve | None:
    """The curve in ``path`` if it is one measured for ``key`` (None: absent, another
    key, or stale or corrupt: measure again)."""
    if path is None or not path.is_file():
        return None
    try:
        curve = CostCurve.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError):
        return None
    return curve if curve.key == key else None


def write_curve(path: Path, curve: CostCurve) -> None:
    """Atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(curve.to_json(), indent=1))
    tmp.replace(path)


def machine_busy() -> bool:
    """1-min load above 1.5 runnable tasks per CPU beyond our own."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return False
    return load > 1.5 * (os.cpu_count() or 1) + 1
