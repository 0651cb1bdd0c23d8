"""SAM-Decoding drafters: ``sam`` and ``sam+recycling`` (SAM-Decoding[T]).

Per request the drafter keeps a dynamic suffix automaton over prompt + committed
text and, with a corpus index (``index=path``), a match cursor over the static
automaton; both advance on every committed token, so each step's match lengths are
O(1) to read:

* ``l_d`` - the longest suffix of the text that occurred *earlier* in the text,
* ``l_s`` - the longest suffix of the text that occurs in the corpus.

A third kind of source comes from the engine, not the options: the request's *recall
view* (``DrafterContext.recall``): its tenant's response memory (past outputs, source
``memory``) and the live corpora (source ``corpus``), static automata that appear and
disappear while the request runs. One cursor per source follows the committed text
(``recall/request_cursors.py``); ``l_m`` is the match of the best of them. The external
match ``l_x`` is ``l_s`` or ``l_m``, whichever exceeds its delta (below) more.

``sam`` drafts from that external automaton only when ``l_x > l_d + delta_x``, else
from the dynamic one; a draft is a chain of up to ``max_tokens`` tokens (or, with
``tree=True``, the external automaton's most frequent continuations as a tree).
``delta_x`` is the static index's delta rule: a corpus match (the index, a live
corpus) must be clearly longer to beat the request's own text, ``delta``; a memory
match need only be longer, ``memory_delta`` (default 0): the memory holds the tenant's
own earlier answers, which a request continues as readily as its own text. (Replaying
recorded answers with converged cost-aware sizing: on repeated sampling of GSM8K
questions delta 0 let memory draft on many more steps than delta 5 and gained more over
no memory; on unrelated Spec-Bench prompts sharing one memory it changes nothing; on
prompts asked again, greedy, it beats delta 5.) Of several external sources, the one
whose match exceeds its delta most wins (the static index on ties, then the newest memory
segment).

``sam+recycling`` (Algorithm 2 of SAM-Decoding): when ``max(l_d, l_x - delta_x) >=
tau`` the automaton's draft as above, else the Token Recycling tree. The recycling
table is refreshed from every verification, whichever source drafted.

``context(rid)`` (the cost-aware sizing's draft context, ``drafters/base.py``) names the
source the next proposal will use and a bucket of the match length it rests on
(``length_bucket``): acceptance of copied text rises steeply with the match length.

``last_step(rid)`` / ``last_source(rid)`` report the latest proposal's match lengths
and source; ``source_counts`` counts proposals per source over the instance's life.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from recallspec.decoding.tree import DraftTree
from recallspec.drafters.base import Drafter, DrafterContext, no_recall
from recallspec.drafters.recycling import TOPK, RecyclingDrafter
from recallspec.recall.automata import DynamicAutomaton, MatchCursor, StaticIndex
from recallspec.recall.automata._arrays import as_tokens
from recallspec.recall.request_cursors import RecallCursors
from recallspec.recall.view import CORPUS, MEMORY, RecallView

# Where a proposal came from.
NONE, DYNAMIC, STATIC, RECYCLING, MODEL = "none", "dynamic", "static", "recycling", "model"
# context = source index * buckets + bucket (new sources go last: earlier indices stay)
SOURCES = (NONE, DYNAMIC, STATIC, RECYCLING, MODEL, MEMORY, CORPUS)
EXTERNAL = (STATIC, MEMORY, CORPUS)  # sources read through a MatchCursor (the delta rule)
# Match-length bucket edges: 0 | 1 | 2-3 | 4-7 | 8-15 | 16-31 | 32+.
_BUCKET_EDGES = (1, 2, 4, 8, 16, 32)
N_BUCKETS = len(_BUCKET_EDGES) + 1


def length_bucket(length: int) -> int:
    """The bucket of a match length (0 for no match, N_BUCKETS - 1 for >= 32): how many
    edges it reaches."""
    return bisect_right(_BUCKET_EDGES, length)


@dataclass(frozen=True)
class SamOptions:
    index: str | None = None  # static corpus index file; None = dynamic automaton only
    max_tokens: int = 40  # draft size cap (chain length or tree nodes, recycling's too)
    delta: int = 5  # static (or live corpus) draft only if l_s > l_d + delta
    memory_delta: int = 0  # response memory draft only if l_m > l_d + memory_delta
    tree: bool = False  # static drafts as the corpus frequency tree instead of a chain
    dynamic: bool = True  # False: ignore the request's own automaton (Table 3 ablation)
    tokenizer_fingerprint: str | None = None  # expected by the index (else from the engine)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.delta < 0 or self.memory_delta < 0:
            raise ValueError("delta and memory_delta must be >= 0")


@dataclass(frozen=True)
class SamStep:
    """One proposal's statistics."""

    source: str  # one of SOURCES
    dynamic_length: int  # l_d
    static_length: int  # l_s (0 without an index)
    draft_nodes: int
    # l_m: the best response-memory or live-corpus match (``recall/request_cursors.py``)
    memory_length: int = 0


@dataclass
class _State:
    dyn: DynamicAutomaton  # invariant: holds exactly prompt + committed tokens
    cursor: MatchCursor | None  # static match of the same text
    recall: RecallCursors  # memory and live-corpus matches of the same text
    last: SamStep


class SamDrafter(Drafter):
    """Suffix-automaton drafts (see the module docstring)."""

    name = "sam"
    needs_logits = False
    contexts = len(SOURCES) * N_BUCKETS
    auxiliary: str | None = None  # subclasses: the source of the drafter used below tau
    tau = 0

    def __init__(self, options: SamOptions, static: StaticIndex | None = None) -> None:
        self.options = options
        self.static = static
        self._states: dict[int, _State] = {}
        self.source_counts: Counter[str] = Counter()
        self._recall: Callable[[int], RecallView] = no_recall  # the engine's, once bound

    # -- the static index: opened once, checked against the target's tokenizer ----
    def bind(self, ctx: DrafterContext) -> None:
        """Engine hook: open the index with the target tokenizer's fingerprint check;
        keep the engine's recall view (response memory, live corpora)."""
        self._recall = ctx.recall
        if self.options.index is not None and self.static is None:
            fp = ctx.tokenizer_fingerprint or self.options.tokenizer_fingerprint
            if fp is None:
                raise ValueError(f"index {self.options.index!r}: the tokenizer has no fingerprint")
            self.static = StaticIndex.open(
                self.options.index,
                expected_fingerprint=fp,
                expected_vocab_size=ctx.vocab_size,
            )

    def _static_index(self) -> StaticIndex | None:
        if self.static is None and self.options.index is not None:
            fp = self.options.tokenizer_fingerprint
            if fp is None:
                raise ValueError(
                    f"index {self.options.index!r}: pass tokenizer_fingerprint=... or create "
                    "the drafter through an Engine so the index can be checked"
                )
            self.static = StaticIndex.open(self.options.index, expected_fingerprint=fp)
        return self.static

    # -- lifecycle ---------------------------------------------------------------
    def start(self, rid: int, prompt: Sequence[int]) -> None:
        static = self._static_index()
        cursor = static.cursor() if static is not None else None
        ids = as_tokens(prompt)
        if cursor is not None:
            cursor.advance(ids)
        margins = {MEMORY: self.options.memory_delta, CORPUS: self.options.delta}
        st = _State(DynamicAutomaton(ids), cursor, RecallCursors(margins),
                    SamStep(NONE, 0, 0, 0))
        st.recall.refresh(self._recall(rid), lambda: ids)
        self._states[rid] = st

    def propose(self, rid: int, max_nodes: int) -> DraftTree:
        st = self._states[rid]
        tree, source, _ = self._automaton_draft(st, max_nodes)
        return self._record(st, tree, source)

    def observe(
        self, rid: int, accepted: Sequence[int], tree: DraftTree, logits: torch.Tensor | None
    ) -> None:
        if not accepted:
            return
        st = self._states[rid]
        ids = as_tokens(accepted)  # converted once for every automaton and cursor
        st.dyn.extend(ids)
        if st.cursor is not None:
            st.cursor.advance(ids)
        st.recall.advance(ids)
        # Sources that appeared meanwhile start from the text's tail (recall/request_cursors.py).
        st.recall.refresh(self._recall(rid), lambda: st.dyn.tokens)

    def stop(self, rid: int) -> None:
        self._states.pop(rid, None)

    def context(self, rid: int) -> int:
        """The next proposal's source and the bucket of its match length."""
        st = self._states[rid]
        source, length = self._next_source(st)
        return SOURCES.index(source) * N_BUCKETS + length_bucket(length)

    def _next_source(self, st: _State) -> tuple[str, int]:
        """The source ``propose`` will draft from and the match length it uses (an
        empty automaton draft, which falls back to the auxiliary, aside)."""
        if self._auxiliary_turn(st):
            return str(self.auxiliary), max(self._lengths(st))
        return self._automaton_source(st)

    # -- statistics --------------------------------------------------------------
    def last_step(self, rid: int) -> SamStep:
        return self._states[rid].last

    def last_source(self, rid: int) -> str:
        return self._states[rid].last.source

    # -- drafting ----------------------------------------------------------------
    def _dynamic_length(self, st: _State) -> int:
        """``l_d`` (0 when the options ignore the request's own automaton)."""
        return st.dyn.match_length if self.options.dynamic else 0

    def _lengths(self, st: _State) -> tuple[int, int]:
        """``l_d`` and the external match ``l_x`` (static index, memory, corpora)."""
        return self._dynamic_length(st), self._external(st)[1]

    def _delta(self, source: str) -> int:
        """How much longer than ``l_d`` a match of this external source must be."""
        return self.options.memory_delta if source == MEMORY else self.options.delta

    def _external(self, st: _State) -> tuple[str, int, MatchCursor | None]:
        """The external source whose match exceeds its delta most: (source, length,
        cursor); the static index wins ties, then the newest memory segment, then the
        corpora."""
        best: tuple[str, int, MatchCursor | None] = (NONE, 0, None)
        score = 0
        if st.cursor is not None:
            best = (STATIC, st.cursor.match_length, st.cursor)
            score = best[1] - self.options.delta
        rc = st.recall
        if rc.best is not None:
            kind = rc.best[0].kind
            if best[2] is None or rc.best_length - rc.margin(kind) > score:
                best = (kind, rc.best_length, rc.best[1])
        return best

    def _automaton_match(self, st: _State) -> tuple[str, int, MatchCursor | None]:
        """The automaton to draft from, its match length and (an external one's) cursor:
        the external one if ``l_x > l_d + delta_x``, else the dynamic one; none without
        an earlier occurrence (``l_d`` = 0: nothing to copy)."""
        l_d = self._dynamic_length(st)
        source, l_x, cursor = self._external(st)
        if cursor is not None and l_x > l_d + self._delta(source):
            return source, l_x, cursor
        return (DYNAMIC, l_d, None) if l_d > 0 else (NONE, 0, None)

    def _automaton_source(self, st: _State) -> tuple[str, int]:
        """``_automaton_match`` without the cursor."""
        source, length, _ = self._automaton_match(st)
        return source, length

    def _auxiliary_turn(self, st: _State) -> bool:
        """SAM-Decoding[T]'s switch: the auxiliary drafter (if any) drafts when
        ``max(l_d, l_x - delta_x) < tau``."""
        if self.auxiliary is None:
            return False
        source, l_x, _ = self._external(st)
        return max(self._dynamic_length(st), l_x - self._delta(source)) < self.tau

    def _automaton_draft(self, st: _State, max_nodes: int) -> tuple[DraftTree, str, int]:
        """The draft of the automaton ``_automaton_match`` picks, its source and the
        match length it rests on (NONE and 0 when nothing may be drafted)."""
        n = min(self.options.max_tokens, max_nodes)
        if n <= 0:
            return DraftTree.empty(), NONE, 0
        source, length, cursor = self._automaton_match(st)
        if cursor is not None:  # an EXTERNAL source
            if self.options.tree:
                return cursor.draft_tree(n), source, length
            return DraftTree.chain(cursor.draft_chain(n)), source, length
        if source == DYNAMIC:
            return DraftTree.chain(st.dyn.draft_chain(n)), DYNAMIC, length
        return DraftTree.empty(), NONE, 0

    def _automaton_or(
        self, rid: int, max_nodes: int, auxiliary: Callable[[], DraftTree]
    ) -> DraftTree:
        """SAM-Decoding[T] (Algorithm 2): the automaton's draft unless it is the auxiliary
        drafter's turn (``_auxiliary_turn``) or the automaton's draft is empty, else
        ``auxiliary()`` (recorded under ``self.auxiliary``)."""
        st = self._states[rid]
        if not self._auxiliary_turn(st):
            tree, src, _ = self._automaton_draft(st, max_nodes)
            if len(tree):
                return self._record(st, tree, src)
        return self._record(st, auxiliary(), str(self.auxiliary))

    def _record(self, st: _State, tree: DraftTree, source: str) -> DraftTree:
        l_d = self._dynamic_length(st)
        l_s = st.cursor.match_length if st.cursor is not None else 0
        if len(tree) == 0:
            source = NONE
        st.last = SamStep(source, l_d, l_s, len(tree), st.recall.best_length)
        self.source_counts[source] += 1
        return tree


class SamRecyclingDrafter(SamDrafter):
    """SAM-Decoding[T]: automaton drafts for long matches, Token Recycling otherwise."""

    name = "sam+recycling"
    needs_logits = True  # the recycling table learns from every verification
    offers_candidates = True  # the automaton's draft or the recycling tree
    auxiliary = RECYCLING

    def __init__(
        self, options: SamOptions, *, tau: int = 5, template: str = "sam60", k: int = TOPK,
        static: StaticIndex | None = None,
    ) -> None:
        super().__init__(options, static)
        if tau < 0:
            raise ValueError("tau must be >= 0")
        self.tau = tau
        self.recycling = RecyclingDrafter(template=template, k=k)

    def start(self, rid: int, prompt: Sequence[int]) -> None:
        super().start(rid, prompt)
        self.recycling.start(rid, prompt)

    def propose(self, rid: int, max_nodes: int) -> DraftTree:
        n = min(max_nodes, self.options.max_tokens)  # the draft size cap holds for trees too
        return self._automaton_or(rid, max_nodes, lambda: self.recycling.propose(rid, n))

    def candidates(self, rid: int, max_nodes: int) -> list[tuple[int, DraftTree]]:
        """Cost-aware sizing (``step/planner.py``): the automaton's draft and the
        recycling tree, each with its draft context, for the planner to pick by expected
        tokens per second instead of the fixed ``tau`` switch (which keeps matches of 1-4
        tokens from the automaton even where they pay; the sizing can always draft 0).
        Not counted in ``source_counts``."""
        st = self._states[rid]
        out: list[tuple[int, DraftTree]] = []
        tree, source, length = self._automaton_draft(st, max_nodes)
        if len(tree):
            out.append((SOURCES.index(source) * N_BUCKETS + length_bucket(length), tree))
        rec = self.recycling.propose(rid, min(max_nodes, self.options.max_tokens))
        if len(rec):
            ctx = SOURCES.index(RECYCLING) * N_BUCKETS + length_bucket(max(self._lengths(st)))
            out.append((ctx, rec))
        return out

    def observe(
        self, rid: int, accepted: Sequence[int], tree: DraftTree, logits: torch.Tensor | None
    ) -> None:
        super().observe(rid, accepted, tree, logits)
        self.recycling.observe(rid, accepted, tree, logits)

    def stop(self, rid: int) -> None:
        super().stop(rid)
        self.recycling.stop(rid)


def sam_options(index: str | os.PathLike[str] | StaticIndex | None, **kw: Any) -> tuple[
    SamOptions, StaticIndex | None
]:
    if isinstance(index, StaticIndex):
        return SamOptions(index=index.path, **kw), index
    return SamOptions(index=None if index is None else os.fspath(index), **kw), None


def make_sam(
    *, index: str | os.PathLike[str] | StaticIndex | None = None, max_tokens: int = 40,
    delta: int = 5, memory_delta: int = 0, tree: bool = False, dynamic: bool = True,
    tokenizer_fingerprint: str | None = None,
) -> SamDrafter:
    opts, static = sam_options(index, max_tokens=max_tokens, delta=delta,
                            memory_delta=memory_delta, tree=tree, dynamic=dynamic,
                            tokenizer_fingerprint=tokenizer_fingerprint)
    return SamDrafter(opts, static)


def make_sam_recycling(
    *, index: str | os.PathLike[str] | StaticIndex | None = None, max_tokens: int = 40,
    delta: int = 5, memory_delta: int = 0, tau: int = 5, tree: bool = False,
    template: str = "sam60", k: int = TOPK, dynamic: bool = True,
    tokenizer_fingerprint: str | None = None,
) -> SamRecyclingDrafter:
    opts, static = sam_options(index, max_tokens=max_tokens, delta=delta,
                            memory_delta=memory_delta, tree=tree, dynamic=dynamic,
                            tokenizer_fingerprint=tokenizer_fingerprint)
    return SamRecyclingDrafter(opts, tau=tau, template=template, k=k, static=static)
