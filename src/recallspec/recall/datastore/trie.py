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

from recallspec import _core
from recallspec.decoding.tree import DraftTree


def top_k_trie(conts: npt.NDArray[np.int64], max_nodes: int) -> DraftTree:
    """The ``max_nodes`` most frequent trie nodes of the continuations ``conts`` (ties
    broken by depth, then token, then the order of the nodes' prefixes), built in the C
    core (``csrc/datastore/suffix_search.cpp``: a numpy version took a sizeable share of
    a small model's decode step)."""
    if conts.ndim != 2:
        raise ValueError("continuations must be a 2-D [matches, depth] array")
    n = max(min(max_nodes, conts.shape[0] * conts.shape[1]), 0)
    tokens = np.empty(n, np.int64)
    parents = np.empty(n, np.int64)
    got = _core.top_k_trie(np.ascontiguousarray(conts, np.int64), n, tokens, parents)
    if got == 0:
        return DraftTree.empty()
    return DraftTree(tokens[:got], parents[:got])
