"""Measuring a cost curve (``runtime/cost_curve.py``) on this machine, and caching it.

The timings: one forward of a chain of T new rows after a random cached prefix, with
the engine's thread set-up, median of a few repeats; over a grid of T (and of context
lengths, for the draft-sized decode grid and the prompt-chunk prefill grid), plus the
extra cost of each additional sequence in a batch (its own attention call and mask).

The cache (``curve_cache.py``): a curve is stored per ``curve_key`` (model, dtype, thread
count, CPU, torch version, forward and kernels' build, measuring method) and read back
instead of measured again; one measured on a busy machine is only a provisional
stand-in (see ``calibrate``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from recallspec.runtime.batch import SequenceInput, build_batch
from recallspec.runtime.cost_curve import REFERENCE_CONTEXT, CostCurve, CostGrid
from recallspec.runtime.curve_cache import machine_busy, read_curve, write_curve
from recallspec.runtime.linear import forward_threads
from recallspec.runtime.threads import decode_threads

DEFAULT_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
# Draft-sized forwards x context lengths (a draft is at most a few dozen rows).
GRID_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
GRID_CONTEXTS = (128, 512, 1024, 2048)
# Prompt chunks (the engine's prefill_chunk is 512) x the position they start at.
PREFILL_SIZES = (32, 128, 256, 512)
PREFILL_STARTS = (0, 512, 1024, 1536)


def median_time(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def forward_times(
    model: Any, cache: Any, threads: int, sizes: Sequence[int], *, cached: int = 256,
    repeats: int = 3, warmup: int = 1,
) -> dict[int, float]:
    """Median seconds of one forward of a chain of T new rows (all rows' logits) after
    ``cached`` random tokens, for each T in ``sizes``, with the engine's thread set-up.
    Needs one free slot of ``cache`` with room for cached + max(sizes) positions."""
    grid = grid_times(model, cache, threads, sizes, (cached,), repeats=repeats, warmup=warmup)
    return grid[cached]


def random_prefix(model: Any, cache: Any, slot: int, cached: int, extra: int) -> list[int]:
    """``cached + extra`` random token ids (seed 0) of which the first ``cached`` are
    fed into ``slot`` of ``cache`` and committed (in chunks of 256): a context to time
    forwards after. The rest are for the forwards' own rows."""
    vocab = int(model.config.vocab_size)
    g = torch.Generator().manual_seed(0)
    ctx: list[int] = torch.randint(0, vocab, (cached + extra,), generator=g).tolist()
    with torch.inference_mode():
        for s in range(0, cached, 256):
            toks = ctx[s : min(s + 256, cached)]
            model(build_batch([SequenceInput(slot, s, toks, logits="none")]), cache)
            cache.commit(slot, s, range(len(toks)))
    return ctx


def grid_times(
    model: Any, cache: Any, threads: int, sizes: Sequence[int], contexts: Sequence[int], *,
    logits: str = "all", repeats: int = 3, warmup: int = 1,
) -> dict[int, dict[int, float]]:
    """{context: {T: median seconds}} of one forward of a chain of T new rows after
    ``context`` cached random tokens (``logits``: the rows whose logits it computes, as
    ``SequenceInput``). Needs one free slot of ``cache`` with room for max(contexts) +
    max(sizes) positions. The prefix is fed once, up to the largest context: a forward
    at a smaller one overwrites some of its entries with other tokens, which changes
    no timing."""
    slot = cache.allocate()
    out: dict[int, dict[int, float]] = {}
    try:
        ctx = random_prefix(model, cache, slot, max(contexts), max(sizes))
        with torch.inference_mode():
            for c in contexts:
                # Rows past the context are scratch: never committed, overwritten.
                metas = {k: build_batch([SequenceInput(slot, c, ctx[c : c + k], logits=logits)])
                         for k in sizes}

                def fwd(m: Any) -> Callable[[], None]:
                    def run() -> None:
                        with decode_threads(threads), forward_threads(m.num_tokens, threads):
                            model(m, cache)
                    return run

                out[c] = monotone_in_rows(interleaved_times(
                    {k: fwd(m) for k, m in metas.items()}, repeats, warmup))
    finally:
        cache.release(slot)
    return out


def interleaved_times(
    fns: dict[int, Callable[[], Any]], repeats: int, warmup: int = 1
) -> dict[int, float]:
    """Median seconds of each function, timed in rounds that call every function once
    (sizes in order), not one size's repeats after another: a shared VM's speed drifts
    by 10-30% within seconds, and timed in blocks that drift made a 2-row forward look
    cheaper than a 1-row one in 6 of 20 cached curves (the sizing then drafted a node a
    step for a 14% chance of a token). Within a round, neighbouring sizes run
    milliseconds apart, so the drift cancels from the comparisons the sizing makes."""
    for _ in range(warmup):
        for f in fns.values():
            f()
    ts: dict[int, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            ts[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in ts.items()}


def monotone_in_rows(times: dict[int, float]) -> dict[int, float]:
    """Times over increasing row counts made non-decreasing (a running maximum): a
    forward of more rows does all the work of one of fewer and more, so a measured dip
    is noise, and a dip would price a draft's rows below nothing."""
    out: dict[int, float] = {}
    top = 0.0
    for k in sorted(times):
        top = max(top, times[k])
        out[k] = top
    return out


def measure_grid(
    model: Any, threads: int, sizes: Sequence[int], contexts: Sequence[int], *,
    logits: str = "all", repeats: int = 3,
) -> CostGrid | None:
    """A ``CostGrid`` over the contexts that fit the model's positions (None if none)."""
    limit = int(getattr(model.config, "max_position", 0) or 0)
    fit = tuple(c for c in contexts if not limit or c + max(sizes) <= limit)
    if not fit:
        return None
    cache = model.new_cache(1, max(fit) + max(sizes) + 1)
    t = grid_times(model, cache, threads, sizes, fit, logits=logits, repeats=repeats)
    return CostGrid(tuple(sizes), fit, tuple(tuple(t[c][k] for k in sizes) for c in fit))


def _per_seq_cost(model: Any, threads: int, seqs: int, cached: int, repeats: int) -> float:
    """(t(seqs sequences x 1 row) - t(1 sequence x seqs rows)) / (seqs - 1)."""
    cache = model.new_cache(seqs, cached + seqs + 1)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, int(model.config.vocab_size), (cached,), generator=g).tolist()
    slots = [cache.allocate() for _ in range(seqs)]
    with torch.inference_mode():
        for s in slots:
            model(build_batch([SequenceInput(s, 0, ids, logits="none")]), cache)
            cache.commit(s, 0, range(cached))
        many = build_batch([SequenceInput(s, cached, [ids[0]]) for s in slots])
        one = build_batch([SequenceInput(slots[0], cached, ids[:seqs])])

        def run(m: Any) -> Callable[[], Any]:
            def f() -> Any:
                with decode_threads(threads), forward_threads(m.num_tokens, threads):
                    return model(m, cache)
            return f

        t = interleaved_times({0: run(many), 1: run(one)}, repeats)
        t_many, t_one = t[0], t[1]
    return max(t_many - t_one, 0.0) / (seqs - 1)


PROVISIONAL_TTL = 1800.0  # seconds a curve measured on a busy machine stands in


def calibrate(
    model: Any, threads: int, *, key: str = "", sizes: Sequence[int] = DEFAULT_SIZES,
    repeats: int = 3, cache_path: Path | None = None, say: Callable[[str], None] | None = None,
    contexts: bool = True, busy: Callable[[], bool] | None = None,
) -> CostCurve:
    """The model's cost curve with ``threads`` cores: read from ``cache_path`` when it was
    measured for the same ``key`` (``curve_key``), else measured (about 20-30 s; the
    context grids, ``contexts``, are about half of it) and written there.

    A curve measured while other jobs load the CPU (``busy``, default: the 1-min load)
    is wrong for good (2-thread steps stall on descheduled peers), so it is never written
    to ``cache_path``; it goes to a provisional file beside it instead, which stands in
    for ``PROVISIONAL_TTL`` seconds while the machine stays busy (without it every new
    engine in a loaded process measured again: a test run under load took 30 min longer).
    On a quiet machine the curve is measured again and cached for good."""
    is_busy = busy or machine_busy
    cached = read_curve(cache_path, key)
    if cached is not None and grid_agrees(cached):  # (else written before the check)
        return cached
    provisional = None if cache_path is None else cache_path.with_suffix(".busy.json")
    if provisional is not None and is_busy():
        stand_in = read_curve(provisional, key)
        age = time.time() - provisional.stat().st_mtime if stand_in is not None else 0.0
        if stand_in is not None and age < PROVISIONAL_TTL:
            if say:
                say(f"the machine is busy: using the cost curve measured while it was busy "
                    f"{age / 60:.0f} min ago (measured again once the machine is quiet)")
            return stand_in
    if say:
        say("measuring the verification cost curve of this model on this machine (once; "
            "about 25 s, then cached) ...")
    was_busy = is_busy()
    scratch = model.new_cache(1, REFERENCE_CONTEXT + max(sizes) + 1)
    times = forward_times(model, scratch, threads, sizes, cached=REFERENCE_CONTEXT,
                          repeats=repeats)
    per_seq = _per_seq_cost(model, threads, 8, 128, repeats)
    decode = prefill = None
    if contexts:
        # Draft-sized forwards are quick and the sizing compares neighbouring sizes, where
        # one unlucky median of 3 (a 12-row forward slower than a 16-row one) misleads.
        decode = measure_grid(model, threads, GRID_SIZES, GRID_CONTEXTS,
                              repeats=2 * repeats + 1)
        prefill = measure_grid(model, threads, PREFILL_SIZES, PREFILL_STARTS, logits="last",
                               repeats=repeats)
    curve = CostCurve(tuple(sorted(times)), tuple(times[k] for k in sorted(times)), per_seq, key,
                      decode, prefill)
    if was_busy or is_busy() or not grid_agrees(curve):
        if say:
            say("the machine is busy: the cost curve is used for now, not cached for good")
        if provisional is not None:
            write_curve(provisional, curve)
    elif cache_path is not None:
        write_curve(cache_path, curve)
        if provisional is not None:
            provisional.unlink(missing_ok=True)
    return curve


# How far the decode grid's forwards may be, as a median over the shared row counts, from
# the same forwards measured first at REFERENCE_CONTEXT: measured a few seconds apart on a
# quiet machine their ratio is 0.8-1.2 (eight curves of 2026-11-28); one curve measured
# while a test suite ran beside it had 2.0-3.7 and priced 6 rows as 1 (the planner then
# verified 10 rows a step at 1.4 accepted: 0.64-0.78x plain decoding). The load average
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
