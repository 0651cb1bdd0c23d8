"""A request as the step planner sees it (``step.sequence.StepSequence``'s fields),
for planner tests that need no engine: adaptive sizing, no grammar, by default."""

from __future__ import annotations

from dataclasses import dataclass, field

from recallspec.drafters import Drafter
from recallspec.params import Sizing
from recallspec.step.sequence import DraftState


@dataclass
class Seq:
    drafter: Drafter
    rid: int = 0
    sizing: Sizing = "adaptive"
    draft: DraftState = field(default_factory=DraftState)
    depth_limit: int = 100
    cached_length: int = 50
    constraint: None = None
