"""Ragged batch metadata, KV-cache bookkeeping and attention masks."""

from __future__ import annotations

import pytest
import torch

from recallspec.runtime.attention import ancestor_matrix, build_attention_masks
from recallspec.runtime.batch import SequenceInput, build_batch
from recallspec.runtime.kv_cache import KVCache, KVCacheFullError


def test_build_batch_ragged_layout() -> None:
    meta = build_batch([
        SequenceInput(slot=2, cache_len=5, tokens=[7, 8, 9]),
        SequenceInput(slot=0, cache_len=1, tokens=[1, 2, 3, 4], parents=[-1, 0, 0, 2],
                      logits="last"),
    ])
    assert meta.query_start == (0, 3, 7)
    assert meta.positions.tolist() == [5, 6, 7, 1, 2, 2, 3]  # tree depth, not row index
    assert meta.cache_pos.tolist() == [5, 6, 7, 1, 2, 3, 4]
    assert meta.cache_slot_per_row.tolist() == [2, 2, 2, 0, 0, 0, 0]
    assert meta.logits_indices.tolist() == [0, 1, 2, 6]
    assert meta.is_chain == (True, False)
    assert meta.kv_len(1) == 5
    assert meta.input_ids.tolist() == [7, 8, 9, 1, 2, 3, 4]
    assert meta.seq_index.tolist() == [0, 0, 0, 1, 1, 1, 1]
    assert meta.parents.tolist() == [-1, 0, 1, -1, 0, 0, 2]
    assert meta.argmax.tolist() == [-1] * 4  # until a forward that computes it writes it
    # One int64 buffer holds them all, in the order the native forward reads them.
    assert meta.ints.typecode == "q" and meta.argmax_list() == [-1] * 4
    assert meta.ints.tolist() == [
        *meta.input_ids.tolist(), *meta.positions.tolist(), *meta.seq_index.tolist(),
        *meta.cache_pos.tolist(), *meta.cache_slot_per_row.tolist(), *meta.parents.tolist(),
        *meta.logits_indices.tolist(), *meta.argmax.tolist()]
    assert (meta.num_tokens, meta.num_logits) == (7, 4)
    none = build_batch([SequenceInput(0, 3, [5, 6], logits="none")])
    assert none.num_logits == 0 and none.logits_indices.tolist() == none.argmax.tolist() == []


def test_build_batch_rejects_bad_trees() -> None:
    with pytest.raises(ValueError):
        build_batch([SequenceInput(0, 0, [1, 2], parents=[1, -1])])
    with pytest.raises(ValueError):
        build_batch([SequenceInput(0, 0, [])])


def test_ancestor_matrix() -> None:
    anc = ancestor_matrix(torch.tensor([-1, 0, 0, 2]))
    assert anc.int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]]


def test_masks_tree_and_window() -> None:
    meta = build_batch([
        SequenceInput(0, 3, [1], logits="last"),
        SequenceInput(1, 2, [1, 2, 3], parents=[-1, 0, 0]),
    ])
    masks = build_attention_masks(meta, windows={2})
    assert masks.full[0] is None
    m = masks.full[1]
    assert m is not None and m.shape == (3, 5)
    assert m.int().tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 1]]
    w = masks.for_layer(2)[1]
    assert w is not None
    # positions of the new rows are 2, 3, 3: window 2 keeps keys at pos_q-1 and pos_q
    assert w.int().tolist() == [[0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 0, 1]]


def cache_with_rows(n: int) -> tuple[KVCache, int]:
    c = KVCache(num_layers=2, num_slots=2, max_len=16, num_kv_heads=1, head_dim=1)
    s = c.allocate()
    vals = torch.arange(n, dtype=torch.float32)[:, None, None]
    for layer in range(2):
        c.write(layer, torch.full((n,), s), torch.arange(n), vals, -vals)
    return c, s


def test_commit_compacts_tree_path() -> None:
    c, s = cache_with_rows(8)
    c.commit(s, 0, range(3))  # rows 0..2 committed
    c.commit(s, 3, [0, 2, 4])  # from the rows written at 3.., keep offsets 0, 2, 4
    assert c.length(s) == 6
    for layer in range(2):
        assert c.k[layer, s, 0, :6, 0].tolist() == [0, 1, 2, 3, 5, 7]
        assert c.v[layer, s, 0, :6, 0].tolist() == [0, -1, -2, -3, -5, -7]


def test_rollback_and_slots() -> None:
    c, s = cache_with_rows(4)
    c.commit(s, 0, range(4))
    c.rollback(s, 2)
    assert c.length(s) == 2
    with pytest.raises(ValueError):
        c.rollback(s, 3)
    with pytest.raises(ValueError):
        c.commit(s, 3, [0])  # commit must start at the committed length
    s2 = c.allocate()
    with pytest.raises(KVCacheFullError):
        c.allocate()
    c.release(s2)
    with pytest.raises(ValueError):
        c.release(s2)
    with pytest.raises(KVCacheFullError):
        c.commit(s, 2, range(15))


def test_kv_padding_entries() -> None:
    from recallspec.runtime.kv_cache import KVCache

    c = KVCache(num_layers=1, num_slots=1, max_len=16, num_kv_heads=1, head_dim=2)
    s = c.allocate()
    assert c.valid_prefix(s) is None
    c.commit(s, 0, range(3))
    c.pad(s, 2)
    c.commit(s, 5, range(2))
    assert c.length(s) == 7 and c.logical_length(s) == 5
    assert c.valid_prefix(s).tolist() == [True] * 3 + [False] * 2 + [True] * 2  # type: ignore[union-attr]
    c.rollback(s, 4)
    assert c.logical_length(s) == 3 and c.valid_prefix(s).tolist() == [True] * 3 + [False]  # type: ignore[union-attr]
    c.rollback(s, 3)
    assert c.valid_prefix(s) is None
    c.release(s)
    s = c.allocate()
    assert c.valid_prefix(s) is None and c.logical_length(s) == 0


def test_masks_hide_padding_and_use_logical_positions() -> None:
    valid = torch.tensor([True, False, False, True, True])
    meta = build_batch([SequenceInput(0, 5, [1, 2], cache_valid=valid, start_pos=3)])
    assert meta.positions.tolist() == [3, 4]
    m = build_attention_masks(meta, {2})
    assert m.full[0] is not None
    assert m.full[0].tolist() == [[True, False, False, True, True, True, False],
                                  [True, False, False, True, True, True, True]]
    # window 2: logical key positions 0,_,_,1,2 then 3,4
    w = m.windowed[2][0]
    assert w is not None
    assert w[1].tolist() == [False, False, False, False, False, True, True]
    single = build_batch([SequenceInput(0, 5, [1], cache_valid=valid, start_pos=3)])
    assert build_attention_masks(single).full[0] is not None  # padding forces a mask


def test_kv_cache_check_counts_reclaimable_memory() -> None:
    """The KV cache check uses what the system can give (MemAvailable: free plus
    reclaimable page cache), not free pages alone, which after large file I/O are a
    sliver of it; and still refuses a cache that cannot fit."""
    import os

    from recallspec.errors import ResourceError
    from recallspec.runtime.kv_memory import available_memory

    avail = available_memory()
    assert avail is not None
    page = os.sysconf("SC_PAGE_SIZE")
    assert avail >= os.sysconf("SC_AVPHYS_PAGES") * page - (64 << 20)  # tolerance: the two
    # are read a moment apart, while other processes allocate
    assert avail <= os.sysconf("SC_PHYS_PAGES") * page
    dims = {"num_layers": 30, "max_len": 4096, "num_kv_heads": 3, "head_dim": 64,
            "dtype": torch.float32}
    KVCache.check_fits(num_slots=1, **dims)  # 94 MB
    # The wording names no setting (draft-model and calibration caches are checked too).
    with pytest.raises(ResourceError, match=r"1048576 sequence\(s\) of 4096 positions need"
                       r" .*at most"):
        KVCache.check_fits(num_slots=1 << 20, **dims)
