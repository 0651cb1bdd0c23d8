"""What the step core needs of a decoding sequence, whoever owns it.

An engine ``Request``, a row of a transformers ``generate`` call and a replayed answer
each satisfy ``StepSequence``. Invariant at the start of a step: the drafter's view of
sequence ``rid`` is its whole committed text (``drafters/base.py``), and
``cached_length`` tokens of it are in the sequence's KV cache (all but the last).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from recallspec.cost.sizing import AcceptanceStats
from recallspec.decoding.masks import Constrained
from recallspec.decoding.tree import DraftTree
from recallspec.drafters.base import Drafter
from recallspec.params import Sizing


@dataclass
class DraftState:
    """Adaptive sizing's per-sequence state (``planner.DraftPlanner``)."""

    stats: AcceptanceStats | None = None  # this sequence's acceptance statistics
    idle_steps: int = 0  # steps since this sequence last drafted
    probing: bool = False  # this step's draft is a forced 1-node probe


class Constraint(Protocol):
    """A request's grammar state (``grammar/matcher.py``): it stands after the committed
    tokens. Invariant: ``constrain`` leaves it where it was."""

    def constrain(self, tree: DraftTree, room: int, depth_limit: int) -> Constrained:
        """``tree`` with every node the grammar forbids cut (with its subtree), and the
        tokens the grammar forces appended below the root and the leaves as chains (at
        most ``room`` nodes in all, none deeper than ``depth_limit``); each row's mask."""
        ...

    def advance(self, tokens: list[int]) -> None:
        """Commit ``tokens`` (an EOS included). A token the grammar forbids raises."""
        ...


class StepSequence(Protocol):
    @property
    def rid(self) -> int:
        """The id its drafter knows it by."""
        ...

    @property
    def drafter(self) -> Drafter: ...

    @property
    def sizing(self) -> Sizing:
        """"adaptive": the planner sizes its drafts; "fixed": cut to the room."""
        ...

    @property
    def draft(self) -> DraftState: ...

    @property
    def depth_limit(self) -> int:
        """The deepest draft worth verifying: tokens it may still commit, minus the
        bonus token (a deeper path would be cut when committed)."""
        ...

    @property
    def constraint(self) -> Constraint | None:
        """Its grammar, if its output is constrained (None: free)."""
        ...

    @property
    def cached_length(self) -> int:
        """Tokens in its KV cache before this step (what its rows attend to)."""
        ...
