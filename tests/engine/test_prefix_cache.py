"""The prefix cache's bookkeeping: which free slot a prompt takes and what it reuses."""

from __future__ import annotations

import numpy as np
import pytest

from recallspec.engine.prefix_cache import PrefixCache, common_prefix


def test_common_prefix() -> None:
    a = np.asarray([1, 2, 3, 4], np.int64)
    assert common_prefix(a, [1, 2, 3, 4, 5]) == 4
    assert common_prefix(a, [1, 2, 9]) == 2
    assert common_prefix(a, []) == 0
    assert common_prefix(a, [7]) == 0


def test_longest_match_wins_and_the_last_prompt_token_is_prefilled() -> None:
    pc = PrefixCache()
    pc.retain(0, [1, 2, 3], "")
    pc.retain(1, [1, 2, 3, 4, 5, 6], "")
    assert pc.choose([1, 2, 3, 4, 5, 6, 7], "", [0, 1, 2]) == (1, 6)
    # The chosen slot retains nothing any more; the other still does.
    assert pc.stats().retained_slots == 1
    # A prompt equal to a retained text: all but its last token are reused.
    pc.retain(1, [1, 2, 3, 4, 5, 6], "")
    assert pc.choose([1, 2, 3, 4, 5, 6], "", [0, 1]) == (1, 5)
    s = pc.stats()
    assert (s.queries, s.hits, s.evictions) == (13, 11, 0)


def test_tenants_never_share() -> None:
    pc = PrefixCache()
    pc.retain(0, [1, 2, 3, 4], "alice")
    # Bob's identical prompt does not reuse Alice's rows; it takes the empty slot.
    assert pc.choose([1, 2, 3, 4, 5], "bob", [0, 1]) == (1, 0)
    assert pc.choose([1, 2, 3, 4, 5], "alice", [0]) == (0, 4)


def test_eviction_order_empty_then_least_recent() -> None:
    pc = PrefixCache()
    pc.retain(0, [1], "")
    pc.retain(1, [2], "")
    assert pc.choose([9, 9], "", [0, 1, 2]) == (2, 0)  # an empty slot first
    assert pc.stats().evictions == 0
    assert pc.choose([9, 9], "", [0, 1]) == (0, 0)  # then the least recently retained
    assert pc.stats().evictions == 1 and pc.stats().resident_tokens == 1
    pc.forget(1)
    assert pc.stats().retained_slots == 0
    with pytest.raises(ValueError):
        pc.choose([1], "", [])
