"""Suffix array construction (prefix doubling in numpy) and range search (C core).

The text is an int32 array of token ids with -1 after every document (the separator).
The suffix array lists the start positions of all suffixes that begin with a token
(separator positions are left out), in lexicographic order of the int32 values, the
end of the text being smaller than everything. A query never contains -1, so no match
crosses a document boundary.

Invariant of ``suffix_array(text)``: ``text[sa[i]:] < text[sa[i+1]:]`` for all i.
Consequently the suffixes starting with a given query form one contiguous run of the
array, found by two binary searches (``match_range``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from recallspec import _core

SEPARATOR = -1


def suffix_array(
    text: npt.NDArray[np.int32], progress: Callable[[int], None] | None = None
) -> npt.NDArray[np.int32]:
    """Suffix array of ``text`` (see the module docstring), O(n log n log L) in numpy,
    L = the longest repeated substring. ``progress(k)`` is called after each doubling
    round with the prefix length already sorted."""
    n = int(text.shape[0])
    if n == 0:
        return np.zeros(0, np.int32)
    if n >= 2**31 - 1:
        raise ValueError("suffix arrays hold int32 positions: the corpus is too large")
    # Ranks: 0 = past the end, 1 = separator, token + 2 otherwise.
    _, rank = np.unique(text.astype(np.int64), return_inverse=True)
    rank = rank.astype(np.int64) + 1
    k = 1
    while True:
        nxt = np.zeros(n, np.int64)
        if k < n:
            nxt[: n - k] = rank[k:]
        key = rank * (n + 2) + nxt  # ranks <= n + 1: no overflow below 2^31 positions
        sa = np.argsort(key, kind="stable")
        sk = key[sa]
        new_sorted = np.empty(n, np.int64)
        new_sorted[0] = 1
        np.cumsum(sk[1:] != sk[:-1], out=new_sorted[1:])
        new_sorted[1:] += 1
        rank = np.empty(n, np.int64)
        rank[sa] = new_sorted
        if progress is not None:
            progress(2 * k)
        if int(new_sorted[-1]) == n:  # all suffixes distinct: fully sorted
            break
        k *= 2
    keep = text[sa] != SEPARATOR
    return sa[keep].astype(np.int32)


def as_int32(a: Sequence[int] | npt.NDArray[np.integer[Any]]) -> npt.NDArray[np.int32]:
    """A 1-D C-contiguous int32 array of ``a`` (the C core's argument type)."""
    return np.ascontiguousarray(np.asarray(a, dtype=np.int64).reshape(-1), dtype=np.int32)


def match_range(
    text: npt.NDArray[np.int32], sa: npt.NDArray[np.int32], query: Sequence[int]
) -> tuple[int, int]:
    """[lo, hi) of the suffix-array entries whose suffix starts with ``query`` (two
    binary searches, in the C core)."""
    lo, hi = _core.sa_match_range(as_int32(text), as_int32(sa), as_int32(query))
    return int(lo), int(hi)
