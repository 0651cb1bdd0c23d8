"""Where a measured cost curve is kept: its cache key, reading and writing it, and which
cached curve stands (the one of this key, a provisional one, none when its grid disagrees).

A curve is stored per ``curve_key`` (what it was measured for: model, machine, forward,
measuring method) and read back instead of measured again (``cost/calibration.py``
measures, and decides what is cached for good).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from recallspec.cost.curve import REFERENCE_CONTEXT, CostCurve
from recallspec.kernels import isa

# How the curve is measured, part of the cache key: a curve cached by an earlier method
# is measured again (v2: sizes in interleaved rounds, non-decreasing in rows). A plan
# thinned to the budget (``cost/plan.py``) is the same method on fewer points,
# cached under the same key: a full curve cached before budgets is kept (the better
# one), and a model whose full plan misses the budget is not measured again on every
# start. (Bump it when a change of the ladder makes the curves cached by the old one
# worse.)
CALIBRATION = "v2-interleaved-monotone"
# A mixture of experts' curves also count the experts their forwards woke
# (``CostCurve.experts``): one cached before they were is measured again (a dense
# model's key is unchanged).
EXPERTS_COUNTED = "experts-counted"
PROVISIONAL_TTL = 1800.0  # seconds a curve measured on a busy machine stands in


def curve_key(model: Any, tokenizer_fingerprint: str, threads: int) -> str:
    """What a curve was measured for: the model (its tokenizer, shape, weight format and
    KV-cache dtype), the forward that runs it (native or Python, the kernel path, the
    kernels' build), the thread count, the CPU (with its family and model numbers), torch
    and the measuring method (``CALIBRATION``; ``EXPERTS_COUNTED`` for a mixture of
    experts). (The forward and the kernels count: the
    native forward is much faster than the Python one on the same weights, and a faster
    1-row product changes what a draft row costs.)"""
    c = model.config
    fmt = getattr(model, "weight_format", None) or str(getattr(model, "dtype", ""))
    fmt += f"/kv:{model.kv_dtype}"  # (a 16-bit cache: other attention cost)
    forward = "native" if getattr(model, "native", None) is not None else "python"
    parts = [
        tokenizer_fingerprint, str(c.num_layers), str(c.hidden_size), str(c.vocab_size), fmt,
        str(threads), isa.cpu_identity(), torch.__version__, forward, isa.ISA, isa.kernels_build(),
        CALIBRATION,
    ]
    if getattr(c, "moe", False):
        parts.append(EXPERTS_COUNTED)
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


def cached_curve(cache_path: Path | None, key: str, busy: Callable[[], bool] = machine_busy,
                 say: Callable[[str], None] | None = None) -> CostCurve | None:
    """The curve ``calibrate`` would return without measuring: the one cached for
    ``key``, else (the machine busy) a provisional one of the last PROVISIONAL_TTL
    seconds; None: it would measure."""
    cached = read_curve(cache_path, key)
    if cached is not None and grid_agrees(cached):  # (else written before the check)
        return cached
    provisional = None if cache_path is None else cache_path.with_suffix(".busy.json")
    if provisional is not None and busy():
        stand_in = read_curve(provisional, key)
        age = time.time() - provisional.stat().st_mtime if stand_in is not None else 0.0
        if stand_in is not None and age < PROVISIONAL_TTL:
            if say:
                say(f"the machine is busy: using the cost curve measured while it was busy "
                    f"{age / 60:.0f} min ago (measured again once the machine is quiet)")
            return stand_in
    return None


# How far the decode grid's forwards may be, as a median over the shared row counts, from
# the same forwards measured first at REFERENCE_CONTEXT: measured a few seconds apart on a
# quiet machine their ratio stays near 1; one curve measured while a test suite ran
# beside it was off by more than twice and priced 6 rows as 1 (the planner then verified
# long drafts for few accepted tokens, slower than plain decoding). The load average
# missed it (the burst came and went between its two reads).
GRID_AGREEMENT = 1.5


def grid_agrees(curve: CostCurve) -> bool:
    """Whether the decode grid's rows at the contexts around REFERENCE_CONTEXT agree with
    the reference forwards (``GRID_AGREEMENT``): a disagreement means the machine's speed
    changed while measuring, and the curve is not cached for good."""
    grid = curve.decode
    if grid is None:
        return True
    ref = dict(zip(curve.tokens, curve.seconds, strict=True))
    for j, ctx in enumerate(grid.contexts):
        if ctx > 2 * REFERENCE_CONTEXT:
            continue
        ratios = [grid.seconds[j][i] / ref[n] for i, n in enumerate(grid.rows) if n in ref]
        if ratios and not 1 / GRID_AGREEMENT <= statistics.median(ratios) <= GRID_AGREEMENT:
            return False
    return True
