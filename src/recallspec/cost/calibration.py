"""Measuring a cost curve (``cost/curve.py``) on this machine, and caching it.

The timings: one forward of a chain of T new rows after a random cached prefix, with
the engine's thread set-up, median of a few repeats; over a grid of T (and of context
lengths, for the draft-sized decode grid and the prompt-chunk prefill grid), plus the
extra cost of each additional sequence in a batch (its own attention call and mask).
A mixture of experts' curve also counts the distinct experts its reference forwards
woke (``expert_counts``, ``CostCurve.experts``): what its prices hold for.

How many points, and how: ``cost/plan.py`` (a few forwards first price the full
plan; a model whose full plan would take minutes gets a thinner one within a budget).

The cache (``cost/cache.py``): a curve is stored per ``curve_key`` (model, dtype, thread
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

from recallspec.cost.cache import cached_curve, grid_agrees, machine_busy, write_curve
from recallspec.cost.curve import REFERENCE_CONTEXT, CostCurve, CostGrid
from recallspec.cost.expert_counts import WokenExperts
from recallspec.cost.plan import (
    CALIBRATION_BUDGET_S,
    COUNTED_ROWS,
    DEFAULT_SIZES,
    FEED_CHUNK,
    PER_SEQ,
    PER_SEQ_CACHED,
    PROBE_CONTEXT,
    PROBE_ROWS,
    CalibrationPlan,
    about,
    describe,
    full_plan,
    plan_calibration,
    plan_seconds,
)
from recallspec.kernels.linear import forward_threads
from recallspec.kernels.threads import decode_threads
from recallspec.runtime.batch import SequenceInput, build_batch

PROGRESS_EVERY_S = 5.0  # seconds between progress lines of a long measurement
# A tiled context (``fill_context``): the keys and values of some real rows, repeated.
Tile = tuple[torch.Tensor, torch.Tensor]  # k, v: [layers, kv_heads, rows, head_dim]
# Called between forwards, outside the timings: progress lines, and a background
# measurement's pause points (``cost/job.py``: the owner's work runs while it waits).
Tick = Callable[[], None]


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
    repeats: int = 3, warmup: int = 1, tile: Tile | None = None, tick: Tick | None = None,
) -> dict[int, float]:
    """Median seconds of one forward of a chain of T new rows (all rows' logits) after
    ``cached`` random tokens, for each T in ``sizes``, with the engine's thread set-up.
    Needs one free slot of ``cache`` with room for cached + max(sizes) positions."""
    grid = grid_times(model, cache, threads, sizes, (cached,), repeats=repeats, warmup=warmup,
                      tile=tile, tick=tick)
    return grid[cached]


def random_prefix(model: Any, cache: Any, slot: int, cached: int, extra: int,
                  tick: Tick | None = None, *, seed: int = 0) -> list[int]:
    """``cached + extra`` random token ids (``random_ids``, ``seed``) of which the first
    ``cached`` are fed into ``slot`` of ``cache`` and committed (FEED_CHUNK a forward): a
    context to time forwards after. The rest are for the forwards' own rows. Seed 0 is
    the calibration's own context; another seed gives another sequence's (the batched
    curve's, ``bench/scale/moe_batch.py``)."""
    ctx = random_ids(model, cached + extra, seed)
    with torch.inference_mode():
        for s in range(0, cached, FEED_CHUNK):
            toks = ctx[s : min(s + FEED_CHUNK, cached)]
            model(build_batch([SequenceInput(slot, s, toks, logits="none")]), cache)
            cache.commit(slot, s, range(len(toks)))
            if tick is not None:
                tick()
    return ctx


def random_ids(model: Any, n: int, seed: int = 0) -> list[int]:
    """``n`` token ids drawn uniformly from the model's vocabulary by a torch generator
    seeded with ``seed``: the same ids for the same (vocabulary, n, seed), so a test can
    rebuild the chains a measurement ran."""
    g = torch.Generator().manual_seed(seed)
    ids: list[int] = torch.randint(0, int(model.config.vocab_size), (n,), generator=g).tolist()
    return ids


def fill_context(model: Any, cache: Any, slot: int, cached: int, extra: int,
                 tile: Tile | None, tick: Tick | None = None, *, seed: int = 0) -> list[int]:
    """``random_prefix``, or with a ``tile`` its rows repeated into the freshly allocated
    ``slot`` up to ``cached`` rows, without a forward: attention reads and multiplies
    as many keys and values whatever they hold (feeding 2,048 tokens takes a minute at
    8B). Returns the token ids (``random_ids``, ``seed``; the rows past ``cached``: the
    forwards' own)."""
    if tile is None:
        return random_prefix(model, cache, slot, cached, extra, tick, seed=seed)
    k, v = tile
    reps = -(-cached // k.shape[2])
    cache.load(slot, k.repeat(1, 1, reps, 1), v.repeat(1, 1, reps, 1), cached)
    return random_ids(model, cached + extra, seed)


def grid_times(
    model: Any, cache: Any, threads: int, sizes: Sequence[int], contexts: Sequence[int], *,
    logits: str = "all", repeats: int = 3, warmup: int = 1, tile: Tile | None = None,
    tick: Tick | None = None,
) -> dict[int, dict[int, float]]:
    """{context: {T: median seconds}} of one forward of a chain of T new rows after
    ``context`` cached random tokens (``logits``: the rows whose logits it computes, as
    ``SequenceInput``). Needs one free slot of ``cache`` with room for max(contexts) +
    max(sizes) positions. The prefix is fed once (or tiled: ``fill_context``), up to
    the largest context: a forward at a smaller one overwrites some of its entries with
    other tokens, which changes no timing."""
    slot = cache.allocate()
    out: dict[int, dict[int, float]] = {}
    try:
        ctx = fill_context(model, cache, slot, max(contexts), max(sizes), tile, tick)
        with torch.inference_mode():
            for c in contexts:
                # Rows past the context are scratch: never committed, overwritten.
                metas = {k: build_batch([SequenceInput(slot, c, ctx[c : c + k], logits=logits)])
                         for k in sizes}
                out[c] = monotone_in_rows(interleaved_times(
                    {k: timed_forward(model, cache, m, threads) for k, m in metas.items()},
                    repeats, warmup, tick))
    finally:
        cache.release(slot)
    return out


def timed_forward(model: Any, cache: Any, meta: Any, threads: int) -> Callable[[], Any]:
    """A call of one forward of ``meta`` (a ``build_batch`` batch) into ``cache``, with
    the engine's thread set-up for ``threads`` cores (``decode_threads``,
    ``forward_threads``): what every timing here times, and what another measurement of
    forwards times to compare with them (``bench/scale/moe_batch.py``). The caller holds
    ``torch.inference_mode`` and keeps the batch's slots allocated."""
    def run() -> Any:
        with decode_threads(threads), forward_threads(meta.num_tokens, threads):
            return model(meta, cache)
    return run


def interleaved_times(
    fns: dict[int, Callable[[], Any]], repeats: int, warmup: int = 1, tick: Tick | None = None,
) -> dict[int, float]:
    """Median seconds of each function, timed in rounds that call every function once
    (sizes in order), not one size's repeats after another: a shared VM's speed drifts
    within seconds, and timed in blocks that drift made a 2-row forward look cheaper
    than a 1-row one in some cached curves (the sizing then drafted a node a step for a
    small chance of a token). Within a round, neighbouring sizes run milliseconds apart,
    so the drift cancels from the comparisons the sizing makes.
    ``tick``: called after each forward, outside the timings."""
    for _ in range(warmup):
        for f in fns.values():
            f()
            if tick is not None:
                tick()
    ts: dict[int, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            ts[k].append(time.perf_counter() - t0)
            if tick is not None:
                tick()
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
    logits: str = "all", repeats: int = 3, warmup: int = 1, tile: Tile | None = None,
    tick: Tick | None = None,
) -> CostGrid | None:
    """A ``CostGrid`` over the contexts that fit the model's positions (None if none)."""
    limit = int(getattr(model.config, "max_position", 0) or 0)
    fit = tuple(c for c in contexts if not limit or c + max(sizes) <= limit)
    if not fit:
        return None
    cache = model.new_cache(1, max(fit) + max(sizes) + 1)
    t = grid_times(model, cache, threads, sizes, fit, logits=logits, repeats=repeats,
                   warmup=warmup, tile=tile, tick=tick)
    return CostGrid(tuple(sizes), fit, tuple(tuple(t[c][k] for k in sizes) for c in fit))


def per_seq_cost(model: Any, threads: int, seqs: int, cached: int, repeats: int, *,
                 warmup: int = 1, tile: Tile | None = None, tick: Tick | None = None,
                 ) -> float:
    """Seconds each sequence past the first adds to a batched forward
    (``CostCurve.per_seq``): (t(seqs sequences x 1 row) - t(1 sequence x seqs rows)) /
    (seqs - 1), 0 at least, timed in ``interleaved_times`` rounds. Each sequence holds the
    same ``cached`` random tokens (``fill_context``, seed 1: fed, or tiled from ``tile``)
    in its own slot of a cache made here, so the two forwards differ in their attention
    calls and masks only (the one sequence's rows are its first ``seqs`` tokens again)."""
    cache = model.new_cache(seqs, cached + seqs + 1)
    slots = [cache.allocate() for _ in range(seqs)]
    with torch.inference_mode():
        for s in slots:
            ids = fill_context(model, cache, s, cached, 0, tile, tick, seed=1)  # (each alike)
        many = build_batch([SequenceInput(s, cached, [ids[0]]) for s in slots])
        one = build_batch([SequenceInput(slots[0], cached, ids[:seqs])])
        t = interleaved_times({0: timed_forward(model, cache, many, threads),
                               1: timed_forward(model, cache, one, threads)}, repeats, warmup,
                              tick)
        t_many, t_one = t[0], t[1]
    return max(t_many - t_one, 0.0) / (seqs - 1)


def probe(model: Any, threads: int, tick: Tick | None = None) -> tuple[CostGrid, Tile]:
    """What a forward costs, roughly, and rows to tile contexts from: a 1-row forward
    (untimed: the first after loading faults the weights in), PROBE_ROWS rows fed at
    position 0 (timed, then committed: their keys and values are the tile), then 1 row
    at 0 and 1 and PROBE_ROWS rows after PROBE_CONTEXT tiled rows, once each (a few
    seconds at 8B; a model of fewer positions: after as many as fit). The grid is made
    non-decreasing in rows and in contexts. ``tick``: after each forward."""
    limit = int(getattr(model.config, "max_position", 0) or 0)
    far_ctx = PROBE_CONTEXT if not limit else max(min(PROBE_CONTEXT, limit - PROBE_ROWS), 1)
    cache = model.new_cache(1, far_ctx + PROBE_ROWS + 1)
    slot = cache.allocate()
    ids = random_ids(model, PROBE_ROWS)

    def seconds(rows: int, context: int) -> float:
        run = timed_forward(model, cache,
                            build_batch([SequenceInput(slot, context, ids[:rows])]), threads)
        t0 = time.perf_counter()
        run()
        t = time.perf_counter() - t0
        if tick is not None:
            tick()
        return t

    try:
        with torch.inference_mode():
            seconds(1, 0)
            fed = seconds(PROBE_ROWS, 0)
            cache.commit(slot, 0, range(PROBE_ROWS))
            tile = cache.rows(slot, PROBE_ROWS)
            cache.rollback(slot, 0)
            fill_context(model, cache, slot, far_ctx, 0, tile)
            one, one_far, many_far = (seconds(1, 0), seconds(1, far_ctx),
                                      seconds(PROBE_ROWS, far_ctx))
    finally:
        cache.release(slot)
    many = max(fed, one)
    far = (max(one_far, one), max(many_far, one_far, many))
    return CostGrid((1, PROBE_ROWS), (0, far_ctx), ((one, many), far)), tile


def calibrate(
    model: Any, threads: int, *, key: str = "", sizes: Sequence[int] = DEFAULT_SIZES,
    repeats: int = 3, cache_path: Path | None = None, say: Callable[[str], None] | None = None,
    contexts: bool = True, busy: Callable[[], bool] | None = None,
    budget_s: float | None = CALIBRATION_BUDGET_S, pause: Tick | None = None,
    on_probe: Callable[[CostGrid], None] | None = None,
) -> CostCurve:
    """The model's cost curve with ``threads`` cores: read from ``cache_path`` when it was
    measured for the same ``key`` (``curve_key``), else measured and written there.
    ``sizes``, ``repeats`` and ``contexts`` (the decode and prefill grids) make the full
    plan, measured as it is when the probe prices it under FULL_PLAN_S, else thinned to
    ``budget_s`` seconds (None: never; ``cost/plan.py``).
    ``say`` hears the plan and its expected time, then progress every PROGRESS_EVERY_S
    (not with ``pause``).
    ``pause``: called between forwards, outside the timings (a background measurement
    hands the CPU back there: ``cost/job.py``); ``on_probe``: hears the probe's prices.

    A curve measured while other jobs load the CPU (``busy``, default: the 1-min load)
    is wrong for good (2-thread steps stall on descheduled peers), so it is never written
    to ``cache_path``; it goes to a provisional file beside it instead, which stands in
    for ``PROVISIONAL_TTL`` seconds while the machine stays busy (without it every new
    engine in a loaded process measured again, and a test run under load took far longer).
    On a quiet machine the curve is measured again and cached for good."""
    is_busy = busy or machine_busy
    known = cached_curve(cache_path, key, is_busy, say)
    if known is not None:
        return known
    provisional = None if cache_path is None else cache_path.with_suffix(".busy.json")
    was_busy = is_busy()
    prices, tile = probe(model, threads, pause)
    if on_probe is not None:
        on_probe(prices)
    full = full_plan(tuple(sizes), repeats, contexts)
    experts = WokenExperts.of(model) is not None  # (``measure`` counts them too)
    plan = plan_calibration(prices, budget_s, full, experts=experts)
    expected = plan_seconds(plan, prices, experts=experts)
    if say:
        thinned = "" if plan == full else f"; thinned to a {budget_s:.0f} s budget"
        say(f"measuring the verification cost curve of this model on this machine (once, "
            f"then cached; {describe(plan)}{thinned}): {about(expected)} ...")
    # (Paused measurements report no progress: their wall time is mostly the owner's.)
    tick = _ticks(_Progress(say, expected) if say and pause is None else None, pause)
    curve = measure(model, threads, plan, key=key, tile=tile, tick=tick)
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


def _ticks(*ticks: Tick | None) -> Tick | None:
    """One tick calling each given one in turn (None: none given)."""
    given = [t for t in ticks if t is not None]
    if len(given) <= 1:
        return given[0] if given else None

    def both() -> None:
        for t in given:
            t()
    return both


def measure(model: Any, threads: int, plan: CalibrationPlan, *, key: str = "",
            tile: Tile | None = None, tick: Tick | None = None) -> CostCurve:
    """The cost curve of ``plan``'s points, its contexts fed or (``plan.fed`` False)
    tiled from ``tile`` (the probe's)."""
    if plan.fed:
        tile = None
    elif tile is None:
        raise ValueError("a plan of tiled contexts needs the rows to tile")
    sizes, w = plan.sizes, plan.warmup
    scratch = model.new_cache(1, REFERENCE_CONTEXT + max(sizes) + 1)
    times = forward_times(model, scratch, threads, sizes, cached=REFERENCE_CONTEXT,
                          repeats=plan.repeats, warmup=w, tile=tile, tick=tick)
    per_seq = per_seq_cost(model, threads, PER_SEQ, PER_SEQ_CACHED, plan.repeats, warmup=w,
                           tile=tile, tick=tick)
    experts = expert_counts(model, threads, sizes, cached=REFERENCE_CONTEXT, tile=tile,
                            tick=tick)
    decode = prefill = None
    if plan.grid_contexts:
        decode = measure_grid(model, threads, plan.grid_sizes, plan.grid_contexts,
                              repeats=plan.grid_repeats, warmup=w, tile=tile, tick=tick)
    if plan.prefill_starts:
        prefill = measure_grid(model, threads, plan.prefill_sizes, plan.prefill_starts,
                               logits="last", repeats=plan.repeats, warmup=w, tile=tile,
                               tick=tick)
    return CostCurve(tuple(sorted(times)), tuple(times[k] for k in sorted(times)), per_seq, key,
                     decode, prefill, experts)


def expert_counts(
    model: Any, threads: int, sizes: Sequence[int], *, cached: int = REFERENCE_CONTEXT,
    tile: Tile | None = None, tick: Tick | None = None, up_to: int = COUNTED_ROWS,
    samples: int = 1,
) -> tuple[tuple[int, float], ...] | None:
    """(k, distinct experts per layer) that one forward of a chain of k rows after
    ``cached`` tokens woke, the mean over ``samples`` chains, for each k of ``sizes`` up
    to ``up_to``, untimed. The chains are of the same random tokens (seed 0, ``cached``
    + max(sizes) x ``samples`` drawn, the first ``cached`` the context): the s-th of k
    rows is tokens cached + s k to cached + (s + 1) k, so with one sample it is the chain
    ``forward_times`` timed for ``sizes`` (as many drawn, the same context). None: not a
    mixture of experts with the native forward's counters, or a count did not come back
    whole."""
    if samples < 1:
        raise ValueError("expert_counts needs samples >= 1")
    counter = WokenExperts.of(model)
    counted = sorted(k for k in set(sizes) if k <= up_to)
    if counter is None or not counted:
        return None
    extra = max(sizes) * samples
    cache = model.new_cache(1, cached + extra + 1)
    slot = cache.allocate()
    out: list[tuple[int, float]] = []
    try:
        ids = fill_context(model, cache, slot, cached, extra, tile, tick)
        with torch.inference_mode():
            for k in counted:
                woken = 0.0
                for s in range(samples):
                    chain = ids[cached + s * k : cached + (s + 1) * k]
                    timed_forward(model, cache,
                                  build_batch([SequenceInput(slot, cached, chain)]), threads)()
                    n = counter.last(k)
                    if n is None:
                        return None
                    woken += n
                    if tick is not None:
                        tick()
                out.append((k, woken / samples))
    finally:
        cache.release(slot)
    return tuple(out)


class _Progress:
    """A ``Tick`` that says how far a measurement is, every PROGRESS_EVERY_S seconds (as
    a share of the expected time: the rounds' sizes differ, their time is what shows)."""

    def __init__(self, say: Callable[[str], None], expected_s: float) -> None:
        self.say, self.expected = say, max(expected_s, 1e-9)
        self.start = self.last = time.perf_counter()

    def __call__(self) -> None:
        now = time.perf_counter()
        if now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        done = now - self.start
        share = min(done / self.expected, 0.99)
        left = max(self.expected - done, 0.0)
        self.say(f"cost curve: {share:.0%} measured ({done:.0f} s; {about(left)} left)")
