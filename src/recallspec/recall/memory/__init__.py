"""The response memory: each tenant's past outputs as a ring of suffix automata
(``response_memory.py``: ``ResponseMemory``) and its snapshot file (``snapshot.py``:
every tenant's documents in one checked file, written atomically)."""

from recallspec.recall.memory.response_memory import ResponseMemory
from recallspec.recall.memory.snapshot import load_snapshot, save_snapshot

__all__ = ["ResponseMemory", "load_snapshot", "save_snapshot"]
