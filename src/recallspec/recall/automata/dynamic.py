"""Per-request dynamic suffix automaton (prompt + accepted tokens).

Self-match invariant: after ``extend``, ``match_length`` is the length of the
longest suffix of the request's text that also occurs ending *earlier* - the
longest string of link(last) in the automaton - so the text never trivially
matches itself. Drafts continue from the earliest such occurrence.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from recallspec import _core
from recallspec.recall.automata._arrays import as_tokens, check_out
from recallspec.recall.automata.cursor import DraftSource, MatchCursor


class DynamicAutomaton(DraftSource):
    """Suffix automaton over one growing token sequence."""

    def __init__(self, tokens: Any = None, vocab_size: int | None = None) -> None:
        self.vocab_size = vocab_size
        self._sam = _core.DynamicSam()
        if tokens is not None:
            self.extend(tokens)

    def core_cursor(self) -> tuple[Any, int | None]:
        """A C++ cursor over this automaton; it takes any id (one outside the
        vocabulary matches nothing)."""
        return _core.DynamicCursor(self._sam), None

    def extend(self, tokens: Any) -> int:
        """Append tokens (one int or a 1-D array); return the new self-match length."""
        if isinstance(tokens, int | np.integer):
            tokens = [int(tokens)]
        self._sam.extend(as_tokens(tokens, self.vocab_size))
        return int(self._sam.self_length)

    def extend_lengths(self, tokens: Any) -> npt.NDArray[np.int64]:
        """Append tokens; return the self-match length after each one."""
        arr = as_tokens(tokens, self.vocab_size)
        out = np.empty(arr.shape[0], np.int64)
        self._sam.extend_lengths(arr, out)
        return out

    def __len__(self) -> int:
        return int(self._sam.size)

    @property
    def n_states(self) -> int:
        return int(self._sam.n_states)

    @property
    def tokens(self) -> npt.NDArray[np.uint32]:
        """A copy of the text so far."""
        return np.asarray(self._sam.text())

    @property
    def match_length(self) -> int:
        return int(self._sam.self_length)

    def draft_chain_into(self, out: npt.NDArray[np.int64]) -> int:
        return int(self._sam.self_draft_chain(check_out(out)))

    def _draft_tree_into(
        self, depth: int, tokens: npt.NDArray[np.int64], parents: npt.NDArray[np.int64],
        counts: npt.NDArray[np.int64],
    ) -> int:
        return int(self._sam.self_draft_tree(depth, tokens, parents, counts))

    def cursor(self) -> MatchCursor:
        """A cursor matching some *other* stream against this automaton."""
        return MatchCursor(self)
