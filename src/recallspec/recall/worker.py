"""Background build threads of the recall sources' owners (the response memory, the
live-corpus registry).

An owner keeps a job queue under its condition ``_cond``; ``ensure_worker`` (called
under that lock) starts its one worker thread unless one runs. The worker takes a job
under the lock (``_next_job``) and runs it without the lock (``_do``, which publishes
under the lock itself), so a caller only ever appends to a queue and never waits for a
build. Invariants: at most one worker per owner (``owner._thread``); the worker holds
the owner only weakly while it waits, and ends after IDLE_EXIT_S without work, when the
owner is closed or gone, or at interpreter exit (after its current job).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import weakref
from typing import Any, Protocol

IDLE_EXIT_S = 30.0  # a worker thread ends after this long without work (restarted on demand)
EXIT_JOIN_S = 30.0  # at interpreter exit, the longest wait for a worker's current job


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
    normal-priority build stretched single forwards many times over (the kernel pool's
    fork-joins wait for a core). Idle priority lets the build use only what decoding leaves."""
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
