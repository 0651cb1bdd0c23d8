"""Admission within a budget of KV rows (``engine/scheduler.py``): what the slots may hold
never exceeds it, retained prefixes make room least recently retained first, and the
answers are those of an engine without a budget."""

from __future__ import annotations

import pytest
from helpers.engine import PROMPTS, make_engine

from recallspec.decoding.sampling import SamplingParams

# Rows a request may write here: prompt (<= 31) + 20 new + a draft of 8 and its root.
CFG = {"max_batch_size": 4, "max_len": 64, "max_draft_nodes": 8}
P = SamplingParams(max_new_tokens=20)


def needs(prompt: bytes) -> int:
    return min(len(prompt) + P.max_new_tokens + CFG["max_draft_nodes"] + 1, CFG["max_len"])


@pytest.mark.parametrize("drafter", ["none", "pld"])
def test_running_requests_stay_within_the_budget(drafter: str) -> None:
    budget = 100  # two of these requests at a time, never three
    eng = make_engine(kv_budget_tokens=budget, **CFG)
    assert eng.scheduler.kv_budget == budget
    rids = [eng.add_request(list(p), P, drafter=drafter) for p in PROMPTS]
    done: dict[int, list[int]] = {}
    most = 0
    while eng.has_unfinished():
        for out in eng.step():
            if out.result is not None:
                done[out.rid] = out.result.token_ids
        most = max(most, eng.num_running)
        assert eng.cache.resident_rows() <= budget
    assert most == 2 and sum(needs(p) for p in PROMPTS[:2]) <= budget
    free = make_engine(**CFG)
    want = free.generate([list(p) for p in PROMPTS], P, drafter=drafter)
    assert [done[r] for r in rids] == [w.token_ids for w in want]


def test_retained_prefixes_make_room_least_recent_first() -> None:
    budget = 80  # the third request needs room the first two retain
    eng = make_engine(kv_budget_tokens=budget, prefix_cache_tokens=0, **CFG)
    firsts = [eng.generate(list(p), P) for p in PROMPTS[:3]]
    stats = eng.prefix_cache_stats()
    assert stats is not None and stats.evictions >= 1  # the oldest made room
    assert eng.cache.resident_rows() <= budget
    # The most recent conversation's next turn still finds its first turn.
    follow = list(PROMPTS[2]) + firsts[2].token_ids + list(b" and")
    again = eng.generate(follow, P)
    assert again.cached_tokens >= len(PROMPTS[2]) + len(firsts[2].token_ids) - 1
    assert again.token_ids == make_engine(prefix_cache=False, **CFG).generate(follow,
                                                                               P).token_ids


def test_a_budget_below_one_sequence_is_refused() -> None:
    with pytest.raises(ValueError, match="kv_budget_tokens"):
        make_engine(kv_budget_tokens=63, **CFG)
    with pytest.raises(ValueError, match="kv_budget_tokens"):
        make_engine(kv_budget_tokens=0, **CFG)


def test_the_pool_counts_against_the_budget() -> None:
    """Conversations outnumbering the slots: the pool's copies and the slots' rows stay
    within the budget together, the pool dropping its oldest entries first."""
    budget = 100
    eng = make_engine(kv_budget_tokens=budget, **{**CFG, "max_batch_size": 1})
    firsts = [eng.generate(list(p), P) for p in PROMPTS]
    assert eng.scheduler.pool is not None and eng.scheduler.pool.evictions >= 1
    assert eng.scheduler.resident_rows() <= budget
    follow = list(PROMPTS[-1]) + firsts[-1].token_ids + list(b" and")
    again = eng.generate(follow, P)  # the latest conversation is still cached
    assert again.cached_tokens >= len(PROMPTS[-1]) + len(firsts[-1].token_ids) - 1
    assert eng.scheduler.resident_rows() <= budget
