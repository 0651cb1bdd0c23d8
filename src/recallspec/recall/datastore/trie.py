"""Draft trees from retrieved continuations: merge them into a trie, keep the most
frequent nodes.

Input: a [k, depth] matrix of continuation tokens (row j = the tokens after match j),
-1 marking "no token" (a document end or the corpus end; every position after a -1 in
a row is -1 too). Each distinct prefix of a row is a trie node whose count is the
number of rows sharing that prefix.

Invariant of the output: nodes sorted by (count desc, depth asc, token asc). A child's
count never exceeds its parent's and its depth is larger, so every parent precedes its
children: any prefix of the node list (the engine's truncation) is a valid tree and the
most frequent nodes among all trees of that size.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from recallspec.spec.tree import DraftTree


def top_k_trie(conts: npt.NDArray[np.int64], max_nodes: int) -> DraftTree:
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
