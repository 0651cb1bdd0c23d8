"""The native forward's account of a mixture of experts' work (``NativeModel.profile``,
``last_experts``), counted with profiling off: each expert chosen in a layer runs once
per forward for all the rows that chose it, so one row wakes exactly experts_per_token
experts a layer, and k rows wake at most k times as many (fewer where their choices
overlap), never more than there are experts."""

from __future__ import annotations

import random

from helpers.conformance import built

from recallspec.models import load_model
from recallspec.runtime.batch import SequenceInput, build_batch


def test_expert_runs_counted_per_forward() -> None:
    model, _ = load_model(built("qwen3-moe").f32_gguf, dtype="auto", repack_cache=False)
    c, native = model.config, model.native
    assert native is not None and c.moe
    rng = random.Random(3)
    cache = model.new_cache(1, 256)
    prompt = [rng.randrange(3, c.vocab_size) for _ in range(40)]
    model.forward(build_batch([SequenceInput(0, 0, prompt, logits="last")]), cache)
    assert native.last_experts()[1] == c.num_layers * len(prompt)
    native.set_profiling(False)
    for k in (1, 2, 4, 8):
        native.profile(reset=True)
        rows = [rng.randrange(3, c.vocab_size) for _ in range(k)]
        model.forward(build_batch([SequenceInput(0, len(prompt), rows, logits="all")]), cache)
        p = native.profile(reset=True)
        assert p["calls"] == 1 and p["total"] == 0.0
        assert native.last_experts() == (p["expert_runs"], p["expert_rows"])
        assert p["expert_rows"] == c.num_layers * k
        runs = p["expert_runs"]
        lo = c.num_layers * c.experts_per_token
        hi = c.num_layers * min(c.num_experts, k * c.experts_per_token)
        assert lo <= runs <= hi, (k, runs)
        if k == 1:
            assert runs == lo
