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
from recallspec.drafters.base import Drafter
from recallspec.params import Sizing


@dataclass
class DraftState:
    """Adaptive sizing's per-sequence state (``planner.DraftPlanner``)."""

    stats: AcceptanceStats | None = None  # this sequence's acceptance statistics
    idle_steps: int = 0  # steps since this sequence last drafted
    probing: bool = False  # this step's draft is a forced 1-node probe


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
    def cached_length(self) -> int:
        """Tokens in its KV cache before this step (what its rows attend to)."""
        ...
