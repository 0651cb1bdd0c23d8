"""A real mixture of experts (the tiny-qwen3moe shape, random weights, Q8_0): the
calibration counts the experts its forwards woke from the native forward's counters,
and an adaptive engine feeds its planner the experts each decode step woke (profiling
off: the forward counts them always), its tokens those of plain decoding."""

from __future__ import annotations

from pathlib import Path

from helpers import needs_model

from recallspec.cost import calibration as cc
from recallspec.cost.curve import CostCurve
from recallspec.cost.expert_counts import expert_shape
from recallspec.cost.plan import CalibrationPlan
from recallspec.decoding.sampling import SamplingParams


@needs_model
def test_a_mixture_counts_its_experts_and_the_engine_learns_its_routing(
        tmp_path: Path) -> None:
    from recallspec.bench.common.shapes import SHAPES
    from recallspec.bench.common.shapes_gguf import ensure_shape_gguf
    from recallspec.engine import Engine

    spec = SHAPES["tiny-qwen3moe"]
    gguf = ensure_shape_gguf(spec.name, "Q8_0", cache_dir=tmp_path, progress=lambda _m: None)
    engine = Engine.load(str(gguf), max_len=512, threads=1, repack_cache=False)
    model = engine.model
    shape = expert_shape(model)
    assert shape is not None
    e, used = spec.experts, spec.experts_used
    assert (shape.experts, shape.experts_used) == (e, used)
    assert shape.layers == model.config.num_layers and 0.0 < shape.expert_share < 1.0
    plan = CalibrationPlan(sizes=(1, 2, 4, 8), repeats=1, warmup=0, grid_contexts=(),
                           prefill_starts=())
    curve = cc.measure(model, 1, plan, key="t")
    assert curve.experts is not None
    counts = dict(curve.experts)
    assert sorted(counts) == [1, 2, 4, 8] and counts[1] == used
    assert all(counts[a] <= counts[b] for a, b in ((1, 2), (2, 4), (4, 8)))
    assert all(counts[k] <= min(e, k * used) for k in counts)
    # The same count again: the chains are the timed ones, fed the same context.
    assert cc.expert_counts(model, 1, (1, 2, 4, 8)) == curve.experts

    prompt = list(range(5, 25)) * 4  # repeats: the recalled drafts have something to copy
    params = SamplingParams(max_new_tokens=24)
    plain = engine.generate(prompt, params, drafter="none").token_ids
    engine.use_cost_curve(CostCurve(curve.tokens, curve.seconds, curve.per_seq, "t",
                                    experts=curve.experts))
    got = engine.generate(prompt, params, drafter="recycling")  # (adaptive: the default)
    assert got.token_ids == plain
    routing = engine.planner.routing
    assert routing is not None
    # Decode steps of k >= 2 rows were counted (Token Recycling always has a draft: at
    # least its probes verify one), and the estimate stays within its bounds.
    assert engine.stats.draft_nodes > 0 and routing.forwards > 0
    # Counted with profiling off throughout: no part of any forward was timed.
    assert model.native.profile()["total"] == 0.0
    for k in (2, 8, 32):
        assert used - 1e-9 <= routing.estimate(k) <= min(e, k * used) + 1e-9
