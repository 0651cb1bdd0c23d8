"""What an index file says about itself: the one metadata type of the corpus suffix
automaton (``automata/static.py``) and the REST datastore (``datastore/rest.py``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["IndexInfo"]


@dataclass(frozen=True)
class IndexInfo:
    """An index file's header, as ``recallspec index info`` / ``datastore info`` print it.

    ``n_states`` and ``n_edges`` are the automaton's (None for a datastore, and left out of
    ``to_dict``); ``payload_hash`` is the 64-bit hash the file stores, in hex.
    """

    kind: Literal["sam", "rest"]
    path: str
    format_version: int
    vocab_size: int
    tokenizer_fingerprint: str
    n_tokens: int
    n_docs: int
    file_bytes: int
    payload_hash: str
    verified: bool
    metadata: dict[str, Any] = field(default_factory=dict)
    n_states: int | None = None
    n_edges: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}
