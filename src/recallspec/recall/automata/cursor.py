"""MatchCursor: SAM-Decoding's Algorithm 1 over a static index or a dynamic automaton.

The cursor holds the state and length of the longest suffix of the text fed to
it (``advance``) that occurs in the automaton. A step is O(1) amortized; a whole
batch of tokens is one C++ call. Drafts read from the current match:

* ``draft_chain(n)`` - the tokens that follow the earliest occurrence (min_endpos)
  of the matched string (static: up to the end of that document; dynamic: climbing
  suffix links when fewer than ``n`` tokens follow).
* ``draft_tree(max_nodes)`` - the most frequent continuations, best first by
  occurrence count.

For a request matching *its own* text use ``DynamicAutomaton.match_length`` /
``draft_*`` instead: they report the longest suffix that occurs *earlier*.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from recallspec.decoding.tree import DraftTree
from recallspec.recall.automata._arrays import as_tokens, check_out


class Automaton(Protocol):
    """What a ``MatchCursor`` walks (``StaticIndex``, ``DynamicAutomaton``)."""

    def core_cursor(self) -> tuple[Any, int | None]:
        """A new C++ cursor over this automaton, and the vocabulary bound of its ids
        (None: unbounded)."""
        ...


class DraftSource:
    """The draft methods shared by everything that matches text in an automaton.

    Subclasses provide the two core calls; the buffers, argument checks and the
    ``DraftTree`` wrapping live here once.
    """

    def draft_chain_into(self, out: npt.NDArray[np.int64]) -> int:
        """Write up to ``len(out)`` chain-draft tokens into ``out``; return how many."""
        raise NotImplementedError

    def _draft_tree_into(
        self, depth: int, tokens: npt.NDArray[np.int64], parents: npt.NDArray[np.int64],
        counts: npt.NDArray[np.int64],
    ) -> int:
        raise NotImplementedError

    def draft_chain(self, n: int) -> npt.NDArray[np.int64]:
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        out = np.empty(n, np.int64)
        return out[: self.draft_chain_into(out)]

    def draft_tree_counts(
        self, max_nodes: int, max_depth: int | None = None
    ) -> tuple[DraftTree, npt.NDArray[np.int64]]:
        """Best-first tree draft and each node's occurrence count."""
        tokens, parents, counts = _tree_buffers(max_nodes, max_depth)
        n = self._draft_tree_into(_depth(max_depth), tokens, parents, counts)
        return DraftTree(tokens[:n].copy(), parents[:n].copy()), counts[:n].copy()

    def draft_tree(self, max_nodes: int, max_depth: int | None = None) -> DraftTree:
        return self.draft_tree_counts(max_nodes, max_depth)[0]


class MatchCursor(DraftSource):
    """Longest-suffix match of a token stream against an automaton."""

    def __init__(self, automaton: Automaton) -> None:
        self._vocab: int | None
        core_cursor = getattr(automaton, "core_cursor", None)
        if core_cursor is None:
            raise TypeError(
                "MatchCursor needs a StaticIndex or DynamicAutomaton, "
                f"got {type(automaton).__name__}"
            )
        self._c, self._vocab = core_cursor()
        self.automaton = automaton

    def advance(self, tokens: Any) -> int:
        """Feed tokens (one int or a 1-D array); return the match length afterwards.

        Token ids outside the vocabulary simply match nothing, so they are allowed here
        (a generated token can never be a separator: ids must be < 2^32-1).
        """
        if isinstance(tokens, int | np.integer):
            tokens = [int(tokens)]
        self._c.advance(as_tokens(tokens))
        return int(self._c.length)

    def advance_lengths(self, tokens: Any) -> npt.NDArray[np.int64]:
        """Feed tokens; return the match length after each one (int64 array)."""
        arr = as_tokens(tokens)
        out = np.empty(arr.shape[0], np.int64)
        self._c.advance_lengths(arr, out)
        return out

    def reset(self) -> None:
        self._c.reset()

    @property
    def match_length(self) -> int:
        return int(self._c.length)

    @property
    def state(self) -> int:
        return int(self._c.state)

    def draft_chain_into(self, out: npt.NDArray[np.int64]) -> int:
        return int(self._c.draft_chain(check_out(out)))

    def _draft_tree_into(
        self, depth: int, tokens: npt.NDArray[np.int64], parents: npt.NDArray[np.int64],
        counts: npt.NDArray[np.int64],
    ) -> int:
        return int(self._c.draft_tree(depth, tokens, parents, counts))


def _depth(max_depth: int | None) -> int:
    if max_depth is None:
        return 1 << 62
    if max_depth < 0:
        raise ValueError(f"max_depth must be >= 0, got {max_depth}")
    return max_depth


def _tree_buffers(
    max_nodes: int, max_depth: int | None
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    if max_nodes < 0:
        raise ValueError(f"max_nodes must be >= 0, got {max_nodes}")
    return tuple(np.empty(max_nodes, np.int64) for _ in range(3))  # type: ignore[return-value]
