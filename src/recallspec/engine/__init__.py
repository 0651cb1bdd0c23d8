"""The engine: prefill, draft, verify in one ragged forward, commit, repeat.

Online: ``Engine.add_request`` / ``step`` / ``abort`` / ``has_unfinished``; offline:
``Engine.generate`` / ``Engine.chat``, a loop over them. Layout: ``config`` (the frozen
config), ``request`` (state), ``scheduler`` (admission, the step's plan), ``drafting``
(draft proposal and cost-aware sizing), ``runner`` (the forward, verification, KV
commit), ``outputs`` (deltas, results, text and stop checks), ``prompts`` (input forms),
``engine`` (the ``Engine``), ``offline`` (``generate``). The recall sources (response
memory, live corpora) are the ``recall`` package's service, which the engine owns.
"""

from recallspec.engine.config import EngineConfig
from recallspec.engine.engine import Engine
from recallspec.engine.outputs import GenerationResult, RequestOutput, SpecStats, StepStats
from recallspec.engine.request import FINISH_REASONS

__all__ = [
    "FINISH_REASONS",
    "Engine",
    "EngineConfig",
    "GenerationResult",
    "RequestOutput",
    "SpecStats",
    "StepStats",
]
