"""The engine in ONE background thread, talking to request handlers through queues.

Handlers (asyncio, the server's event loop) put ``add`` and ``abort`` commands on a
thread-safe queue; the engine thread drains it between steps (so an abort takes
effect before the next step), runs ``Engine.step`` while anything is in flight, and
posts each output to its request's ``asyncio.Queue`` with
``loop.call_soon_threadsafe``. The engine thread never waits for a client: posting
is non-blocking and the asyncio queues are unbounded (a request's backlog is at most
its own tokens). Only the engine thread touches the engine, except its corpus
registry (``Engine.corpora``), which is safe from any thread and which the corpus
routes call directly. The engine thread also refreshes the memory and corpus gauges
(at most every ``STATE_INTERVAL`` seconds), and grants a background measurement of the
cost curve its turns (idle time, and a small share of busy time).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from recallspec.engine import Engine, RequestOutput, SpecStats
from recallspec.errors import ContextLengthError, RecallspecError
from recallspec.server.metrics import Metrics
from recallspec.server.protocol import Submission

log = logging.getLogger("recallspec.server")
STATE_INTERVAL = 0.5  # seconds between refreshes of the memory and corpus gauges


@dataclass(frozen=True)
class Accepted:
    """The engine took the request (first item of every accepted stream)."""

    rid: int
    num_prompt_tokens: int


@dataclass(frozen=True)
class Rejected:
    """The engine refused the request (the only item of its stream)."""

    status: int  # HTTP status: 400 bad input, 429 queue full, 500 our fault
    message: str
    param: str | None = None


class RequestStream:
    """One engine request's channel (choice ``index`` of a submission): commands go to
    the engine thread, outputs come back."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sub: Submission, index: int = 0,
                 ) -> None:
        self.loop = loop
        self.sub = sub
        self.index = index
        self.queue: asyncio.Queue[Accepted | Rejected | RequestOutput] = asyncio.Queue()
        # Engine thread only:
        self.rid: int | None = None
        self.t_prev: float | None = None  # when its previous tokens were delivered
        self.spec: SpecStats | None = None  # speculation already counted in the metrics

    def post(self, item: Accepted | Rejected | RequestOutput) -> None:
        """Hand an item to the handler (from the engine thread; never blocks)."""
        # RuntimeError: the event loop is closed (the server is shutting down).
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    async def get(self) -> Accepted | Rejected | RequestOutput:
        return await self.queue.get()


async def merged(
    streams: Sequence[RequestStream],
) -> AsyncGenerator[tuple[int, Rejected | RequestOutput], None]:
    """The items of several streams (a response's choices) as they come, each with its
    stream's position, until each stream's last (finished or rejected); each stream's in
    its order. Close it (``contextlib.aclosing``) to stop early."""
    pending = {asyncio.ensure_future(s.get()): i for i, s in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=pending.__getitem__):
                i = pending.pop(task)
                item = task.result()
                assert not isinstance(item, Accepted)  # (taken by the caller)
                if not isinstance(item, Rejected) and not item.finished:
                    pending[asyncio.ensure_future(streams[i].get())] = i
                yield i, item
    finally:
        for task in pending:
            task.cancel()


class EngineLoop:
    def __init__(self, engine: Engine, metrics: Metrics, *, max_waiting: int) -> None:
        self.engine = engine
        self.metrics = metrics
        self.max_waiting = max_waiting
        # ("add", a submission's streams) or ("abort", [one stream])
        self._commands: queue.SimpleQueue[tuple[str, Sequence[RequestStream]]] = (
            queue.SimpleQueue())
        self._streams: dict[int, RequestStream] = {}  # rid -> stream, engine thread only
        self._default_drafter = engine.config.default_drafter.name
        self._stop = threading.Event()
        self._t_state = -STATE_INTERVAL  # when the gauges were last refreshed
        self._thread = threading.Thread(target=self._run, name="recallspec-engine", daemon=True)

    # ---- the handlers' side ------------------------------------------------------------
    def start(self) -> None:
        # The gauges hold their values from before the first request: /metrics never
        # shows a budget missing (its first iteration may wait for a command first).
        self._publish()
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, streams: Sequence[RequestStream]) -> None:
        """Add a submission's choices, all or none (each stream's first item says)."""
        self._commands.put(("add", list(streams)))

    def abort(self, stream: RequestStream) -> None:
        self._commands.put(("abort", [stream]))

    # ---- the engine thread -------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._iterate()
            except Exception:  # a bug outside any request: fail what is in flight, go on
                log.exception("engine loop error")
                for rid in list(self._streams):
                    self._end(rid, "the engine failed; see the server log")

    def _iterate(self) -> None:
        eng = self.engine
        # Idle: wait for a command (briefly, to notice stop; while the cost curve is
        # measured in the background, until its next idle turn is due). Busy: take what
        # is there.
        measuring = eng.curves.state == "measuring"
        try:
            if eng.has_unfinished():
                cmd = self._commands.get_nowait()
            else:
                wait = min(eng.curves.idle_wait(), 0.1) if measuring else 0.1
                cmd = self._commands.get(timeout=wait) if wait > 0 else (
                    self._commands.get_nowait())
        except queue.Empty:
            cmd = None
        while cmd is not None:
            kind, streams = cmd
            if kind == "add":
                self._add(streams)
            else:
                self._abort(streams[0])
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                cmd = None
        if eng.has_unfinished():
            for out in eng.step():
                self._deliver(out)
        if measuring:  # one forward of it, if due (``cost/source.py``)
            eng.curves.advance(busy=eng.has_unfinished())
        self._publish()

    def _publish(self) -> None:
        """The gauges from the engine's state (the engine thread, or before it starts)."""
        eng = self.engine
        self.metrics.queue(eng.num_running, eng.num_waiting)
        self.metrics.prefix_cache(eng.prefix_cache_stats())
        sched = eng.scheduler
        pool = sched.pool
        self.metrics.kv_cache(sched.resident_rows(), sched.kv_budget,
                              0 if pool is None else pool.resident_tokens,
                              0 if pool is None else pool.budget_tokens)
        now = time.perf_counter()
        if now - self._t_state >= STATE_INTERVAL:
            self._t_state = now
            self.metrics.memory(eng.memory_stats())
            self.metrics.corpora(eng.corpora.list())

    def _add(self, streams: Sequence[RequestStream]) -> None:
        """Add a submission's choices as engine requests: all of them, or (the queue is
        full, the engine refuses one) none, each stream told which."""
        eng = self.engine
        # Requests beyond the free slots wait; at most max_waiting of them.
        if eng.num_waiting + len(streams) - 1 - eng.scheduler.free_slots >= self.max_waiting:
            self._reject(streams, Rejected(429, f"the server is busy ({eng.num_waiting} "
                                                "requests waiting); retry later"))
            return
        rids: list[int] = []
        try:
            for stream in streams:
                rids.append(self._add_one(stream))
        except Exception as e:
            for rid in rids:  # the choices already added go too (their outputs unsent)
                eng.abort(rid)
            if isinstance(e, RecallspecError):
                param = "prompt" if isinstance(e, ContextLengthError) else None
                self._reject(streams, Rejected(400, str(e), param))
            else:
                log.exception("adding a request failed")
                self._reject(streams, Rejected(500, f"internal error: {type(e).__name__}: {e}"))
            return
        for stream, rid in zip(streams, rids, strict=True):
            stream.rid = rid
            self._streams[rid] = stream
            req = eng.scheduler.get(rid)
            n = len(req.prompt) if req is not None else 0
            self.metrics.admitted(n)
            stream.post(Accepted(rid, n))

    def _add_one(self, stream: RequestStream) -> int:
        sub = stream.sub
        # The default drafter by name gets the server's options (an --index, say) under
        # the request's own.
        drafter = None if sub.drafter in (None, self._default_drafter) else sub.drafter
        return self.engine.add_request(
            sub.prompt, sub.choice_params(stream.index), drafter=drafter,
            drafter_options=sub.drafter_options, mode=sub.mode, request_id=sub.request_id,
            tenant=sub.tenant, memory=sub.memory)

    def _reject(self, streams: Sequence[RequestStream], why: Rejected) -> None:
        self.metrics.reject(why.status)  # once per HTTP request
        for stream in streams:
            stream.post(why)

    def _abort(self, stream: RequestStream) -> None:
        if stream.rid is not None and stream.rid in self._streams:
            out = self.engine.abort(stream.rid)
            if out is not None:
                self._deliver(out)
            else:
                self._streams.pop(stream.rid, None)

    def _deliver(self, out: RequestOutput) -> None:
        stream = self._streams.get(out.rid)
        if stream is None:
            return
        now = time.perf_counter()
        self.metrics.output(out, stream.spec, stream.sub.t_submit, stream.t_prev, now)
        stream.spec = out.spec
        if out.num_committed:
            stream.t_prev = now
        if out.finished:
            del self._streams[out.rid]
            if out.finish_reason == "error" and out.exception is not None:
                # The client gets the message (500); the log keeps where it came from.
                log.error("request %s failed: %s", out.rid, out.error, exc_info=out.exception)
        stream.post(out)

    def _end(self, rid: int, message: str) -> None:
        """Fail an in-flight request from outside the engine's step."""
        stream = self._streams.pop(rid)
        try:
            self.engine.abort(rid)
        except Exception:
            log.exception("aborting request %d failed", rid)
        stream.post(Rejected(500, message))

