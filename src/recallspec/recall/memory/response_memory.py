"""ResponseMemory: a bounded, per-tenant memory of past texts as suffix automata.

Each tenant (a string key; requests of one tenant share memory, other tenants never
see it) holds a ring of immutable segments, each a static automaton (``RecallSource``)
over a chunk of recent documents, newest last:

    sealed[0] ... sealed[k-1]   exactly ``segment_tokens`` tokens each, never rebuilt
    open                        < ``segment_tokens`` tokens, rebuilt as text arrives

``add(tenant, tokens)`` only queues the document (a list append under a lock held for
O(1) work), so the caller - the engine at the end of a request - never waits for a
build. One background thread drains the queue: it appends the new documents to the open
segment (a document that crosses the segment size is split there and the full segment
is sealed), rebuilds what changed outside the lock (the C++ build runs without the GIL),
then, under the lock, swaps the new segments in, evicts the oldest sealed segments while
the tenant holds more than ``budget_tokens``, and publishes the tenant's new view.

Bounds, per tenant: tokens in published automata <= ``budget_tokens`` (the open segment
is < segment_tokens <= budget, so dropping sealed segments always gets there); tokens
queued and not yet built <= ``budget_tokens`` (older queued text is dropped first: it
would be evicted anyway); segments <= ``segments`` + 1. At most ``max_tenants`` tenants
are kept: the one fed least recently is dropped whole.

``view(tenant)`` is a lock-free read of an immutable tuple (newest segment first): a
dict lookup and a reference, safe under the GIL against the worker's single-key
assignments.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from recallspec.recall.automata._arrays import as_tokens
from recallspec.recall.view import MEMORY, RecallSource, ScratchDir, documents, flatten
from recallspec.recall.worker import ensure_worker

Doc = npt.NDArray[np.uint32]


@dataclass
class _Tenant:
    sealed: deque[RecallSource] = field(default_factory=deque)  # oldest first
    open: RecallSource | None = None
    open_docs: list[Doc] = field(default_factory=list)  # the open segment's documents
    pending: deque[Doc] = field(default_factory=deque)  # queued, not yet in an automaton
    pending_tokens: int = 0
    # Accounting, whenever no build is in flight: tokens added = held + queued +
    # dropped + evicted.
    dropped_tokens: int = 0  # text over the budget dropped before it was built
    evicted_tokens: int = 0  # text of evicted segments
    evictions: int = 0  # sealed segments evicted

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.sealed) + (self.open.tokens if self.open else 0)

    def view(self) -> tuple[RecallSource, ...]:
        newest_first = list(reversed(self.sealed))
        return ((self.open,) if self.open else ()) + tuple(newest_first)


class ResponseMemory:
    """See the module docstring."""

    def __init__(
        self, budget_tokens: int, vocab_size: int, fingerprint: str | None, *,
        segments: int = 4, max_tenants: int = 64, scratch: ScratchDir | None = None,
    ) -> None:
        if budget_tokens < 1 or segments < 1 or max_tenants < 1:
            raise ValueError("budget_tokens, segments and max_tenants must be >= 1")
        self.budget_tokens = budget_tokens
        self.segments = segments
        self.segment_tokens = -(-budget_tokens // segments)  # ceil: k sealed fill the budget
        self.max_tenants = max_tenants
        self.vocab_size = vocab_size
        self.fingerprint = fingerprint or ""
        self._scratch = scratch or ScratchDir()
        self._cond = threading.Condition()  # guards everything below but _views' reads
        self._tenants: OrderedDict[str, _Tenant] = OrderedDict()  # least recently fed first
        self._views: dict[str, tuple[RecallSource, ...]] = {}  # published, read lock-free
        self._dirty: OrderedDict[str, None] = OrderedDict()  # tenants with queued text
        self._busy = False  # the worker is building outside the lock
        self._thread: threading.Thread | None = None
        self._closed = False
        self._serial = 0
        self._stats: dict[str, Any] = {"builds": 0, "build_s_total": 0.0, "build_s_max": 0.0,
                                       "build_s_last": 0.0, "tenants_dropped": 0, "errors": 0,
                                       "last_error": None}

    # ---- the caller's side: O(1), never waits for a build ----------------------------
    def add(self, tenant: str, tokens: Any) -> None:
        """Queue a document for ``tenant``'s memory (its last ``budget_tokens`` tokens)."""
        whole = as_tokens(tokens, self.vocab_size)
        if whole.shape[0] == 0:
            return
        doc = whole[-self.budget_tokens:].copy()  # never alias a caller's buffer
        with self._cond:
            if self._closed:
                return
            t = self._tenants.get(tenant)
            if t is None:
                t = self._tenants[tenant] = _Tenant()
                while len(self._tenants) > self.max_tenants:
                    old, _ = self._tenants.popitem(last=False)
                    self._views.pop(old, None)
                    self._dirty.pop(old, None)
                    self._stats["tenants_dropped"] += 1
            else:
                self._tenants.move_to_end(tenant)
            t.dropped_tokens += int(whole.shape[0] - doc.shape[0])
            t.pending.append(doc)
            t.pending_tokens += int(doc.shape[0])
            while t.pending_tokens > self.budget_tokens:  # the oldest would be evicted anyway
                cut = t.pending.popleft()
                t.pending_tokens -= int(cut.shape[0])
                t.dropped_tokens += int(cut.shape[0])
            self._dirty[tenant] = None
            ensure_worker(self, "recallspec-memory")
            self._cond.notify_all()

    def view(self, tenant: str) -> tuple[RecallSource, ...]:
        """The tenant's current segments, newest first (lock-free; see the docstring)."""
        return self._views.get(tenant, ())

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued is built and published; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._dirty and not self._busy, timeout)

    def close(self) -> None:
        """Stop the worker (after its current build) and forget everything."""
        with self._cond:
            self._closed = True
            self._tenants.clear()
            self._views.clear()
            self._dirty.clear()
            self._cond.notify_all()
        self._scratch.close()

    # ---- the worker (``recall/worker.py``) -----------------------------------------------
    def _next_job(self) -> tuple[str, _Tenant, list[Doc], list[Doc]] | None:
        """Under the lock: the next tenant with queued text, its queue taken."""
        if not self._dirty:
            return None
        name, _ = self._dirty.popitem(last=False)
        t = self._tenants[name]
        new = list(t.pending)
        t.pending.clear()
        t.pending_tokens = 0
        self._busy = True
        return name, t, list(t.open_docs), new

    def _do(self, job: tuple[str, _Tenant, list[Doc], list[Doc]]) -> None:
        name, t, open_docs, new = job
        try:
            t0 = time.perf_counter()
            sealed, open_seg, open_docs, skipped = self._build(name, open_docs, new)
            took = time.perf_counter() - t0
            error = None
        except Exception as e:  # a failed build loses that text, never the engine
            sealed, open_seg, skipped, took, error = [], None, 0, 0.0, e
        with self._cond:
            self._busy = False
            if error is not None:
                self._stats["errors"] += 1
                self._stats["last_error"] = f"{type(error).__name__}: {error}"
            elif self._tenants.get(name) is t:  # not dropped meanwhile
                t.dropped_tokens += skipped
                self._publish(name, t, sealed, open_seg, open_docs, took)
            self._cond.notify_all()

    def _build(
        self, name: str, open_docs: list[Doc], new: list[Doc]
    ) -> tuple[list[RecallSource], RecallSource | None, list[Doc], int]:
        """New sealed segments (oldest first), the new open segment, its documents, and
        the tokens of full segments not built because they could not fit the budget."""
        size = self.segment_tokens
        full: list[list[Doc]] = []
        cur, n = list(open_docs), sum(int(d.shape[0]) for d in open_docs)
        for doc in new:
            while doc.shape[0]:
                part, doc = doc[: size - n], doc[size - n:]
                cur.append(part)
                n += int(part.shape[0])
                if n == size:
                    full.append(cur)
                    cur, n = [], 0
        # Only the newest sealed segments can stay within the budget next to the open one.
        keep = min((self.budget_tokens - n) // size, len(full))
        skipped = (len(full) - keep) * size
        sealed = [self._segment(name, docs) for docs in full[len(full) - keep:]]
        return sealed, (self._segment(name, cur) if n else None), cur, skipped

    def _segment(self, name: str, docs: list[Doc]) -> RecallSource:
        tokens, offsets = flatten(docs)
        with self._cond:
            self._serial += 1
            serial = self._serial
        index = self._scratch.build(tokens, offsets, self.vocab_size, self.fingerprint)
        return RecallSource(MEMORY, f"memory:{name}#{serial}", index)

    def _publish(self, name: str, t: _Tenant, sealed: list[RecallSource],
                 open_seg: RecallSource | None, open_docs: list[Doc], took: float) -> None:
        """Under the lock: swap the new segments in, evict down to the budget, publish."""
        t.sealed.extend(sealed)
        t.open, t.open_docs = open_seg, open_docs
        total = t.tokens
        while t.sealed and total > self.budget_tokens:
            gone = t.sealed.popleft()
            total -= gone.tokens
            t.evicted_tokens += gone.tokens
            t.evictions += 1
        self._views[name] = t.view()
        s = self._stats
        s["builds"] += 1
        s["build_s_total"] += took
        s["build_s_last"] = took
        s["build_s_max"] = max(s["build_s_max"], took)

    # ---- reporting and snapshots -------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Tokens, segments and mapped bytes per tenant and in all, the budget, evictions
        and build timings (seconds)."""
        with self._cond:
            tenants = {}
            for name, t in self._tenants.items():
                segs = t.view()
                tenants[name] = {
                    "tokens": t.tokens, "segments": len(segs),
                    "bytes": sum(s.bytes for s in segs), "queued_tokens": t.pending_tokens,
                    "dropped_tokens": t.dropped_tokens, "evicted_tokens": t.evicted_tokens,
                    "evictions": t.evictions,
                }
            out: dict[str, Any] = {
                "budget_tokens": self.budget_tokens, "segment_tokens": self.segment_tokens,
                "max_segments": self.segments + 1, "max_tenants": self.max_tenants,
                "tenants": tenants,
                **{k: sum(v[k] for v in tenants.values()) for k in (
                    "tokens", "segments", "bytes", "queued_tokens", "dropped_tokens",
                    "evicted_tokens", "evictions")},
                **self._stats,
            }
        return out

    def documents(self) -> dict[str, list[Doc]]:
        """Every tenant's documents, oldest first (built ones, then queued ones): what a
        snapshot saves. Documents split at a segment boundary come back in two parts."""
        with self._cond:
            parts = {name: (list(t.sealed), list(t.open_docs), list(t.pending))
                     for name, t in self._tenants.items()}
        return {name: [d for s in sealed for d in documents(s.index)] + open_docs + pending
                for name, (sealed, open_docs, pending) in parts.items()}

    def add_documents(self, tenant: str, docs: Sequence[Any]) -> None:
        """``add`` for several documents (a snapshot being reloaded)."""
        for d in docs:
            self.add(tenant, d)
