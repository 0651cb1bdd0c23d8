"""recallspec: lossless speculative decoding with drafts recalled from text.

``from recallspec import Engine, SamplingParams`` (imported on first use, so that the
command line and the C++ core load without torch's start-up cost until needed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Engine", "EngineConfig", "GenerationResult", "SamplingParams"]

if TYPE_CHECKING:
    from recallspec.decoding.sampling import SamplingParams
    from recallspec.engine import Engine, EngineConfig, GenerationResult

_LAZY = {
    "Engine": "recallspec.engine",
    "EngineConfig": "recallspec.engine",
    "GenerationResult": "recallspec.engine",
    "SamplingParams": "recallspec.decoding.sampling",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'recallspec' has no attribute {name!r}")
