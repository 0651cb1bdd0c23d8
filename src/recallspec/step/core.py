"""One speculative step: draft, verify, commit, tell the drafter, learn.

``speculative_step`` is the only implementation of a step; every decoding loop calls it
with its own ``Verifier``:

* the engine's native forward (``engine/runner.py: NativeVerifier``: one ragged forward
  of every request's root and tree, plus the step's prompt chunks),
* a transformers forward (``integrations/hf.py``: a 4D tree mask over a ``DynamicCache``),
* a teacher-forced replay of recorded greedy answers (``bench/replay/exact.py``: the accepted
  path is the longest tree path the recorded text continues).

Order inside a step, the same for all three: the planner drafts every sequence (a
drafter that raises fails its sequence only: it is not fed); the verifier returns a
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
        self, seqs: Sequence[S], trees: Sequence[DraftTree]
    ) -> tuple[list[Verified[S]], list[tuple[S, Exception]]]:
        """Each sequence's verdict on its tree (in order), and the sequences whose
        verification raised. Called once per step, also with no sequences (the engine's
        forward may carry prompt chunks alone)."""
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


@dataclass(frozen=True)
class StepOutcome(Generic[S]):
    committed: list[Committed[S]]  # verified sequences, in input order
    failed: list[tuple[S, Exception]]  # drafting, verification or observing raised
    draft_s: float  # seconds spent drafting (proposals and sizing)


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
    draft_s = time.perf_counter() - t0
    bad = {id(s) for s, _ in failed}
    live = [(s, t) for s, t in zip(seqs, trees, strict=True) if id(s) not in bad]
    verified, not_verified = verifier.verify([s for s, _ in live], [t for _, t in live])
    failed += not_verified
    committed: list[Committed[S]] = []
    for v in verified:
        planner.observe(v.seq, v.tree, v.verdict.accepted_nodes)  # sized in this context
        taken = commit(v.seq, list(v.verdict.tokens))
        err = tell_drafter(v.seq, taken, v.tree, v.logits, v.observed)
        if err is not None:
            failed.append((v.seq, err))
        committed.append(Committed(v.seq, v.tree, v.verdict, taken, v.logits))
    return StepOutcome(committed, failed, draft_s)
