"""A request's grammar state: masks for a draft tree, forced chains, commits.

``GrammarConstraint`` wraps one llguidance matcher (a copy of a compiled prototype,
``compile.py``) that stands after the request's committed tokens, and implements
``step/sequence.py: Constraint``. Consuming a token its mask forbids would put the matcher
in a permanent error state, so every consume here follows a check of the parent's row.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import llguidance as llg
import numpy as np

from recallspec.decoding.masks import Constrained, Mask, allowed, words
from recallspec.decoding.tree import DraftTree, limit_depth
from recallspec.errors import DataError


class GrammarError(DataError):
    """A guide that does not compile, or a grammar over the parser's limits (a 400)."""


@dataclass(frozen=True)
class RowLayout:
    """How a matcher's rows map onto the model's logits. ``vocab_size``: the logits'
    width (the model's, >= ``tokenizer_vocab``, llguidance's vocabulary; the tokens between
    are always forbidden). ``eos_token``: the matcher's one EOS, one of ``eos_ids`` (where
    the engine ends a request), each of which mirrors its bit in every row."""

    vocab_size: int
    tokenizer_vocab: int
    eos_token: int
    eos_ids: frozenset[int]

    def __post_init__(self) -> None:
        if self.eos_token not in self.eos_ids or not 0 <= min(self.eos_ids) <= max(
                self.eos_ids) < self.tokenizer_vocab <= self.vocab_size:
            raise GrammarError(f"the tokenizer and the model disagree on the vocabulary "
                               f"(inconsistent row layout {self})")


def too_complex(reason: str) -> bool:
    """Whether llguidance's error is a resource limit (not a mistake in the grammar)."""
    return "limit" in reason.lower()


def grammar_error(reason: str, kind: str = "") -> GrammarError:
    """llguidance's reason as the error a client reads (``kind``: the guide's, if known)."""
    reason = reason.strip()
    if too_complex(reason):
        return GrammarError(f"grammar too complex: {reason}")
    return GrammarError(f"invalid {kind} guide: {reason}" if kind else f"grammar error: {reason}")


def _depth_kept(tree: DraftTree, max_depth: int) -> list[int]:
    """The indices of ``tree``'s nodes ``limit_depth(tree, max_depth)`` keeps, in order."""
    depth: list[int] = []
    for p in tree.parents.tolist():
        depth.append(1 if p < 0 else depth[p] + 1)
    return [i for i, d in enumerate(depth) if d <= max_depth]


class GrammarConstraint:
    """One request's grammar state, after its committed tokens. Invariants: ``constrain``
    leaves the state where it was; each row has ``words(vocab_size)`` words, its bits past
    the tokenizer's vocabulary are 0, and all EOS ids share the matcher EOS's bit. A parser
    step limit hit while filling a row raises GrammarError ("grammar too complex"); the
    matcher is then broken for good (its request must end). Not thread-safe: one owner."""

    def __init__(self, matcher: llg.LLMatcher, layout: RowLayout) -> None:
        self._m = matcher
        self._layout = layout
        self._words = words(layout.vocab_size)
        self._tok_words = words(layout.tokenizer_vocab)
        tail = layout.tokenizer_vocab % 32
        self._tail = np.uint32((1 << tail) - 1) if tail else None
        by_word: dict[int, int] = {}
        for t in layout.eos_ids:
            by_word[t >> 5] = by_word.get(t >> 5, 0) | (1 << (t & 31))
        self._eos_words = np.asarray(sorted(by_word), np.int64)
        self._eos_bits = np.asarray([by_word[w] for w in sorted(by_word)], np.uint32)
        self.mask_seconds = 0.0  # total time spent filling mask rows
        self.mask_rows = 0  # rows filled

    def is_accepting(self) -> bool:
        """Whether the committed text is a complete match (EOS is allowed)."""
        return bool(self._m.is_accepting())

    def is_stopped(self) -> bool:
        """Whether nothing but EOS may follow."""
        return bool(self._m.is_stopped())

    def root_mask(self) -> Mask:
        """The mask row of the next token ([words(V)]), e.g. the first after a prefill."""
        return self._fill()

    def advance(self, tokens: list[int]) -> None:
        """Commit ``tokens`` (any EOS id counts as the matcher's EOS). A forbidden token
        raises RuntimeError (a bug: the engine samples under the masks), the state unchanged.
        EOS goes through ``consume_token`` where the state accepts (``try_consume_tokens``
        refuses it once the grammar is stopped), other tokens through ``try_consume_tokens``
        (unlike ``consume_token``, it refuses without breaking the matcher). A stopped
        matcher records no history for an EOS, so undoing one there rolls back nothing."""
        undo = 0
        for i, t in enumerate(tokens):
            step = 1
            if t in self._layout.eos_ids:
                step = 0 if self._m.is_stopped() else 1
                ok = self._m.is_accepting() and self._m.consume_token(self._layout.eos_token)
            else:
                ok = (0 <= t < self._layout.tokenizer_vocab
                      and self._m.try_consume_tokens([int(t)]) == 1)
            self._check()  # a parser limit hit on the way: the grammar's fault, not a bug
            if not ok:
                self._m.rollback(undo)
                raise RuntimeError(f"the grammar forbids token {t} at position {i} of "
                                   f"the committed tokens {tokens}")
            undo += step

    def constrain(self, tree: DraftTree, room: int, depth_limit: int) -> Constrained:
        """``tree`` under the grammar, depth-first from the current state: a node whose
        parent's row forbids its token is cut with its subtree (``cut``); nodes deeper than
        ``depth_limit`` are dropped first, and past ``room`` kept ones the rest (a prefix of
        the drafter's order: still a tree); neither counts as cut. An EOS node's subtree is
        cut (nothing follows an EOS) and its row allows EOS only (what the matcher says
        after one), without consuming it: a stopped matcher records no history for an EOS,
        so ``rollback(1)`` would undo the token before it. Then at each kept leaf (at the
        root when none is kept) the forced tokens (``compute_ff_tokens``) go below it as a
        chain, each allowed by its parent's row, in leaf order, after every drafter node,
        while the room and the depth limit last. Rows: the root's, then each node's."""
        root = self._fill()
        if room <= 0 or depth_limit <= 0:
            return Constrained(DraftTree.empty(), root[None], 0, 0)
        deep = limit_depth(tree, depth_limit)
        # The drafter's index of each node of ``deep`` (nodes keep their order).
        index = _depth_kept(tree, depth_limit) if deep is not tree else range(len(tree))
        tree = deep
        toks, par = tree.tokens.tolist(), tree.parents.tolist()
        children = tree.children()
        size, depth = [1] * len(toks), [1] * len(toks)
        for i in range(len(toks) - 1, -1, -1):
            if par[i] >= 0:
                size[par[i]] += size[i]
        for i, p in enumerate(par):
            depth[i] = 1 if p < 0 else depth[p] + 1
        rows: dict[int, Mask] = {}
        chains: dict[int, tuple[list[int], list[Mask]]] = {}  # leaf -> forced tokens, rows
        has_child = [False] * len(toks)
        cut = 0
        # (node, its parent's row) to enter; (node, None) to leave, after its subtree.
        stack: list[tuple[int, Mask | None]] = [(c, root) for c in reversed(children[0])]
        while stack:
            node, parent_row = stack.pop()
            if parent_row is None:  # leave: a leaf's chain, then back to its parent's state
                if not has_child[node]:  # (at most the room the kept nodes leave)
                    chains[node] = self._chain(rows[node], min(
                        room - len(rows), depth_limit - depth[node]))
                self._m.rollback(1)
                continue
            t = toks[node]
            if not (0 <= t < self._layout.vocab_size and allowed(parent_row, t)):
                cut += size[node]
                continue
            if par[node] >= 0:
                has_child[par[node]] = True
            if t in self._layout.eos_ids:
                rows[node] = self._eos_row()
                cut += size[node] - 1
                continue
            self._consume(t)
            rows[node] = self._fill()
            stack.append((node, None))
            stack.extend((c, rows[node]) for c in reversed(children[node + 1]))
        kept = sorted(rows)[:room]
        new = {old: i for i, old in enumerate(kept)}
        out_toks = [toks[i] for i in kept]
        out_par = [-1 if par[i] < 0 else new[par[i]] for i in kept]
        out_rows = [root] + [rows[i] for i in kept]
        leaves = [(new[i], chains[i]) for i in kept if i in chains]
        if not kept:
            leaves = [(-1, self._chain(root, min(room, depth_limit)))]
        for parent, (forced, forced_rows) in leaves:
            for j in range(min(len(forced), room - len(out_toks))):
                out_par.append(parent if j == 0 else len(out_toks) - 1)
                out_toks.append(forced[j])
                out_rows.append(forced_rows[j])
        return Constrained(DraftTree.from_lists(out_toks, out_par), np.stack(out_rows),
                           len(kept), cut, tuple(index[i] for i in kept))

    def _chain(self, row: Mask, limit: int) -> tuple[list[int], list[Mask]]:
        """The forced tokens of the current state (at most ``limit``), each allowed by the
        row before it, and their rows; the state is left where it was."""
        if limit <= 0:
            return [], []
        forced = self._m.compute_ff_tokens()
        self._check()
        toks: list[int] = []
        rows: list[Mask] = []
        for f in forced[:limit]:
            if not (0 <= f < self._layout.tokenizer_vocab and allowed(row, f)):
                break
            toks.append(f)
            if f in self._layout.eos_ids:  # not consumed (see ``constrain``)
                rows.append(self._eos_row())
                break
            self._consume(f)
            row = self._fill()
            rows.append(row)
        consumed = len(toks) - (1 if toks and toks[-1] in self._layout.eos_ids else 0)
        if consumed:
            self._m.rollback(consumed)
        return toks, rows

    def _consume(self, token: int) -> None:
        """Consume a non-EOS token its parent's row allows (a refusal then is a bug)."""
        if not self._m.consume_token(token):
            raise RuntimeError(f"the matcher refused token {token} that its mask allowed: "
                               f"{self._m.get_error()}")

    def _check(self) -> None:
        """A matcher in its error state here hit a step limit of the parser."""
        if self._m.is_error():
            raise grammar_error(self._m.get_error())

    def _eos_row(self) -> Mask:
        """The row after an EOS: EOS only."""
        row = np.zeros(self._words, np.int32)
        row.view(np.uint32)[self._eos_words] = self._eos_bits
        return row

    def _fill(self) -> Mask:
        """The current state's row: llguidance's mask, then the padding and EOS bits."""
        row = np.zeros(self._words, np.int32)
        t0 = time.perf_counter()
        self._m.unsafe_compute_mask_ptr(row.ctypes.data, self._tok_words * 4)
        self.mask_seconds += time.perf_counter() - t0
        self.mask_rows += 1
        self._check()
        u = row.view(np.uint32)
        if self._tail is not None:
            u[self._tok_words - 1] &= self._tail
        if allowed(row, self._layout.eos_token):
            u[self._eos_words] |= self._eos_bits
        else:
            u[self._eos_words] &= ~self._eos_bits
        return row
