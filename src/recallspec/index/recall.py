"""Recall sources: immutable automata a request may draft from besides its own text.

The response memory (``index/memory.py``) and the engine's live corpora
(``engine/corpora.py``) hand the SAM drafters ``RecallSource`` objects: a static
suffix automaton (a ``StaticIndex``) plus the kind of text it holds. A source never
changes once published; new text means a new source, and a reader swaps references
(``RecallView``), so a decoding step never waits for a build.

Sources built at run time live in a ``ScratchDir``: the builder writes an index file
there, maps it and unlinks it at once (the mapping keeps the pages alive until the
last cursor is gone), so nothing is left on disk even after a crash of the process.
"""

from __future__ import annotations

import atexit
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
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from recallspec.index.static import IndexBuilder, StaticIndex

MEMORY, CORPUS = "memory", "corpus"  # the kinds of recall source (drafters' source names)
IDLE_EXIT_S = 30.0  # a worker thread ends after this long without work (restarted on demand)
EXIT_JOIN_S = 30.0  # at interpreter exit, the longest wait for a worker's current job


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


class Jobs(Protocol):
    """An owner of background work (the response memory, the corpus registry)."""

    _cond: threading.Condition  # guards the owner's queue and ``_thread``
    _thread: threading.Thread | None  # its worker, None when none runs
    _closed: bool

    def _next_job(self) -> Any | None:
        """Under ``_cond``: take the next job off the queue (None: nothing to do)."""

    def _do(self, job: Any) -> None:
        """Without the lock: run a job (it takes ``_cond`` itself to publish)."""


def ensure_worker(owner: Jobs, name: str) -> None:
    """Under ``owner._cond``: start the owner's worker thread unless one runs.

    The thread holds the owner only weakly while it waits, so an engine that is dropped
    is freed (its automata unmapped) even while its worker idles; the thread ends after
    IDLE_EXIT_S without work, when the owner is closed, or when it is gone."""
    if owner._thread is None:
        owner._thread = threading.Thread(target=_work, args=(weakref.ref(owner), owner._cond),
                                         name=name, daemon=True)
        owner._thread.start()


def _lower_priority() -> None:
    """Run the calling thread at idle priority where the OS allows (Linux: per thread).

    Building an automaton competes with decoding for the cores; on a 2-core machine a
    normal-priority build stretched single forwards ~10x (the kernel pool's fork-joins
    wait for a core). Idle priority lets the build use only what decoding leaves."""
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        # Not permitted here: stay at normal priority.
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


# Running workers and their owners' conditions; ``_exiting`` once the interpreter exits.
_running: dict[threading.Thread, threading.Condition] = {}
_exiting = False


@atexit.register
def _stop_workers() -> None:
    """At interpreter exit (before daemon threads are frozen): let every worker finish
    its current job and end. A daemon thread still inside a C++ build (which runs
    without the GIL) when the interpreter finalizes is killed as it takes the GIL back,
    and that kill aborts the process ("terminate called without an active exception")."""
    global _exiting
    _exiting = True
    for thread, cond in list(_running.items()):
        with cond:
            cond.notify_all()
        thread.join(EXIT_JOIN_S)


def _work(ref: weakref.ref[Jobs], cond: threading.Condition) -> None:
    _running[threading.current_thread()] = cond
    try:
        _lower_priority()
        _serve(ref, cond)
    finally:
        _running.pop(threading.current_thread(), None)


def _serve(ref: weakref.ref[Jobs], cond: threading.Condition) -> None:
    while True:
        with cond:
            owner = ref()
            if owner is None:
                return
            stop = owner._closed or _exiting
            job = None if stop else owner._next_job()
            if job is None and not stop:
                del owner  # wait without keeping the owner alive
                cond.wait(IDLE_EXIT_S)
                owner = ref()
                if owner is None:
                    return
                job = None if owner._closed or _exiting else owner._next_job()
            if job is None:
                owner._thread = None
                cond.notify_all()
                return
        owner._do(job)
        del owner, job
