"""The prefix pool: evicted slots' rows kept within a token budget, matched by prefix."""

from __future__ import annotations

from typing import Any

import torch
from helpers.engine import make_engine

from recallspec.decoding.sampling import SamplingParams
from recallspec.engine.prefix_pool import (
    DEFAULT_POOL_BYTES,
    DEFAULT_POOL_TOKENS,
    PrefixPool,
    default_pool_tokens,
)


def _rows(n: int, fill: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((2, 1, n, 4), fill), torch.full((2, 1, n, 4), -fill)


def test_best_match_budget_lru_tenants_and_extensions() -> None:
    pool = PrefixPool(budget_tokens=10)
    assert pool.put([1, 2, 3], "", *_rows(3))
    assert pool.put([5, 6, 7, 8], "", *_rows(4))
    entry, n = pool.best([1, 2, 3, 4], "")
    assert entry is not None and n == 3 and entry.k.shape[2] == 3
    assert pool.best([1, 2, 3], "")[1] == 2  # the prompt's last token is always prefilled
    assert pool.best([1, 2, 3, 4], "bob") == (None, 0)  # another tenant's rows: never
    pool.used(entry)  # [1, 2, 3] is now the most recently used
    # 3 + 4 + 5 > 10: the least recently used ([5, 6, 7, 8]) goes.
    assert pool.put([9, 9, 9, 9, 9], "", *_rows(5))
    assert pool.best([5, 6, 7, 8, 0], "")[1] == 0 and pool.evictions == 1
    assert pool.resident_tokens == 8
    # An entry that extends another replaces it (no rows twice).
    assert pool.put([1, 2, 3, 4], "", *_rows(4))
    assert pool.resident_tokens == 9 and pool.best([1, 2, 3, 4, 5], "")[1] == 4
    assert not pool.put(list(range(11)), "", *_rows(11))  # larger than the budget
    assert not PrefixPool(0).put([1], "", *_rows(1))


def _turns(eng: Any, first: list[int], follow: list[int]) -> tuple[Any, Any]:
    p = SamplingParams(max_new_tokens=6)
    a = eng.generate(first, p)
    return a, eng.generate(first + a.token_ids + follow, p)


def test_conversations_outnumbering_slots_reuse_from_the_pool() -> None:
    """One slot, two conversations taking turns: each next turn finds its first turn in
    the pool (the slot went to the other conversation) and answers as without reuse."""
    convs = [list(b"the cat sat on the mat; the"), list(b"hello hello hello hel")]
    got = {}
    for tokens in (16384, 0):  # the pool on, and slots only
        eng = make_engine(max_batch_size=1, prefix_cache_tokens=tokens)
        p = SamplingParams(max_new_tokens=6)
        firsts = [eng.generate(c, p) for c in convs]
        seconds = [eng.generate(c + f.token_ids + list(b" and"), p)
                   for c, f in zip(convs, firsts, strict=True)]
        got[tokens] = (firsts, seconds)
        stats = eng.prefix_cache_stats()
        assert stats is not None
        if tokens:
            # Conversation 0's first turn went to the pool when conversation 1 came.
            assert seconds[0].cached_tokens >= len(convs[0]) + len(firsts[0].token_ids) - 1
            assert stats.resident_tokens > 0
        else:
            assert seconds[0].cached_tokens == 0 and stats.evictions >= 1
    off = make_engine(max_batch_size=1, prefix_cache=False)
    p = SamplingParams(max_new_tokens=6)
    for i, c in enumerate(convs):
        first = off.generate(c, p)
        second = off.generate(c + first.token_ids + list(b" and"), p)
        for tokens in got:
            assert got[tokens][0][i].token_ids == first.token_ids
            assert got[tokens][1][i].token_ids == second.token_ids


def test_a_shared_system_prompt_does_not_cost_the_rest_of_a_conversation() -> None:
    """Two conversations sharing only their start (a system prompt) through one slot:
    the second reuses that start from the slot, and the first's whole turn, which it
    overwrites, is kept in the pool for the first's next turn."""
    system = list(b"You are a helpful assistant. ")
    a, b = system + list(b"Tell me about cats."), system + list(b"Tell me about dogs.")
    eng = make_engine(max_batch_size=1)
    p = SamplingParams(max_new_tokens=6)
    first_a = eng.generate(a, p)
    first_b = eng.generate(b, p)
    assert first_b.cached_tokens == common_len(a, b)  # the system prompt, from the slot
    second_a = eng.generate(a + first_a.token_ids + list(b" More."), p)
    assert second_a.cached_tokens >= len(a) + len(first_a.token_ids) - 1  # from the pool
    off = make_engine(max_batch_size=1, prefix_cache=False)
    assert second_a.token_ids == off.generate(a + first_a.token_ids + list(b" More."),
                                              p).token_ids


def common_len(x: list[int], y: list[int]) -> int:
    n = 0
    while n < min(len(x), len(y)) and x[n] == y[n]:
        n += 1
    return n


def test_default_pool_is_bounded_in_bytes_too() -> None:
    """The default pool holds 16,384 tokens of a light model but no more than 2 GiB of
    keys and values of a heavy one (the SmolLM2-1.7B shape: 393,216 bytes a token)."""
    assert default_pool_tokens(46_080) == DEFAULT_POOL_TOKENS  # SmolLM2-135M, float32
    assert default_pool_tokens(393_216) == DEFAULT_POOL_BYTES // 393_216 == 5461
    eng = make_engine(max_batch_size=1)
    assert eng.scheduler.pool is not None
    assert eng.scheduler.pool.budget_tokens == default_pool_tokens(eng.cache.bytes_per_token())
