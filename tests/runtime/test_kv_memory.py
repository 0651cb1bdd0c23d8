"""KV memory on demand (``runtime/kv_memory.py``): a cache occupies the rows written,
not slots x max_len, gives them back when a slot frees them, and reads the same."""

from __future__ import annotations

import torch

from recallspec.runtime.kv_cache import KVCache
from recallspec.runtime.kv_memory import PAGE, LazyTensor

MiB = 1 << 20


def rss() -> int:
    """Resident bytes of this process (VmRSS)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_pages_are_taken_when_written_and_given_back() -> None:
    # 64 GiB of address space: more than this machine's memory, never committed.
    t = LazyTensor((64, 1 << 28), torch.float32)
    before = rss()
    assert t.tensor[63, -1].item() == 0.0  # reading maps the shared zero page only
    t.tensor[1, : 64 * MiB // 4] = 1.5  # write 64 MiB
    grown = rss() - before
    # Tolerance: the process allocates a little besides (a few MiB at most).
    assert 60 * MiB <= grown <= 72 * MiB
    start = 1 * (1 << 28) * 4
    freed = t.give_back(start + 100, start + 64 * MiB)  # partial first page kept
    assert freed == 64 * MiB - PAGE
    assert rss() - before <= 8 * MiB
    assert t.tensor[1, 0].item() == 1.5 and t.tensor[1, PAGE // 4 - 1].item() == 1.5
    assert int(t.tensor[1, PAGE // 4 : 64 * MiB // 4].count_nonzero()) == 0  # zeros again


def cache(slots: int = 4, max_len: int = 1024) -> KVCache:
    return KVCache(num_layers=3, num_slots=slots, max_len=max_len, num_kv_heads=2,
                   head_dim=64)


def test_release_gives_back_all_but_the_kept_rows_and_only_those() -> None:
    c = cache()
    for slot in range(c.num_slots):
        assert c.allocate() == slot
    full = torch.randn(c.k.shape)
    c.k.copy_(full)
    c.v.copy_(-full)
    c.release(1, keep=100)  # 100 rows of slot 1 retained: page-granular, never fewer
    c.release(2)  # nothing retained
    assert torch.equal(c.k[:, 1, :, :100], full[:, 1, :, :100])
    assert torch.equal(c.v[:, 1, :, :100], -full[:, 1, :, :100])
    rows_per_page = PAGE // (64 * 4)
    first_freed = -(-100 // rows_per_page) * rows_per_page
    assert int(c.k[:, 1, :, first_freed:].count_nonzero()) == 0
    assert int(c.k[:, 2].count_nonzero()) == 0 and int(c.v[:, 2].count_nonzero()) == 0
    # The slots still in use are untouched.
    for s in (0, 3):
        assert torch.equal(c.k[:, s], full[:, s]) and torch.equal(c.v[:, s], -full[:, s])


def test_resident_rows_count_what_slots_may_hold() -> None:
    c = cache()
    s = c.allocate()
    c.expect(s, 300)
    c.commit(s, 0, range(10))
    assert c.resident_rows(s) == 300 and c.resident_rows() == 300
    c.release(s, keep=10)
    assert c.resident_rows() == 10
    c.give_back(s)
    assert c.resident_rows() == 0
    t = c.allocate()
    c.resume(t, 0)
    c.expect(t, 5000)  # capped at max_len
    assert c.resident_rows(t) == c.max_len


def test_a_cache_larger_than_memory_is_made_and_used() -> None:
    # 8 slots x 4,096 positions of a 1.7B model (24 layers, 32 KV heads x 64): 12 GiB of
    # float32 K and V reserved, which is refused no longer: memory follows the rows.
    before = rss()
    c = KVCache(num_layers=24, num_slots=8, max_len=4096, num_kv_heads=32, head_dim=64)
    s = c.allocate()
    c.k[:, s, :, :16] = 1.0
    assert rss() - before < 64 * MiB  # tolerance: 16 rows touch one page per (layer, head)
    assert c.budget_rows() >= c.max_len
