"""Retrieval drafters: ``rest`` (suffix-array datastore) and ``crest`` (precomputed trees
of frequent n-grams in an SQLite file or PostgreSQL table).

Both are model-free: per request they keep only the last ``max_query`` (REST) or
``max_n`` (CREST) tokens of prompt + committed text, and draft the datastore's tree for
the longest matching suffix, truncated to the engine's ``max_nodes`` (trees are stored
best-first, so a prefix is the best tree of that size).

The datastore is opened once, lazily; with an engine (``bind``) its tokenizer
fingerprint and vocabulary size are checked against the target's, otherwise the
``tokenizer_fingerprint`` option must be given (offline replay).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from recallspec.decoding.tree import DraftTree
from recallspec.drafters.base import Drafter, DrafterContext
from recallspec.recall.datastore.open import open_tree_store
from recallspec.recall.datastore.rest import RestDatastore, RetrievalConfig
from recallspec.recall.datastore.store import DEFAULT_TABLE, TreeStore


@dataclass(frozen=True)
class RetrievalStep:
    """One proposal's statistics: matched suffix length and draft size."""

    match_length: int
    draft_nodes: int


class _RetrievalBase(Drafter):
    needs_logits = False
    context_len: int  # tokens of text kept per request

    def __init__(self, datastore: str, tokenizer_fingerprint: str | None) -> None:
        self.datastore = datastore
        self.tokenizer_fingerprint = tokenizer_fingerprint
        self._tails: dict[int, deque[int]] = {}
        self._last: dict[int, RetrievalStep] = {}

    def _open(self, fingerprint: str, vocab_size: int | None) -> None:
        raise NotImplementedError

    def _is_open(self) -> bool:
        raise NotImplementedError

    def bind(self, ctx: DrafterContext) -> None:
        if self._is_open():
            return
        fp = ctx.tokenizer_fingerprint or self.tokenizer_fingerprint
        if fp is None:
            raise ValueError(f"datastore {self.datastore!r}: the tokenizer has no fingerprint")
        self._open(fp, ctx.vocab_size)

    def _ensure_open(self) -> None:
        if not self._is_open():
            if self.tokenizer_fingerprint is None:
                raise ValueError(
                    f"datastore {self.datastore!r}: pass tokenizer_fingerprint=... or create "
                    "the drafter through an Engine so the datastore can be checked"
                )
            self._open(self.tokenizer_fingerprint, None)

    def start(self, rid: int, prompt: Sequence[int]) -> None:
        self._ensure_open()
        self._tails[rid] = deque((int(t) for t in prompt), maxlen=self.context_len)
        self._last[rid] = RetrievalStep(0, 0)

    def observe(
        self, rid: int, accepted: Sequence[int], tree: DraftTree, logits: torch.Tensor | None
    ) -> None:
        self._tails[rid].extend(int(t) for t in accepted)

    def stop(self, rid: int) -> None:
        self._tails.pop(rid, None)
        self._last.pop(rid, None)

    def last_step(self, rid: int) -> RetrievalStep:
        return self._last[rid]

    def _lookup(self, context: Sequence[int], max_nodes: int) -> tuple[int, DraftTree | None]:
        """(matched length, tree of at most max_nodes nodes or None)."""
        raise NotImplementedError

    def propose(self, rid: int, max_nodes: int) -> DraftTree:
        if max_nodes <= 0:
            self._last[rid] = RetrievalStep(0, 0)
            return DraftTree.empty()
        length, tree = self._lookup(self._tails[rid], max_nodes)
        if tree is None:
            tree = DraftTree.empty()
        self._last[rid] = RetrievalStep(length, len(tree))
        return tree


class RestDrafter(_RetrievalBase):
    """REST: retrieval from a suffix-array datastore at every step."""

    name = "rest"

    def __init__(
        self, datastore: str, config: RetrievalConfig, tokenizer_fingerprint: str | None = None,
        store: RestDatastore | None = None,
    ) -> None:
        super().__init__(datastore, tokenizer_fingerprint)
        self.config = config
        self.context_len = config.max_query
        self.store = store

    def _is_open(self) -> bool:
        return self.store is not None

    def _open(self, fingerprint: str, vocab_size: int | None) -> None:
        self.store = RestDatastore.open(self.datastore, expected_fingerprint=fingerprint,
                                        expected_vocab_size=vocab_size)

    def _lookup(self, context: Sequence[int], max_nodes: int) -> tuple[int, DraftTree | None]:
        assert self.store is not None
        length, tree = self.store.retrieve(list(context), self.config)
        return length, tree.truncate(max_nodes)


class CrestDrafter(_RetrievalBase):
    """CREST: the stored tree of the longest stored n-gram ending the text."""

    name = "crest"

    def __init__(
        self, datastore: str, *, table: str = DEFAULT_TABLE, max_n: int | None = None,
        tokenizer_fingerprint: str | None = None, store: TreeStore | None = None,
    ) -> None:
        super().__init__(datastore, tokenizer_fingerprint)
        self.table = table
        self.max_n = max_n
        self.context_len = 16 if max_n is None else max_n
        self.store = store

    def _is_open(self) -> bool:
        return self.store is not None

    def _open(self, fingerprint: str, vocab_size: int | None) -> None:
        self.store = open_tree_store(self.datastore, table=self.table,
                                     expected_fingerprint=fingerprint,
                                     expected_vocab_size=vocab_size)
        if self.max_n is None:
            self.context_len = max(int(n) for n in self.store.metadata["ns"])

    def _lookup(self, context: Sequence[int], max_nodes: int) -> tuple[int, DraftTree | None]:
        assert self.store is not None
        # The tail deque holds at most context_len tokens (the longest stored n).
        return self.store.longest(tuple(context), max_nodes)


def make_rest(
    *, datastore: str | os.PathLike[str] | RestDatastore, max_query: int = 16,
    min_query: int = 2, max_matches: int = 5000, depth: int = 10, tree_nodes: int = 64,
    tokenizer_fingerprint: str | None = None,
) -> RestDrafter:
    cfg = RetrievalConfig(max_query=max_query, min_query=min_query, max_matches=max_matches,
                          depth=depth, tree_nodes=tree_nodes)
    if isinstance(datastore, RestDatastore):
        return RestDrafter(datastore.path, cfg, tokenizer_fingerprint, store=datastore)
    return RestDrafter(os.fspath(datastore), cfg, tokenizer_fingerprint)


def make_crest(
    *, datastore: str | os.PathLike[str], table: str = DEFAULT_TABLE, max_n: int | None = None,
    tokenizer_fingerprint: str | None = None,
) -> CrestDrafter:
    if max_n is not None and max_n < 1:
        raise ValueError("max_n must be >= 1")
    return CrestDrafter(os.fspath(datastore), table=table, max_n=max_n,
                        tokenizer_fingerprint=tokenizer_fingerprint)
