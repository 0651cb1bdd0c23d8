"""The C core's REST retrieval (csrc/datastore/suffix_search.cpp) against references:
the numpy trie it replaced (exact nodes and order, ties included), brute-force longest
matches and continuations."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import numpy.typing as npt
from hypothesis import given, settings
from hypothesis import strategies as st

from recallspec.decoding.tree import DraftTree
from recallspec.recall.datastore.rest import RestDatastore, RetrievalConfig, build_rest
from recallspec.recall.datastore.trie import top_k_trie


def numpy_top_k_trie(conts: npt.NDArray[np.int64], max_nodes: int) -> DraftTree:
    """The ``max_nodes`` most frequent trie nodes of the continuations ``conts``."""
    if conts.ndim != 2:
        raise ValueError("continuations must be a 2-D [matches, depth] array")
    k, depth = conts.shape
    if k == 0 or depth == 0 or max_nodes <= 0:
        return DraftTree.empty()
    tok_all: list[npt.NDArray[np.int64]] = []
    par_all: list[npt.NDArray[np.int64]] = []
    cnt_all: list[npt.NDArray[np.int64]] = []
    dep_all: list[npt.NDArray[np.int64]] = []
    # prev[j]: global id of row j's node at the previous depth (-1 = root).
    prev = np.full(k, -1, np.int64)
    alive = np.ones(k, bool)
    base = 1 + int(conts.max(initial=0))  # key = (parent + 1) * base + token, no collisions
    n_nodes = 0
    for d in range(depth):
        col = conts[:, d]
        alive &= col >= 0
        if not alive.any():
            break
        rows = np.flatnonzero(alive)
        key = (prev[rows] + 1) * base + col[rows]
        uniq, inv, cnt = np.unique(key, return_inverse=True, return_counts=True)
        ids = n_nodes + np.arange(uniq.shape[0], dtype=np.int64)
        tok_all.append(uniq % base)
        par_all.append(uniq // base - 1)
        cnt_all.append(cnt.astype(np.int64))
        dep_all.append(np.full(uniq.shape[0], d, np.int64))
        prev[rows] = ids[inv]
        n_nodes += uniq.shape[0]
    if n_nodes == 0:
        return DraftTree.empty()
    tok = np.concatenate(tok_all)
    par = np.concatenate(par_all)
    cnt = np.concatenate(cnt_all)
    dep = np.concatenate(dep_all)
    order = np.lexsort((tok, dep, -cnt))[:max_nodes]  # last key is primary
    new_index = np.full(n_nodes, -1, np.int64)
    new_index[order] = np.arange(order.shape[0], dtype=np.int64)
    old_par = par[order]
    parents = np.where(old_par < 0, -1, new_index[np.maximum(old_par, 0)])
    return DraftTree(tok[order].copy(), parents)


def _rows(rows: list[list[int]], depth: int) -> npt.NDArray[np.int64]:
    return np.asarray(rows, np.int64).reshape(len(rows), depth)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(-1, 3), min_size=4, max_size=4), max_size=40),
       st.integers(0, 24), st.booleans())
def test_top_k_trie_equals_the_numpy_reference(
    rows: list[list[int]], k: int, sort_rows: bool
) -> None:
    # Rows in any order (the C core sorts them; suffix-array runs come sorted) and with
    # values after a row's first -1 (ignored by both).
    if sort_rows:
        rows = sorted(rows)
    conts = _rows(rows, 4)
    got, want = top_k_trie(conts, k), numpy_top_k_trie(conts, k)
    assert got.tokens.tolist() == want.tokens.tolist()
    assert got.parents.tolist() == want.parents.tolist()


def _brute_longest(text: list[int], ctx: list[int], cfg: RetrievalConfig) -> int:
    def occurs(q: list[int]) -> bool:
        return any(text[i : i + len(q)] == q for i in range(len(text)))

    for n in range(min(cfg.max_query, len(ctx)), cfg.min_query - 1, -1):
        if occurs(ctx[len(ctx) - n:]):
            return n
    return 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=30), min_size=1, max_size=4),
       st.lists(st.integers(0, 3), max_size=12), st.integers(1, 4), st.integers(1, 8),
       st.integers(1, 5), st.integers(1, 4))
def test_retrieval_equals_brute_force(
    docs: list[list[int]], ctx: list[int], min_q: int, max_q: int,
    max_matches: int, depth: int,
) -> None:

    cfg = RetrievalConfig(max_query=max(min_q, max_q), min_query=min_q,
                          max_matches=max_matches, depth=depth, tree_nodes=6)
    with tempfile.TemporaryDirectory() as d:
        ds: RestDatastore = build_rest(docs, vocab_size=4, tokenizer_fingerprint="fp",
                                       path=Path(d) / "t.rest")
        text = ds.text.tolist()
        length, lo, hi = ds.longest_match(ctx, cfg)
        assert length == _brute_longest(text, ctx, cfg)
        if length == 0:
            assert len(ds.retrieve(ctx, cfg)[1]) == 0
            ds.close()
            return
        q = ctx[len(ctx) - length:]
        starts = sorted(int(p) for p in ds.sa[lo:hi])
        assert starts == [i for i in range(len(text)) if text[i : i + length] == q]
        # Continuations: evenly spaced entries of the run, -1 from a document's end on.
        run = ds.sa[lo:hi].tolist()
        picks = (run if len(run) <= max_matches else
                 [run[(i * len(run)) // max_matches] for i in range(max_matches)])
        want = []
        for p in picks:
            row, ended = [], False
            for t in range(depth):
                at = p + length + t
                tok = -1 if ended or at >= len(text) else text[at]
                ended = tok < 0
                row.append(tok)
            want.append(row)
        assert ds.continuations(lo, hi, length, cfg).tolist() == want
        tree = ds.retrieve(ctx, cfg)[1]
        ref = numpy_top_k_trie(_rows(want, depth), cfg.tree_nodes)
        assert tree.tokens.tolist() == ref.tokens.tolist()
        assert tree.parents.tolist() == ref.parents.tolist()
        ds.close()
