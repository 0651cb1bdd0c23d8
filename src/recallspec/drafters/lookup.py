"""Drafters that copy from the request's own text: none, pld and llma.

``pld`` is prompt lookup decoding: find the most recent earlier occurrence of the
last n tokens of the text (n from ``max_ngram`` down to ``min_ngram``) and propose
the tokens that followed it. ``llma`` is EMS-SD's LLMA setting of the same idea:
match length exactly 2, copy up to 7 tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from recallspec.decoding.tree import DraftTree
from recallspec.drafters.base import Drafter


class NoDrafter(Drafter):
    """Plain autoregressive decoding: never drafts."""

    name = "none"
    needs_logits = False

    def start(self, rid: int, prompt: Sequence[int]) -> None:
        pass

    def propose(self, rid: int, max_nodes: int) -> DraftTree:
        return DraftTree.empty()

    def observe(
        self, rid: int, accepted: Sequence[int], tree: DraftTree, logits: torch.Tensor | None
    ) -> None:
        pass

    def stop(self, rid: int) -> None:
        pass


@dataclass
class _LookupState:
    text: list[int] = field(default_factory=list)
    # For each n: n-gram -> end index of its latest occurrence that has a successor.
    last_end: dict[int, dict[tuple[int, ...], int]] = field(default_factory=dict)


class LookupDrafter(Drafter):
    """n-gram lookup over the request's own text; O(n_max) per committed token."""

    needs_logits = False

    def __init__(self, *, max_ngram: int = 3, min_ngram: int = 1, max_tokens: int = 10,
                 name: str = "pld") -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        if max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        self.name = name
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.max_tokens = max_tokens
        self._states: dict[int, _LookupState] = {}

    def start(self, rid: int, prompt: Sequence[int]) -> None:
        st = _LookupState(last_end={n: {} for n in range(self.min_ngram, self.max_ngram + 1)})
        self._states[rid] = st
        self._extend(st, prompt)

    def _extend(self, st: _LookupState, tokens: Sequence[int]) -> None:
        text = st.text
        tables = tuple(st.last_end.items())  # once per call, not per token
        for t in tokens:
            i = len(text)  # index of the new token
            # The n-gram ending at i-1 now has a successor (token i): index it.
            for n, table in tables:
                if i >= n:
                    table[tuple(text[i - n : i])] = i - 1
            text.append(int(t))

    def propose(self, rid: int, max_nodes: int) -> DraftTree:
        st = self._states[rid]
        k = min(self.max_tokens, max_nodes)
        if k <= 0:
            return DraftTree.empty()
        text = st.text
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(text) < n:
                continue
            end = st.last_end[n].get(tuple(text[-n:]))
            if end is not None:
                return DraftTree.chain(text[end + 1 : end + 1 + k])
        return DraftTree.empty()

    def observe(
        self, rid: int, accepted: Sequence[int], tree: DraftTree, logits: torch.Tensor | None
    ) -> None:
        self._extend(self._states[rid], accepted)

    def stop(self, rid: int) -> None:
        self._states.pop(rid, None)


def make_pld(*, max_ngram: int = 3, min_ngram: int = 1, max_tokens: int = 10) -> LookupDrafter:
    return LookupDrafter(
        max_ngram=max_ngram, min_ngram=min_ngram, max_tokens=max_tokens, name="pld"
    )


def make_llma(*, match_length: int = 2, copy_length: int = 7) -> LookupDrafter:
    return LookupDrafter(
        max_ngram=match_length, min_ngram=match_length, max_tokens=copy_length, name="llma"
    )
