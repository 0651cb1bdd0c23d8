"""What ``calibration.calibrate`` (``cost/calibration.py``) measures, chosen to fit a
time budget.

A cost curve (``cost/curve.py``) is measured once per model and machine, before the
engine serves cost-aware drafting. The full plan (``full_plan``) is sized in rows, not
seconds: quick on a small model, it kept ``recallspec serve`` from answering for minutes
at 1.7B and would take many times longer at 8B. So ``calibrate`` first times a few
forwards (``probe``: a 2 x 2 ``CostGrid`` of 1 and PROBE_ROWS rows at 0 and
PROBE_CONTEXT cached tokens, which prices any forward by its bilinear extrapolation),
and ``plan_calibration`` picks the plan from those prices:

* the full plan when its estimate is at most FULL_PLAN_S: the curves of small models
  (those of every benchmark so far) stay exactly what they were;
* else the first plan of the ladder ``THINNING`` whose estimate fits the budget
  (CALIBRATION_BUDGET_S), the last one when none does.

Invariant of every plan (the ladder's last rung included), what the engine and the
bench replay read: a decode grid covers REQUIRED_ROWS (1..16: the draft sizes the sizing
compares) and 32 rows (a few sequences' drafts) at >= 2 contexts, 128 among them (for
``grid_agrees``); the reference forwards cover 1, 2, 4, 8, 16 rows (all REQUIRED_ROWS
when there is no decode grid) and 64 (the slope past the grid); a prefill grid has >= 2
sizes at >= 2 starts. Every rung measures less than the one before. This module runs
no model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

from recallspec.cost.curve import REFERENCE_CONTEXT, CostGrid

DEFAULT_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
# Draft-sized forwards x context lengths (a draft is at most a few dozen rows).
GRID_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
GRID_CONTEXTS = (128, 512, 1024, 2048)
# Prompt chunks (the engine's prefill_chunk is 512) x the position they start at.
PREFILL_SIZES = (32, 128, 256, 512)
PREFILL_STARTS = (0, 512, 1024, 1536)
# The per-sequence cost: a batch of PER_SEQ sequences of PER_SEQ_CACHED cached tokens.
PER_SEQ, PER_SEQ_CACHED = 8, 128
FEED_CHUNK = 256  # tokens a fed context is fed in per forward (``random_prefix``)
# A mixture of experts' woken experts are counted (``calibration.expert_counts``: one
# untimed forward a size, after a context of its own) at the reference sizes up to this
# many rows (draft-sized forwards and small batches of them; larger ones are priced at
# the share of uniform routing the largest counted one woke: ``cost/experts.py``).
COUNTED_ROWS = 64

# Rows the draft sizing compares (a draft is at most MAX_DRAFT_NODES = 16 nodes): every
# plan measures them at each context of its decode grid (without a grid: in the
# reference forwards, which price the draft sizes then).
REQUIRED_ROWS = (1, 2, 3, 4, 6, 8, 12, 16)
# Seconds a thinned plan may take: a server answers its first request after the model
# loads and this; it still measures the required points at 8B with one repeat, and at
# 1.7B with three.
CALIBRATION_BUDGET_S = 20.0
# The full plan's estimate up to which it runs unchanged: well above a small model's
# full plan, so that a busy moment during the probe does not thin its curve.
FULL_PLAN_S = 60.0
# The probe: forwards of 1 and PROBE_ROWS rows at 0 and PROBE_CONTEXT cached tokens
# (attention's cost is linear in the context). A forward's cost is about linear in its
# rows beyond a few; extrapolated from 1 and 32 rows, a 512-row chunk's price is only
# roughly its time at 1.7B and 8B: a guide to choosing a plan, not a curve.
PROBE_ROWS, PROBE_CONTEXT = 32, 1024


@dataclass(frozen=True)
class CalibrationPlan:
    """The points of a cost curve to measure, and how. Empty ``grid_contexts`` /
    ``prefill_starts``: no decode / prefill grid."""

    sizes: tuple[int, ...] = DEFAULT_SIZES  # [K] reference rows at REFERENCE_CONTEXT
    repeats: int = 3  # timed rounds of the reference, prefill and per-sequence forwards
    grid_sizes: tuple[int, ...] = GRID_SIZES  # [G] decode grid rows
    grid_contexts: tuple[int, ...] = GRID_CONTEXTS  # [C] its cached tokens
    # The sizing compares neighbouring sizes, where one unlucky median of 3 (a 12-row
    # forward slower than a 16-row one) misleads: more rounds (draft-sized forwards are
    # quick on small models).
    grid_repeats: int = 7
    prefill_sizes: tuple[int, ...] = PREFILL_SIZES  # [P] prompt chunk rows
    prefill_starts: tuple[int, ...] = PREFILL_STARTS  # [S] their start positions
    warmup: int = 1  # untimed rounds before each context's timed ones
    # True: every context is fed through the model (random tokens, FEED_CHUNK a
    # forward); False: the probe's keys and values are tiled to its length (attention
    # costs the same over any values; at 8B feeding 2,048 tokens takes a minute).
    fed: bool = True

    def __post_init__(self) -> None:
        if not self.sizes or self.sizes[0] != 1:
            raise ValueError("a calibration plan's reference sizes start at 1 row")
        for xs in (self.sizes, self.grid_sizes, self.grid_contexts, self.prefill_sizes,
                   self.prefill_starts):
            if any(b <= a for a, b in pairwise(xs)):
                raise ValueError("a calibration plan's sizes and contexts must increase")
        if (self.grid_contexts and not self.grid_sizes) or \
                (self.prefill_starts and not self.prefill_sizes):
            raise ValueError("a calibration plan's grid needs sizes")
        if min(self.repeats, self.grid_repeats) < 1 or self.warmup < 0:
            raise ValueError("a calibration plan needs >= 1 timed round, >= 0 warmup")


def full_plan(sizes: tuple[int, ...] = DEFAULT_SIZES, repeats: int = 3,
              contexts: bool = True) -> CalibrationPlan:
    """The plan every curve had before budgets (``calibrate``'s parameters)."""
    return CalibrationPlan(sizes, repeats, grid_repeats=2 * repeats + 1,
                           grid_contexts=GRID_CONTEXTS if contexts else (),
                           prefill_starts=PREFILL_STARTS if contexts else ())


_SMALL = REQUIRED_ROWS
# The ladder, thinned from the first rung down while a plan misses the budget; each rung
# keeps the earlier rungs' changes (the names say what it gives up). Its order is what
# is given up first: work that buys no point (feeding contexts, warmup rounds), the
# decode grid's extra repeats, most prompt chunks (only the bench replay reads the
# prefill grid) and prefill-sized reference forwards (their cost is linear in rows: a
# few points give the slope); then in turn decode sizes past 32 rows and contexts
# (attention is linear in the context), reference and prompt-chunk sizes; last the
# decode grid's repeats (the sizing compares its neighbouring sizes). REQUIRED_ROWS,
# 32 rows (past the grid, rows are priced at the reference context) and two of each
# grid's axes stay.
THINNING: tuple[tuple[str, dict[str, Any]], ...] = (
    ("contexts tiled, not fed", {"fed": False}),
    ("no warmup rounds", {"warmup": 0}),
    ("decode grid: 3 repeats", {"grid_repeats": 3}),
    ("prefill grid: 128, 512 rows at 0, 1024", {"prefill_sizes": (128, 512),
                                                 "prefill_starts": (0, 1024)}),
    ("reference: 1..64, 128, 256, 512 rows", {"sizes": (*_SMALL, 24, 32, 48, 64, 128, 256,
                                                        512)}),
    ("one repeat outside the decode grid", {"repeats": 1}),
    ("decode grid: 1..16, 32 rows at 128, 1024, 2048", {"grid_sizes": (*_SMALL, 32),
                                                        "grid_contexts": (128, 1024, 2048)}),
    ("reference: 1..16, 32, 64, 256 rows", {"sizes": (*_SMALL, 32, 64, 256)}),
    ("prefill grid: 32, 128 rows", {"prefill_sizes": (32, 128)}),
    ("decode grid: contexts 128, 2048", {"grid_contexts": (128, 2048)}),
    # (With a decode grid, it prices the draft sizes at every context; without one the
    # reference keeps REQUIRED_ROWS.)
    ("reference: 1, 2, 4, 8, 16, 64 rows", {"sizes": (1, 2, 4, 8, 16, 64)}),
    ("prefill grid: 8, 32 rows", {"prefill_sizes": (8, 32)}),
    ("decode grid: 1 repeat", {"grid_repeats": 1}),
)


def ladder(full: CalibrationPlan) -> list[CalibrationPlan]:
    """``full`` and its thinned rungs, in order (a plan without a grid stays without; a
    rung that changes nothing then is left out)."""
    plans = [full]
    for _, change in THINNING:
        if not full.grid_contexts:
            change = {k: v for k, v in change.items() if not k.startswith("grid_")}
        if not full.prefill_starts:
            change = {k: v for k, v in change.items() if not k.startswith("prefill_")}
        if not full.grid_contexts and "sizes" in change:
            change = change | {"sizes": tuple(sorted({*change["sizes"], *REQUIRED_ROWS}))}
        plan = replace(plans[-1], **change)
        if plan != plans[-1]:
            plans.append(plan)
    return plans


def plan_calibration(prices: CostGrid, budget_s: float | None = CALIBRATION_BUDGET_S,
                     full: CalibrationPlan | None = None, *,
                     experts: bool = False) -> CalibrationPlan:
    """The plan to measure, given the probe's ``prices`` (seconds of a forward of r rows
    after c cached tokens: ``prices(r, c)``): ``full`` (default ``full_plan()``) when
    its estimate is at most FULL_PLAN_S or ``budget_s`` (None: no budget), else the
    first rung of its ladder whose estimate is at most ``budget_s``, else the last
    (``experts``: as ``plan_seconds``)."""
    full = full or full_plan()
    if budget_s is None or plan_seconds(full, prices, experts=experts) <= max(budget_s,
                                                                              FULL_PLAN_S):
        return full
    rungs = ladder(full)[1:]
    return next((p for p in rungs if plan_seconds(p, prices, experts=experts) <= budget_s),
                rungs[-1])


def plan_seconds(plan: CalibrationPlan, prices: CostGrid, *, experts: bool = False) -> float:
    """Estimated seconds to measure ``plan``, each forward priced by ``prices``
    (attention grows with the cached context and the rows; the probe has both).
    ``experts``: a mixture of experts, whose measurement also counts the experts its
    reference sizes up to COUNTED_ROWS wake (their own context and one forward each)."""

    def rounds(sizes: tuple[int, ...], contexts: tuple[int, ...], repeats: int) -> float:
        n = plan.warmup + repeats
        return n * sum(prices(k, c) for c in contexts for k in sizes)

    def fill(tokens: int) -> float:
        if not plan.fed:
            return 0.0  # (a copy of keys and values: milliseconds)
        return sum(prices(min(FEED_CHUNK, tokens - s), s) for s in range(0, tokens, FEED_CHUNK))

    t = fill(REFERENCE_CONTEXT) + rounds(plan.sizes, (REFERENCE_CONTEXT,), plan.repeats)
    # Per sequence: PER_SEQ sequences of 1 row against one of PER_SEQ rows, alike in cost.
    t += PER_SEQ * fill(PER_SEQ_CACHED) + 2 * rounds((PER_SEQ,), (PER_SEQ_CACHED,),
                                                      plan.repeats)
    if plan.grid_contexts:
        t += fill(max(plan.grid_contexts))
        t += rounds(plan.grid_sizes, plan.grid_contexts, plan.grid_repeats)
    if plan.prefill_starts:
        t += fill(max(plan.prefill_starts))
        t += rounds(plan.prefill_sizes, plan.prefill_starts, plan.repeats)
    counted = tuple(k for k in plan.sizes if k <= COUNTED_ROWS)
    if experts and counted:
        t += fill(REFERENCE_CONTEXT) + sum(prices(k, REFERENCE_CONTEXT) for k in counted)
    return t


def describe(plan: CalibrationPlan) -> str:
    """The plan's points in a few words (for the log)."""
    parts = [f"{len(plan.sizes)} sizes x {plan.repeats}"]
    if plan.grid_contexts:
        parts.append(f"decode {len(plan.grid_sizes)} x {len(plan.grid_contexts)} contexts "
                     f"x {plan.grid_repeats}")
    if plan.prefill_starts:
        parts.append(f"prefill {len(plan.prefill_sizes)} x {len(plan.prefill_starts)}")
    return ", ".join(parts)


def about(seconds: float) -> str:
    """``seconds`` as a wait: "about 25 s", "about 4 min"."""
    if seconds < 90:
        return f"about {max(math.ceil(seconds), 1)} s"
    return f"about {seconds / 60:.0f} min"
