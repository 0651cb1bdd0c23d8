"""Batched speculative decoding (EMS-SD) on the real model: every batch layout (the
engine's unpadded one and EMS-SD's padded baselines, a benchmark ablation installed from
``bench/suite/padded_layouts.py``), every batch size and both drafter families commit exactly
single-sequence AR's tokens, with sequences of different prompt lengths joining and
leaving the batch mid-run."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from recallspec.bench.suite.padded_layouts import LAYOUTS, padded_layout
from recallspec.decoding.sampling import SamplingParams
from recallspec.engine import Engine, EngineConfig, GenerationResult
from recallspec.errors import ResourceError
from recallspec.runtime.batch import SequenceInput, build_batch

# Different budgets make sequences leave at different steps (and waiting ones join).
BUDGETS = (16, 6, 12, 3, 10, 8, 16, 6, 12)


@pytest.fixture(scope="module")
def batch_case(
    engine: Any, spec_bench_prompts: list[str]
) -> tuple[list[list[int]], list[Any], list[GenerationResult]]:
    # Prompts from all six categories, so lengths differ (tens to hundreds of tokens).
    prompts = [engine.encode_prompt(p, chat=True) for p in spec_bench_prompts[::2][: len(BUDGETS)]]
    assert len({len(p) for p in prompts}) > 5
    params = [SamplingParams(max_new_tokens=n) for n in BUDGETS]
    single = [engine.generate(p, sp) for p, sp in zip(prompts, params, strict=True)]
    return prompts, params, single


def _mode(mode: str) -> tuple[str, str]:
    """A mode of the comparison as (batch layout, sizing): a layout at fixed sizes, or
    "adaptive" (cost-aware sizing on the engine's own ems layout)."""
    return ("ems", "adaptive") if mode == "adaptive" else (mode, "fixed")


def _engine(engine: Any, bs: int) -> Engine:
    # Shares the loaded weights and the cost curve (measured once per session: on a busy
    # machine a measured curve is not cached on disk, and every new engine would measure
    # it again); only the KV cache (and batch size) is new.
    eng = Engine(engine.model, engine.tokenizer, EngineConfig(max_batch_size=bs))
    eng.use_cost_curve(engine.cost_curve())
    return eng


@pytest.mark.parametrize("bs", [1, 3, 8])
def test_every_mode_identical_to_single_ar(engine: Any, batch_case: Any, bs: int) -> None:
    prompts, params, single = batch_case
    eng = _engine(engine, bs)
    # With one sequence there is nothing to pad: the padded layouts equal ems there.
    # ("adaptive": cost-aware sizing on the ems layout; the layouts size fixed.)
    for mode in (*LAYOUTS, "adaptive") if bs > 1 else ("ems", "adaptive"):
        layout, sizing = _mode(mode)
        with padded_layout(eng, layout) as pad:
            got = eng.generate(prompts, params, drafter="llma", mode=sizing)
        bad = [i for i, (s, g) in enumerate(zip(single, got, strict=True))
               if g.token_ids != s.token_ids]
        assert not bad, (mode, bs, bad)
        st = eng.stats
        assert st.new_tokens == sum(len(g.token_ids) for g in got) - len(got) + sum(
            g.finish_reason == "eos" for g in got)
        if mode in ("vanilla", "unpad-kv") and bs > 1:
            assert pad.rows > 0  # the padded layouts really padded
        if mode in ("vanilla", "unpad-input") and bs > 1:
            assert pad.kv_entries > 0
        if mode in ("ems", "adaptive", "unpad-input"):
            assert pad.rows == 0


@pytest.mark.parametrize("mode", ["ems", "vanilla", "adaptive"])
def test_batched_draft_model_identical(engine: Any, batch_case: Any, mode: str) -> None:
    prompts, params, single = batch_case
    eng = _engine(engine, 3)
    layout, sizing = _mode(mode)
    with padded_layout(eng, layout):
        got = eng.generate(prompts[:5], params[:5], drafter="draft-model",
                           drafter_options={"layers": 8, "gamma": 4}, mode=sizing)
    assert [g.token_ids for g in got] == [s.token_ids for s in single[:5]]
    assert eng.stats.draft_nodes > 0


def test_padding_kv_entries_are_invisible(engine: Any) -> None:
    """A slot whose cached prefix holds padding entries gives the same logits as a slot
    holding the same real tokens without them (masking and logical positions)."""
    ids = engine.encode_prompt("The quick brown fox jumps over the lazy dog.", chat=False)
    model = engine.model
    cache = model.new_cache(2, 128)
    a, b = cache.allocate(), cache.allocate()
    with torch.inference_mode():
        model(build_batch([SequenceInput(a, 0, ids[:-1], logits="none")]), cache)
        cache.commit(a, 0, range(len(ids) - 1))
        # Slot b: the same tokens in three pieces with padding entries between them.
        half = (len(ids) - 1) // 2
        for lo, hi in ((0, half), (half, len(ids) - 1)):
            model(build_batch([SequenceInput(
                b, cache.length(b), ids[lo:hi], logits="none",
                cache_valid=cache.valid_prefix(b), start_pos=cache.logical_length(b))]), cache)
            cache.commit(b, cache.length(b), range(hi - lo))
            cache.pad(b, 3)
        assert cache.logical_length(b) == len(ids) - 1 and cache.length(b) == len(ids) + 5
        want = model(build_batch([SequenceInput(a, len(ids) - 1, ids[-1:])]), cache)
        got = model(build_batch([SequenceInput(
            b, cache.length(b), ids[-1:], cache_valid=cache.valid_prefix(b),
            start_pos=cache.logical_length(b))]), cache)
    assert torch.allclose(want, got, atol=1e-4)
    assert int(want.argmax()) == int(got.argmax())


def test_batch_larger_than_memory_serves_and_one_beyond_address_space_is_refused(
        engine: Any) -> None:
    # 256 slots x 4,096 positions: about 48 GB of float32 KV if reserved, more than this
    # machine has; memory is taken as rows are written, admission keeps within a budget.
    eng = Engine(engine.model, engine.tokenizer, EngineConfig(max_batch_size=256))
    eng.use_cost_curve(engine.cost_curve())
    assert eng.scheduler.kv_budget < 256 * eng.max_len
    ids = eng.encode_prompt("Name three rivers in Europe.", chat=True)
    p = SamplingParams(max_new_tokens=8)
    assert eng.generate(ids, p).token_ids == engine.generate(ids, p).token_ids
    with pytest.raises(ResourceError, match="max_batch_size"):  # 184 TB of address space
        Engine(engine.model, engine.tokenizer, EngineConfig(max_batch_size=1_000_000))


def test_bad_requests_in_a_batch_fail_alone(engine: Any, batch_case: Any) -> None:
    prompts, params, single = batch_case
    too_long = [1] * (engine.context_len + 5)
    batch = [prompts[0], "", too_long, prompts[1]]
    sp = [params[0], params[0], params[0], params[1]]
    eng = _engine(engine, 3)
    with padded_layout(eng, "vanilla"):
        got = eng.generate(batch, sp, drafter="llma", mode="fixed")
    assert [g.finish_reason for g in got][1:3] == ["error", "error"]
    assert "empty" in (got[1].error or "") and "context" in (got[2].error or "")
    assert got[0].token_ids == single[0].token_ids and got[3].token_ids == single[1].token_ids
