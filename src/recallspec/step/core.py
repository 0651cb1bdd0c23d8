"""One speculative step: draft, verify, commit, tell the drafter, learn.

``speculative_step`` is the only implementation of a step; every decoding loop calls it
with its own ``Verifier``:

* the engine's native forward (``engine/runner.py: NativeVerifier``: one ragged forward
  of every request's root and tree, plus the step's prompt chunks),
* a transformers forward (``integrations/hf.py``: a 4D tree mask over a ``DynamicCache``),
* a teacher-forced replay of recorded greedy answers (``bench/replay/exact.py``: the accepted
  path is the longest tree path the recorded text continues).

Order inside a step, the same for all three: the planner drafts every sequence (a
drafter that raises fails its sequence only: it is not fed); a constrained sequence's
grammar cuts the nodes it forbids, appends the tokens it forces and gives every row its
mask (``StepSequence.constraint``: the drafter and its statistics see only the drafter's
own nodes as what it proposed); the verifier returns a
``Verdict`` per sequence (accepted nodes + bonus token); then, per verified sequence, the
planner learns from the verdict, the caller's ``commit`` appends the tokens its stop
rules allow, and the drafter observes what was committed. The caller applies failures
and keeps its own statistics from the returned ``Committed`` records.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import torch

from recallspec.decoding.masks import Constrained, Mask
from recallspec.decoding.tree import DraftTree
from recallspec.decoding.verify import Verdict
from recallspec.step.planner import DraftPlanner
from recallspec.step.sequence import StepSequence

S = TypeVar("S", bound=StepSequence)


@dataclass(frozen=True)
class Verified(Generic[S]):
    """One sequence's verification."""

    seq: S
    tree: DraftTree
    verdict: Verdict
    # [1 + len(tree), V]: the root's row, then each node's; None where nothing read them.
    logits: torch.Tensor | None = None
    # What a drafter that learns from logits observes instead of (tree, logits), where
    # the verifier knows only some rows (the replay: the committed path as a chain).
    observed: tuple[DraftTree, torch.Tensor] | None = None


class Verifier(Protocol[S]):
    def verify(
        self, seqs: Sequence[S], trees: Sequence[DraftTree], masks: Sequence[Mask | None],
    ) -> tuple[list[Verified[S]], list[tuple[S, Exception]]]:
        """Each sequence's verdict on its tree (in order), and the sequences whose
        verification raised. ``masks[i]``: sequence i's grammar masks, one row per logits
        row (``decoding/masks.py``), None when it is free; a verifier whose sequences are
        never constrained may ignore them. Called once per step, also with no sequences
        (the engine's forward may carry prompt chunks alone)."""
        ...


@dataclass(frozen=True)
class Committed(Generic[S]):
    seq: S
    tree: DraftTree  # the tree verified
    verdict: Verdict
    taken: list[int]  # tokens committed (the verdict's, cut by the caller's stop rules)
    # The verified rows (``Verified.logits``): token j of ``taken`` was chosen from row
    # ``verdict.rows[j]`` (what its log-probability is read from); None where not read.
    logits: torch.Tensor | None = None
    masks: Mask | None = None  # the rows' grammar masks (None: free)
    drafted: int = 0  # the tree's first nodes, the drafter's; the rest the grammar forced
    cut: int = 0  # drafter nodes the grammar forbade, never verified

    @property
    def forced_accepted(self) -> int:
        """Accepted nodes that the grammar forced (not the drafter's)."""
        return sum(n >= self.drafted for n in self.verdict.accepted_nodes)


@dataclass(frozen=True)
class StepOutcome(Generic[S]):
    committed: list[Committed[S]]  # verified sequences, in input order
    failed: list[tuple[S, Exception]]  # drafting, verification or observing raised
    draft_s: float  # seconds spent drafting (proposals, sizing and grammars)
    grammar_s: float = 0.0  # of them, seconds the grammars took (cuts, forced tokens, masks)
    grammar_rows: int = 0  # rows masked (each constrained sequence's root and nodes)


def tell_drafter(
    seq: StepSequence, taken: Sequence[int], tree: DraftTree, logits: torch.Tensor | None,
    observed: tuple[DraftTree, torch.Tensor] | None = None,
) -> Exception | None:
    """``drafter.observe`` of committed tokens (logits only for a drafter that reads
    them; ``observed`` replaces the tree and logits for such a drafter); returns what it
    raised, if anything (the sequence fails, the others go on)."""
    d = seq.drafter
    try:
        if d.needs_logits and observed is not None:
            d.observe(seq.rid, list(taken), *observed)
        else:
            d.observe(seq.rid, list(taken), tree, logits if d.needs_logits else None)
    except Exception as e:
        return e
    return None


def speculative_step(
    planner: DraftPlanner, seqs: Sequence[S], rooms: Sequence[int], verifier: Verifier[S],
    commit: Callable[[S, list[int]], list[int]],
) -> StepOutcome[S]:
    """Draft (``rooms[i]``: draft nodes sequence i has room for), verify, commit and
    learn, in the order of the module docstring. ``commit(seq, tokens)`` appends what
    its stop rules allow and returns those tokens."""
    t0 = time.perf_counter()
    trees, failed = planner.plan(seqs, rooms)
    bad = {id(s) for s, _ in failed}
    live = [(s, t, r) for s, t, r in zip(seqs, trees, rooms, strict=True) if id(s) not in bad]
    t_grammar = time.perf_counter()
    constrained: list[Constrained | None] = [None] * len(live)
    grammar_s = 0.0
    if any(s.constraint is not None for s, _, _ in live):
        constrained, not_constrained = planner.constrain(
            [s for s, _, _ in live], [t for _, t, _ in live], [r for _, _, r in live])
        failed += not_constrained
        grammar_s = time.perf_counter() - t_grammar
        bad = {id(s) for s, _ in not_constrained}
        kept = [(s, t, c) for (s, t, _), c in zip(live, constrained, strict=True)
                if id(s) not in bad]
    else:
        kept = [(s, t, None) for s, t, _ in live]
    constrained_of = {id(s): c for s, _, c in kept if c is not None}
    proposed = {id(s): t for s, t, _ in kept}  # the drafter's trees, as sized
    masks = [None if c is None else c.masks for _, _, c in kept]
    grammar_rows = sum(len(m) for m in masks if m is not None)
    draft_s = time.perf_counter() - t0
    verified, not_verified = verifier.verify(
        [s for s, _, _ in kept], [t if c is None else c.tree for _, t, c in kept], masks)
    failed += not_verified
    committed: list[Committed[S]] = []
    for v in verified:
        c = constrained_of.get(id(v.seq))
        accepted = v.verdict.accepted_nodes
        own, cut = (len(v.tree), 0) if c is None else (c.drafted, c.cut)
        if c is not None:  # the drafter's statistics learn from its own tree, as sized:
            planner.observe_forced(c, accepted)  # a cut node there was reached and rejected
            planner.observe(v.seq, proposed[id(v.seq)],
                            tuple(c.kept[n] for n in accepted if n < own))
        else:
            planner.observe(v.seq, v.tree, accepted)  # sized in this context
        taken = commit(v.seq, list(v.verdict.tokens))
        err = tell_drafter(v.seq, taken, v.tree, v.logits, v.observed)
        if err is not None:
            failed.append((v.seq, err))
        committed.append(Committed(v.seq, v.tree, v.verdict, taken, v.logits,
                                   None if c is None else c.masks, own, cut))
    return StepOutcome(committed, failed, draft_s, grammar_s, grammar_rows)
