"""The batched curve's contexts (``bench/scale/moe_batch.batched_curve``): sequence i's
slot holds the ``cached`` tokens of seed i, fed as the calibration feeds its own
(``cost/calibration.random_prefix``; seed 0: the one-sequence curve's context), on a
dense bigram model that writes each row's token id into its cache row. No timing is
asserted."""

from __future__ import annotations

import torch
from helpers import BigramModel

from recallspec.bench.scale.moe_batch import BatchPlan, batched_curve
from recallspec.cost.calibration import random_ids


def test_each_sequence_holds_its_own_seeds_context() -> None:
    model = BigramModel(torch.eye(97), max_position=4096)
    plan = BatchPlan(seqs=(1, 2, 4), ks=(1, 2), cached=20, repeats=1, samples=2, warmup=0)
    out = batched_curve(model, 1, plan)
    assert [(p["seqs"], p["k"]) for p in out["points"]] == plan.points()
    cache = model.caches[0]  # (the batched forwards'; then per_seq_cost's own)
    held = set()
    for slot in range(max(plan.seqs)):
        k, _ = cache.rows(slot, plan.cached)
        held.add(tuple(int(x) for x in k[0, 0, :, 0].tolist()))
    drawn = plan.cached + plan.samples * max(*plan.ks, *plan.rows())  # (context + chains)
    want = {tuple(random_ids(model, drawn, seed)[: plan.cached])
            for seed in range(max(plan.seqs))}
    assert held == want and len(want) == max(plan.seqs)
