"""The native forward on every variant's features (partial rotary, layers without RoPE,
soft-capped attention, residual and logit scales, RoPE tables of every scaling type,
fused Phi-3 matrices):

* the dense oracle: float32 weights through the native code against the Python reference
  forward (which test_transformers_parity.py holds against transformers), bound
  ``REL_DENSE`` as for the real models (tests/models/test_native_forward.py);
* batch invariance on the quantized path (the f32 GGUF's matrices quantized to Q8_0 at
  load): one or two threads and every kernel path this CPU has give the same bits, and a
  row's logits are the same alone as in a ragged batch beside other sequences' rows.

Plus LongRoPE's choice of factors, which is made per KV cache (models/rope.py): by the
cache's positions per sequence against the original context, as llama.cpp chooses by
its context, never by what else is in a batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

import pytest
import torch
from helpers.conformance import NAMES, built, reference
from helpers.native_forward import (
    REL_DENSE,
    TREE,
    _forward_with,
    _fresh,
    _other_settings,
    _parity,
)

from recallspec.conformance import checks
from recallspec.conformance.checks import FP32_REL
from recallspec.models import CausalLM, load_model
from recallspec.models.native import NativeModel
from recallspec.runtime.batch import SequenceInput, build_batch


@cache
def _dense(name: str) -> CausalLM:
    model, _ = load_model(built(name).f32_gguf, dtype="float32", repack_cache=False)
    model.native = NativeModel(model)  # the dense native path: the oracle
    return model


@cache
def _quantized(name: str) -> CausalLM:
    model, _ = load_model(built(name).f32_gguf, dtype="auto", repack_cache=False)
    assert model.native is not None
    return model


def _steps(ids: list[int]) -> Iterator[list[SequenceInput]]:
    """A prefill in two chunks (past the 256-512 windows and original contexts), decode
    steps, a tree beside another sequence's prefill, and a ragged batch of a chain, a
    tree and a new prompt's tree."""
    yield [SequenceInput(0, 0, ids[:300])]
    yield [SequenceInput(0, 300, ids[300:560], logits="last")]
    for i in range(2):
        yield [SequenceInput(0, 560 + i, [ids[560 + i]])]
    yield [SequenceInput(0, 562, ids[562:569], TREE), SequenceInput(1, 0, ids[:40])]
    yield [SequenceInput(0, 569, ids[569:571]), SequenceInput(1, 40, ids[40:45], TREE[:5]),
           SequenceInput(2, 0, ids[:7], TREE)]


@pytest.mark.parametrize("name", NAMES)
def test_dense_native_matches_reference(name: str) -> None:
    ref = reference(name)
    print(name, _parity(_dense(name), list(_steps(ref.ids)), REL_DENSE, ref.variant.context))


@pytest.mark.parametrize("name", NAMES)
def test_threads_and_kernel_paths_same_bits(name: str) -> None:
    ref = reference(name)
    model, steps, ctx = _quantized(name), list(_steps(ref.ids)), ref.variant.context
    base = _forward_with(model, steps, max_len=ctx, threads=1)
    for kw in _other_settings():
        got = _forward_with(model, steps, max_len=ctx, **kw)
        assert all(torch.equal(a, b) for a, b in zip(base, got, strict=True)), kw


@pytest.mark.parametrize("name", NAMES)
def test_row_alone_equals_row_in_batches(name: str) -> None:
    ref = reference(name)
    model, ids, ctx = _quantized(name), ref.ids, ref.variant.context
    prefix = [SequenceInput(0, 0, ids[:520]), SequenceInput(1, 0, ids[:11])]
    alone = model(build_batch([SequenceInput(0, 520, ids[520:523], [-1, 0, 0])]),
                  _fresh(model, prefix, ctx))
    batch = build_batch([
        SequenceInput(1, 11, ids[11:16]),
        SequenceInput(0, 520, ids[520:523] + ids[530:534], [-1, 0, 0, 1, 2, 3, 0]),
        SequenceInput(2, 0, ids[:30]),
    ])
    assert torch.equal(model(batch, _fresh(model, prefix, ctx))[5:8], alone)
    steps_cache, chain_cache = _fresh(model, prefix, ctx), _fresh(model, prefix, ctx)
    steps = [model(build_batch([SequenceInput(0, 520 + i, [ids[520 + i]])]), steps_cache)
             for i in range(4)]
    chain = model(build_batch([SequenceInput(0, 520, ids[520:524])]), chain_cache)
    assert torch.equal(torch.cat(steps), chain)


def test_longrope_factors_chosen_by_cache_length() -> None:
    """Phi-4-mini's LongRoPE (original context 256): a KV cache of at most 256 positions a
    sequence rotates by the short factors, a longer one by the long factors, for every
    row alike. transformers chooses by the longest position of each forward: on a
    200-token sequence (short there) it equals ours in a 256-position cache; on the
    600-token sequence (long there) ours in a 1,024-position cache
    (test_transformers_parity.py). In the longer cache the 200 tokens differ from
    transformers' short-factor logits, by design (llama.cpp's choice too)."""
    ref = reference("phi4-mini")
    orig = 256
    model = checks.load_ours(built("phi4-mini").f32_gguf, "float32")
    short_ids = ref.ids[:200]
    hf_short = checks.hf_logits(ref.model, short_ids)
    in_short = checks.ours_logits(model, short_ids, orig)
    assert checks.agreement(hf_short, in_short).max_rel <= FP32_REL
    in_long = checks.ours_logits(model, short_ids, 4 * orig)
    assert checks.agreement(hf_short, in_long).max_rel > 100 * FP32_REL
    assert torch.equal(in_long, checks.ours_logits(model, short_ids, 2 * orig + 1))
