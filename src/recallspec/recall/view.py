"""Recall sources: immutable automata a request may draft from besides its own text.

The response memory (``recall/memory/``) and the live corpora
(``recall/live_corpora.py``) hand the SAM drafters ``RecallSource`` objects: a static
suffix automaton (a ``StaticIndex``) plus the kind of text it holds. A source never
changes once published; new text means a new source, and a reader swaps references
(``RecallView``), so a decoding step never waits for a build.

Sources built at run time live in a ``ScratchDir``: the builder writes an index file
there, maps it and unlinks it at once (the mapping keeps the pages alive until the
last cursor is gone), so nothing is left on disk even after a crash of the process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from recallspec.recall.automata.static import IndexBuilder, StaticIndex

MEMORY, CORPUS = "memory", "corpus"  # the kinds of recall source (drafters' source names)


@dataclass(frozen=True, eq=False)  # identity: a drafter keeps one cursor per source object
class RecallSource:
    kind: str  # MEMORY | CORPUS
    name: str  # for statistics and debugging: "memory:<tenant>#<n>" or the corpus id
    index: StaticIndex  # immutable, memory-mapped

    @property
    def tokens(self) -> int:
        return self.index.n_tokens

    @property
    def bytes(self) -> int:
        return self.index.file_bytes


# What a request may see, as groups (the response memory of its tenant, the live
# corpora): each group is an immutable tuple replaced as a whole when it changes, so a
# reader notices a change by identity, group by group, without comparing contents.
RecallView = tuple[tuple[RecallSource, ...], ...]


class ScratchDir:
    """A private temporary directory for index files built at run time (created on first
    use, removed when the owner is garbage-collected or ``close``d)."""

    def __init__(self, parent: str | None = None) -> None:
        self._parent = parent
        self._path: Path | None = None
        self._lock = threading.Lock()
        self._names = count()
        self._finalizer: Any = None

    def _dir(self) -> Path:
        with self._lock:
            if self._path is None:
                self._path = Path(tempfile.mkdtemp(prefix="recallspec-recall-", dir=self._parent))
                self._finalizer = weakref.finalize(
                    self, shutil.rmtree, str(self._path), ignore_errors=True)
            return self._path

    def build(
        self, tokens: npt.NDArray[np.uint32], offsets: npt.NDArray[np.int64], vocab_size: int,
        fingerprint: str, metadata: dict[str, Any] | None = None,
    ) -> StaticIndex:
        """Build a static automaton over documents given flat (``tokens``, int64
        ``offsets`` with len = n_docs + 1), map it and unlink its file. The C++ build,
        write and map run without the GIL."""
        builder = IndexBuilder(vocab_size, expected_tokens=int(tokens.shape[0]))
        builder.add_flat(tokens, offsets)
        with self._lock:
            n = next(self._names)
        path = self._dir() / f"seg-{n}.idx"
        try:
            builder.write(path, fingerprint, metadata)
            return StaticIndex.open(path, expected_fingerprint=fingerprint)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()


def flatten(docs: Sequence[npt.NDArray[np.uint32]]) -> tuple[
    npt.NDArray[np.uint32], npt.NDArray[np.int64]
]:
    """Documents as one uint32 token array and int64 offsets (len = n_docs + 1)."""
    offsets = np.zeros(len(docs) + 1, np.int64)
    if docs:
        np.cumsum([d.shape[0] for d in docs], out=offsets[1:])
        return np.ascontiguousarray(np.concatenate(docs), np.uint32), offsets
    return np.zeros(0, np.uint32), offsets


def documents(index: StaticIndex) -> list[npt.NDArray[np.uint32]]:
    """The documents an index holds (copies), in order: its text split at the all-ones
    separator that follows each document."""
    text = index.text
    sep = np.iinfo(text.dtype).max
    ends = np.flatnonzero(text == sep)
    out, start = [], 0
    for e in ends.tolist():
        out.append(np.asarray(text[start:e], np.uint32))
        start = e + 1
    return out
