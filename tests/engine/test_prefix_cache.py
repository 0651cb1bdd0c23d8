"""The prefix cache's bookkeeping: which free slot a prompt takes and what it reuses."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from helpers.engine import make_engine

from recallspec.decoding.sampling import SamplingParams
from recallspec.decoding.tree import DraftTree
from recallspec.drafters import Drafter
from recallspec.engine.prefix_cache import PrefixCache, common_prefix


class Failing(Drafter):
    """A drafter whose proposals raise: its request fails."""

    name = "failing"

    def start(self, rid: int, prompt: Sequence[int]) -> None: ...

    def propose(self, rid: int, max_nodes: int) -> DraftTree:
        raise RuntimeError("boom")

    def observe(self, *a: Any) -> None: ...

    def stop(self, rid: int) -> None: ...


def F(*slots: int) -> list[tuple[int, int]]:
    """Free slots, each allocated once (as when they were retained)."""
    return [(s, 1) for s in slots]


def test_a_slot_allocated_since_retains_nothing() -> None:
    pc = PrefixCache()
    pc.retain(0, [1, 2, 3, 4], "", 1)
    # Someone else allocated slot 0 meanwhile (and may have written it): no reuse.
    assert pc.choose([1, 2, 3, 4, 5], "", [(0, 2)])[:2] == (0, 0)


def test_common_prefix() -> None:
    a = np.asarray([1, 2, 3, 4], np.int64)
    assert common_prefix(a, [1, 2, 3, 4, 5]) == 4
    assert common_prefix(a, [1, 2, 9]) == 2
    assert common_prefix(a, []) == 0
    assert common_prefix(a, [7]) == 0


def test_longest_match_wins_and_the_last_prompt_token_is_prefilled() -> None:
    pc = PrefixCache()
    pc.retain(0, [1, 2, 3], "", 1)
    pc.retain(1, [1, 2, 3, 4, 5, 6], "", 1)
    assert pc.choose([1, 2, 3, 4, 5, 6, 7], "", F(0, 1, 2))[:2] == (1, 6)
    # The chosen slot retains nothing any more; the other still does.
    assert pc.stats().retained_slots == 1
    # A prompt equal to a retained text: all but its last token are reused.
    pc.retain(1, [1, 2, 3, 4, 5, 6], "", 1)
    assert pc.choose([1, 2, 3, 4, 5, 6], "", F(0, 1))[:2] == (1, 5)
    pc.admitted(7, 6)
    pc.evicted()
    s = pc.stats(pool_tokens=5)
    assert (s.queries, s.hits, s.evictions) == (7, 6, 1)
    assert s.resident_tokens == 3 + 5  # slot 0's [1, 2, 3] and the pool's


def test_tenants_never_share() -> None:
    pc = PrefixCache()
    pc.retain(0, [1, 2, 3, 4], "alice", 1)
    # Bob's identical prompt does not reuse Alice's rows; it takes the empty slot.
    assert pc.choose([1, 2, 3, 4, 5], "bob", F(0, 1))[:2] == (1, 0)
    assert pc.choose([1, 2, 3, 4, 5], "alice", F(0))[:2] == (0, 4)


def test_eviction_order_empty_then_least_recent() -> None:
    pc = PrefixCache()
    pc.retain(0, [1], "", 1)
    pc.retain(1, [2], "", 1)
    assert pc.choose([9, 9], "", F(0, 1, 2)) == (2, 0, None)  # an empty slot first
    # Then the least recently retained; what it held is handed back (to copy it out).
    slot, reused, dropped = pc.choose([9, 9], "", F(0, 1))
    assert (slot, reused) == (0, 0) and dropped is not None
    assert dropped.tokens.tolist() == [1] and pc.stats().resident_tokens == 1
    pc.forget(1)
    assert pc.stats().retained_slots == 0
    with pytest.raises(ValueError):
        pc.choose([1], "", [])


def _run(eng: Any, prompt: list[int], n: int, abort_after: int | None = None) -> Any:
    rid = eng.add_request(prompt, SamplingParams(max_new_tokens=n))
    steps = 0
    while eng.has_unfinished():
        for o in eng.step():
            if o.finished and o.rid == rid:
                return o.result
        steps += 1
        if abort_after is not None and steps == abort_after:
            out = eng.abort(rid)
            assert out is not None and out.result is not None
            return out.result
    raise AssertionError("no result")


def test_engine_reuses_finished_requests_but_not_aborted_or_failed_ones() -> None:
    eng = make_engine(max_batch_size=1)
    prompt = list(b"the cat sat on the mat; the cat sat")
    first = _run(eng, prompt, 6)
    again = _run(eng, prompt, 6)
    assert (first.cached_tokens, again.cached_tokens) == (0, len(prompt) - 1)
    assert again.token_ids == first.token_ids
    # A longer prompt extending the first answer's transcript reuses it all.
    longer = prompt + first.token_ids + list(b" and then")
    assert _run(eng, longer, 3).cached_tokens >= len(prompt) + len(first.token_ids) - 1
    # Aborted: its slot's rows are not offered again.
    _run(eng, list(b"xyzxyzxyzxyz"), 20, abort_after=2)
    assert eng.scheduler.prefix is not None
    assert eng.scheduler.prefix.stats().retained_slots == 0
    # Failed (its drafter raised): the same.
    _run(eng, list(b"qrsqrsqrs"), 4)
    assert eng.scheduler.prefix.stats().retained_slots == 1
    with pytest.raises(RuntimeError, match="boom"):  # (before this fix: "a batch needs at
        # least one sequence" from the step after the only request's drafter failed)
        eng.generate(list(b"qrsqrsqrs"), SamplingParams(max_new_tokens=4), drafter=Failing())
    assert not eng.has_unfinished()
    assert eng.scheduler.prefix.stats().retained_slots == 0


def test_prefix_cache_off() -> None:
    eng = make_engine(max_batch_size=1, prefix_cache=False)
    prompt = list(b"hello hello hello")
    assert _run(eng, prompt, 4).cached_tokens == _run(eng, prompt, 4).cached_tokens == 0
    assert eng.scheduler.prefix is None


def test_a_cold_request_neither_reuses_nor_leaves_a_prefix() -> None:
    """``prefix_cache=False`` (a benchmark's request): a cold prefill whatever was
    retained, nothing retained after it, no lookup counted, and what others retained
    stays theirs: in a free slot (two slots) or, where it took the only slot, in the
    pool."""
    prompt = list(b"the cat sat on the mat; the cat sat")
    params = SamplingParams(max_new_tokens=6)
    for slots in (2, 1):
        eng = make_engine(max_batch_size=slots)
        warm = _run(eng, prompt, 6)
        cold = [eng.generate(prompt, params, prefix_cache=False) for _ in range(2)]
        assert [c.cached_tokens for c in cold] == [0, 0]
        assert all(c.token_ids == warm.token_ids for c in cold)
        stats = eng.prefix_cache_stats()
        assert stats is not None
        assert (stats.queries, stats.hits) == (len(prompt), 0)  # the warm request's only
        assert stats.retained_slots == (1 if slots == 2 else 0)  # the cold left nothing
        again = _run(eng, prompt, 6)  # the warm request's rows are still there to reuse
        assert again.cached_tokens == len(prompt) - 1 and again.token_ids == warm.token_ids


def _together(eng: Any, prompts: list[list[int]], params: SamplingParams,
              tenants: list[str] | None = None) -> list[Any]:
    """Add the requests at once, run them to the end; their results in order."""
    rids = [eng.add_request(p, params, tenant=(tenants or [None] * len(prompts))[i])
            for i, p in enumerate(prompts)]
    done: dict[int, Any] = {}
    while eng.has_unfinished():
        done.update({o.rid: o.result for o in eng.step() if o.finished})
    return [done[r] for r in rids]


def test_requests_together_share_one_prefill() -> None:
    """``n`` choices of one prompt (and RAG questions over one document) arriving together:
    the first prefills, the others wait for it and copy its rows from its running slot,
    with the same outputs as with the cache off, seeded sampling included; another
    tenant's request never starts from them, and short shared prefixes do not wait."""
    doc = list(bytes(range(32, 127))) * 2  # 190 tokens shared
    prompts = [doc + list(b" q1?"), doc + list(b" q1?"), doc + list(b" q2?"), doc + list(b"x")]
    for params in (SamplingParams(max_new_tokens=8),
                   SamplingParams(max_new_tokens=8, temperature=1.0, seed=7)):
        outs = {}
        for on in (True, False):
            eng = make_engine(max_batch_size=4, prefix_cache=on, prefill_chunk=64)
            outs[on] = _together(eng, prompts, params, tenants=["", "", "", "eve"])
            stats = eng.prefix_cache_stats()
            if on:
                assert stats is not None
                # Only the first prompt (and eve's) prefilled all; the others waited
                # until fewer than SHARE_WAIT_TOKENS of the shared tokens were left to
                # prefill (chunks of 64: 192 of 194), then copied the committed rows.
                cached = [o.cached_tokens for o in outs[on]]
                assert cached[0] == cached[3] == 0
                assert len(doc) <= cached[1] <= len(prompts[1]) - 1
                assert len(doc) <= cached[2] <= len(doc) + 2  # (doc + " q" is shared)
                assert stats.hits == sum(cached)
        assert [o.token_ids for o in outs[True]] == [o.token_ids for o in outs[False]]
    # A shared prefix under SHARE_WAIT_TOKENS (and nothing committed yet): no wait.
    short = [[*b"the cat sat on the mat", c] for c in b"abc"]
    eng = make_engine(max_batch_size=3)
    assert [o.cached_tokens for o in _together(eng, short, SamplingParams(max_new_tokens=4))
            ] == [0, 0, 0]
