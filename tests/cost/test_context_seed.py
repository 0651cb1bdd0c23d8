"""The contexts the cost curve's forwards run after (``cost/calibration.py``:
``random_ids``, ``random_prefix``, ``fill_context``, ``per_seq_cost``): which tokens,
from which seed, fed in which forwards, on a bigram model that writes each row's token
id into its cache row."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import BigramModel

from recallspec.cost import calibration as cc
from recallspec.cost.plan import FEED_CHUNK


def _drawn_before(vocab: int, n: int, seed: int) -> list[int]:
    """The ids the contexts were drawn as before ``random_prefix`` took a seed (seed 0,
    and the batched curve's own copy for other seeds): a seeded torch generator's
    ``randint`` over the vocabulary."""
    ids: list[int] = torch.randint(0, vocab, (n,),
                                   generator=torch.Generator().manual_seed(seed)).tolist()
    return ids


def _held(cache: Any, slot: int, n: int) -> list[int]:
    """The token ids of a slot's first ``n`` rows (``BigramModel`` writes them as keys)."""
    k, _ = cache.rows(slot, n)
    return [int(x) for x in k[0, 0, :, 0].tolist()]


def _model() -> BigramModel:
    return BigramModel(torch.eye(97), max_position=4096)


@pytest.mark.parametrize("seed", [0, 3])
def test_random_prefix_feeds_the_seeds_tokens_in_chunks(seed: int) -> None:
    """``cached + extra`` ids of ``seed``, as drawn before; the first ``cached`` fed and
    committed FEED_CHUNK a forward (a tick after each), the rest left to the caller."""
    model, cached, extra = _model(), FEED_CHUNK + 44, 9
    cache = model.new_cache(1, cached + extra + 1)
    slot = cache.allocate()
    ticks: list[None] = []
    ids = cc.random_prefix(model, cache, slot, cached, extra, lambda: ticks.append(None),
                           seed=seed)
    assert ids == _drawn_before(97, cached + extra, seed) == cc.random_ids(model, len(ids), seed)
    assert _held(cache, slot, cached) == ids[:cached]
    assert cache.length(slot) == cached
    assert model.calls == len(ticks) == -(-cached // FEED_CHUNK) == 2


def test_seed_zero_is_the_default_and_other_seeds_differ() -> None:
    """Seed 0 is the calibration's own context (the call without a seed); another seed's
    tokens are another context, the same on every call."""
    model, cached, extra = _model(), 40, 8
    cache = model.new_cache(3, cached + extra + 1)
    slots = [cache.allocate() for _ in range(3)]
    plain = cc.random_prefix(model, cache, slots[0], cached, extra)
    zero = cc.random_prefix(model, cache, slots[1], cached, extra, seed=0)
    five = cc.random_prefix(model, cache, slots[2], cached, extra, seed=5)
    assert plain == zero == _drawn_before(97, cached + extra, 0)
    assert five != zero
    again = model.new_cache(1, cached + extra + 1)
    assert five == cc.random_prefix(model, again, again.allocate(), cached, extra, seed=5)
    assert [_held(cache, s, cached) for s in slots] == [
        plain[:cached], zero[:cached], five[:cached]]


def test_fill_context_passes_the_seed_fed_or_tiled() -> None:
    """``fill_context``: fed through ``random_prefix`` with its seed, or (a tile) the
    tile's rows loaded without a forward and the seed's ids handed back all the same."""
    model, cached, extra = _model(), 30, 4
    cache = model.new_cache(3, cached + extra + 1)
    fed_slot = cache.allocate()
    fed = cc.fill_context(model, cache, fed_slot, cached, extra, None, seed=2)
    assert fed == _drawn_before(97, cached + extra, 2)
    assert _held(cache, fed_slot, cached) == fed[:cached]
    calls = model.calls
    tile = cache.rows(fed_slot, 7)
    tiled_slot = cache.allocate()
    tiled = cc.fill_context(model, cache, tiled_slot, cached, extra, tile, seed=2)
    assert tiled == fed and model.calls == calls
    assert _held(cache, tiled_slot, cached) == (fed[:7] * 5)[:cached]
    assert cc.fill_context(model, cache, cache.allocate(), cached, extra, tile) == (
        _drawn_before(97, cached + extra, 0))


def test_per_seq_cost_feeds_every_sequence_the_seed_one_context() -> None:
    """Each of ``per_seq_cost``'s sequences holds the same ``cached`` ids of seed 1, fed
    in one forward each (its cached tokens fit one FEED_CHUNK), before its two timed
    forwards (each once a round, after a warm-up round)."""
    model, seqs, cached = _model(), 4, 20
    assert cc.per_seq_cost(model, 1, seqs, cached, repeats=2) >= 0.0
    (cache,) = model.caches
    want = _drawn_before(97, cached, 1)
    assert [_held(cache, s, cached) for s in range(seqs)] == [want] * seqs
    assert model.calls == seqs + 2 * (1 + 2)
