"""Index file round trips and every failure mode raising a clear IndexFileError."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest

from recallspec.errors import DataError, IndexFileError
from recallspec.recall.automata import DynamicAutomaton, IndexBuilder, MatchCursor, StaticIndex

FP = "ab" * 32
DOCS = [[1, 2, 3, 1, 2, 4], [2, 3, 1, 2], [5, 5, 5, 5, 6]]


@pytest.fixture()
def index_path(tmp_path: Path) -> Path:
    p = tmp_path / "c.idx"
    StaticIndex.build(DOCS, 8, FP, p, metadata={"corpus": ["x.jsonl"]})
    return p


def test_round_trip(index_path: Path, tmp_path: Path) -> None:
    a = StaticIndex.open(index_path, expected_fingerprint=FP, verify=True)
    assert (a.n_tokens, a.n_docs, a.vocab_size) == (15, 3, 8)
    assert a.tokenizer_fingerprint == FP
    assert a.metadata == {"corpus": ["x.jsonl"]}
    sep = 0xFFFF  # vocabulary < 65535: 16-bit token ids, all-ones separator
    assert a.text.dtype == np.uint16
    assert a.text.tolist() == [*DOCS[0], sep, *DOCS[1], sep, *DOCS[2], sep]
    info = a.info()
    assert info.verified and info.file_bytes == os.path.getsize(index_path)
    # Same input, same bytes (deterministic build), and both answer identically.
    b_path = tmp_path / "b.idx"
    b = StaticIndex.build(DOCS, 8, FP, b_path, metadata={"corpus": ["x.jsonl"]})
    assert index_path.read_bytes() == b_path.read_bytes()
    ca, cb = a.cursor(), MatchCursor(b)
    stream = [1, 2, 3, 1, 2, 9, 5, 5]
    assert ca.advance_lengths(stream).tolist() == [1, 2, 3, 4, 5, 0, 1, 2]
    assert cb.advance_lengths(stream).tolist() == [1, 2, 3, 4, 5, 0, 1, 2]
    ca.reset()
    ca.advance([2, 3])
    assert ca.draft_chain(3).tolist() == [1, 2, 4]  # earliest occurrence, doc 0
    ca.reset()
    ca.advance([5])
    tree, counts = ca.draft_tree_counts(4)
    # "5" occurs 4x: 55 (3x) > 555 (2x) > ties at 1x in discovery order: 56, 556.
    assert tree.tokens.tolist() == [5, 5, 6, 6]
    assert tree.parents.tolist() == [-1, 0, -1, 0]
    assert counts.tolist() == [3, 2, 1, 1]


def test_wide_token_ids(tmp_path: Path) -> None:
    # >= 65535 ids: 32-bit token sections; ids above 16 bits must not alias.
    big = 70_000
    docs = [[69_999, 1, 69_999, 2], [65_535 + 1, 1, 65_535 + 1]]
    idx = StaticIndex.build(docs, big, FP, tmp_path / "w.idx")
    assert idx.text.dtype == np.uint32 and idx.text[4] == 0xFFFFFFFF
    cur = idx.cursor()
    assert cur.advance_lengths([69_999, 1, 69_999]).tolist() == [1, 2, 3]
    assert cur.draft_chain(5).tolist() == [2]
    assert cur.advance([69_999 - 65_536]) == 0  # same low 16 bits, different id
    cur.reset()
    cur.advance([65_536])
    tree, counts = cur.draft_tree_counts(5)
    assert tree.tokens.tolist() == [1, 65_536] and counts.tolist() == [1, 1]
    StaticIndex.open(tmp_path / "w.idx", verify=True)


def test_no_tmp_file_left(index_path: Path) -> None:
    assert [p.name for p in index_path.parent.iterdir()] == ["c.idx"]


def _patch(path: Path, offset: int, data: bytes) -> None:
    b = bytearray(path.read_bytes())
    b[offset : offset + len(data)] = data
    path.write_bytes(bytes(b))


def test_wrong_magic(index_path: Path) -> None:
    _patch(index_path, 0, b"NOTANIDX")
    with pytest.raises(IndexFileError, match=r"c\.idx.*bad magic"):
        StaticIndex.open(index_path)


def test_wrong_version(index_path: Path) -> None:
    _patch(index_path, 8, struct.pack("<I", 99))
    with pytest.raises(IndexFileError, match=r"c\.idx.*version 99"):
        StaticIndex.open(index_path)


def test_truncated(index_path: Path) -> None:
    data = index_path.read_bytes()
    index_path.write_bytes(data[:-10])
    with pytest.raises(IndexFileError, match="truncated"):
        StaticIndex.open(index_path)
    index_path.write_bytes(data[:100])
    with pytest.raises(IndexFileError, match="truncated"):
        StaticIndex.open(index_path)


def test_header_corruption_detected_without_verify(index_path: Path) -> None:
    _patch(index_path, 24, b"\x07")  # n_tokens
    with pytest.raises(IndexFileError, match="header checksum"):
        StaticIndex.open(index_path)


def test_payload_corruption_needs_verify(index_path: Path) -> None:
    size = index_path.stat().st_size
    b = bytearray(index_path.read_bytes())
    b[size - 3] ^= 0xFF  # inside the root table
    index_path.write_bytes(bytes(b))
    StaticIndex.open(index_path)  # cheap open: header and sizes only
    with pytest.raises(IndexFileError, match="payload checksum mismatch"):
        StaticIndex.open(index_path, verify=True)


def test_corrupted_payload_never_crashes(tmp_path: Path) -> None:
    """Opened without verify, a damaged payload may give wrong drafts but must not crash
    or hang: every read in the mapped file is bounds-checked."""
    rng = np.random.default_rng(1)
    docs = [rng.integers(0, 6, size=50).tolist() for _ in range(20)]
    good = tmp_path / "g.idx"
    StaticIndex.build(docs, 6, FP, good)
    data = good.read_bytes()
    for trial in range(60):
        b = bytearray(data)
        for pos in rng.integers(4096, len(b), size=int(rng.integers(1, 200))):
            b[pos] = int(rng.integers(0, 256))
        bad = tmp_path / f"b{trial}.idx"
        bad.write_bytes(bytes(b))
        cur = StaticIndex.open(bad).cursor()
        cur.advance_lengths(rng.integers(0, 7, size=300))
        cur.draft_chain(40)
        cur.draft_tree(16)
        with pytest.raises(IndexFileError, match="payload checksum"):
            StaticIndex.open(bad, verify=True)


def test_tokenizer_mismatch(index_path: Path) -> None:
    with pytest.raises(IndexFileError, match="different tokenizer"):
        StaticIndex.open(index_path, expected_fingerprint="cd" * 32)
    with pytest.raises(IndexFileError, match="vocabulary size"):
        StaticIndex.open(index_path, expected_vocab_size=9)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(IndexFileError, match="does not exist"):
        StaticIndex.open(tmp_path / "nope.idx")


def test_empty_corpus(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="empty corpus"):
        StaticIndex.build([], 8, FP, tmp_path / "e.idx")
    with pytest.raises(DataError, match="empty corpus"):
        StaticIndex.build([[], []], 8, FP, tmp_path / "e.idx")
    assert not (tmp_path / "e.idx").exists()


def test_token_validation(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"document 1\[2\] = 8 is out of range.*vocab_size 8"):
        StaticIndex.build([[1, 2], [1, 2, 8]], 8, FP, tmp_path / "v.idx")
    with pytest.raises(ValueError, match="negative"):
        StaticIndex.build([[1, -1]], 8, FP, tmp_path / "v.idx")
    with pytest.raises(TypeError, match="integer"):
        StaticIndex.build([np.array([1.0, 2.0])], 8, FP, tmp_path / "v.idx")
    with pytest.raises(ValueError, match="1-D"):
        IndexBuilder(8).add_document(np.zeros((2, 2), np.int64))
    with pytest.raises(ValueError, match="vocab_size"):
        IndexBuilder(0)
    with pytest.raises(ValueError, match="out of range"):
        DynamicAutomaton(vocab_size=4).extend([1, 4])
    b = IndexBuilder(8)
    with pytest.raises(ValueError, match="offsets"):
        b.add_flat(np.array([1, 2, 3], np.uint32), np.array([0, 2], np.int64))


def test_cursor_argument_checks(index_path: Path) -> None:
    cur = StaticIndex.open(index_path).cursor()
    with pytest.raises(TypeError, match="int64"):
        cur.draft_chain_into(np.zeros(4, np.int32))
    with pytest.raises(TypeError, match="int64"):
        cur.draft_chain_into(np.zeros((2, 4), np.int64)[:, 0])
    with pytest.raises(TypeError, match="not str"):
        cur.advance("abc")
    with pytest.raises(ValueError, match="max_nodes"):
        cur.draft_tree(-1)
    with pytest.raises(TypeError, match="StaticIndex or DynamicAutomaton"):
        MatchCursor(object())  # type: ignore[arg-type]
    # Ids beyond the vocabulary simply do not match.
    assert cur.advance([100]) == 0


def test_open_is_lazy_and_large_builds_chunk(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 50, size=int(n), dtype=np.uint32) for n in rng.integers(1, 400, 300)]
    p = tmp_path / "r.idx"
    seen: list[int] = []
    idx = StaticIndex.build(iter(docs), 50, FP, p, progress=seen.append)
    assert seen[-1] == idx.n_tokens == sum(len(d) for d in docs)
    assert idx.n_states <= 2 * idx.n_tokens
    cur = idx.cursor()
    assert cur.advance(docs[7]) == len(docs[7])  # a whole document matches itself
    assert cur.draft_chain(5).tolist() == []  # ...and nothing follows it (document end)
