"""Admission and each step's plan: who decodes, which prompt chunks ride along.

Requests wait in arrival order and are admitted while a KV slot is free and their
arrival time has come (online requests arrive when added; offline runs may hold them
back to simulate traffic). Only the scheduler takes and gives back KV slots. Prompt
chunks of admitted requests (at most ``prefill_chunk`` tokens a step, oldest request
first) ride in the decoding batch's forward, so running requests keep decoding.

With the prefix cache (``prefix_cache.py``, ``prefix_pool.py``) admission picks the free
slot holding the longest prefix of the prompt, or copies a longer one from the pool into
the slot it gives, or copies them from a running request of its tenant (``n`` choices of
one prompt, questions over one document arriving together), and a request starts with
those tokens prefilled; a slot's retained rows go to the pool before another request
overwrites them. A request whose prompt shares ``SHARE_WAIT_TOKENS`` more tokens with a
prompt still being prefilled than any of these holds waits for that prefill (admission
stays in arrival order): one prefill instead of several.

KV memory (``runtime/kv_memory.py``): a slot holds memory for the rows it wrote, not for
``max_len``. Admission keeps what the slots and the pool hold within ``kv_budget`` rows:
an admitted request counts the rows it may write (prompt, new tokens, a draft), a free
slot its retained prefix, the pool its copies; pool entries, then retained prefixes, are
dropped, least recently used first, to make room, and a request that still does not fit
waits (with nothing running, any request fits: the budget holds at least one sequence of
``max_len``).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from recallspec.engine.prefix_cache import PrefixCache, PrefixCacheStats, common_prefix
from recallspec.engine.prefix_pool import PrefixPool, default_pool_tokens
from recallspec.engine.request import Request, RequestStatus

if TYPE_CHECKING:
    from recallspec.engine.config import EngineConfig
    from recallspec.runtime.kv_cache import KVCache


# Tokens a waiting request must gain by waiting for a running request's prefill (over
# the best prefix it could start from now) to wait: below, prefilling them itself costs
# about as little as a step's delay.
SHARE_WAIT_TOKENS = 64


@dataclass(frozen=True)
class PrefillChunk:
    request: Request
    start: int  # first prompt position fed (tokens before it are cached)
    num_tokens: int  # prompt tokens fed this step

    @property
    def tokens(self) -> list[int]:
        return self.request.prompt[self.start : self.start + self.num_tokens]

    @property
    def is_last(self) -> bool:
        """This chunk ends the prompt: its last row samples the first token."""
        return self.start + self.num_tokens == len(self.request.prompt)


@dataclass(frozen=True)
class StepPlan:
    """One step's work, in the order rows are fed: decoding requests first."""

    decoding: tuple[Request, ...]  # [D] prompt cached: each feeds its root + draft rows
    prefill: tuple[PrefillChunk, ...]  # [P] prompt chunks, <= prefill_chunk tokens in all

    @property
    def requests(self) -> Iterator[Request]:
        yield from self.decoding
        for c in self.prefill:
            yield c.request

    @property
    def is_empty(self) -> bool:
        return not self.decoding and not self.prefill

    @staticmethod
    def empty() -> StepPlan:
        return StepPlan((), ())


class Scheduler:
    def __init__(
        self, cache: KVCache, max_batch_size: int, prefill_chunk: int,
        prefix: PrefixCache | None = None, pool: PrefixPool | None = None, *,
        kv_budget: int | None = None, draft_rows: int = 0,
    ) -> None:
        self.cache = cache
        # Rows all slots may hold at once (None: every slot full), and the rows a step may
        # write past a sequence's tokens (its draft and root: ``max_draft_nodes + 1``).
        self.kv_budget = cache.num_slots * cache.max_len if kv_budget is None else kv_budget
        if self.kv_budget < cache.max_len:
            raise ValueError(f"kv_budget_tokens ({self.kv_budget}) must hold one sequence "
                             f"of max_len ({cache.max_len}) positions")
        self.draft_rows = draft_rows
        self.prefix = prefix  # None: every prompt is prefilled from its first token
        self.pool = pool  # evicted slots' rows (None: only the slots keep prefixes)
        self.max_batch_size = max_batch_size
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[Request] = deque()  # arrival order
        self.running: dict[int, Request] = {}  # rid -> request holding a slot, admission order

    @classmethod
    def from_config(cls, cache: KVCache, cfg: EngineConfig) -> Scheduler:
        """The engine's scheduler: its prefix cache and pool as ``cfg`` says (the pool's
        default budget weighs a token of this cache), admission within its KV budget."""
        pool_tokens = (default_pool_tokens(cache.bytes_per_token())
                       if cfg.prefix_cache_tokens is None else cfg.prefix_cache_tokens)
        return cls(cache, cfg.max_batch_size, cfg.prefill_chunk,
                   PrefixCache() if cfg.prefix_cache else None,
                   PrefixPool(pool_tokens) if cfg.prefix_cache and pool_tokens else None,
                   kv_budget=cfg.kv_budget_tokens or cache.budget_rows(),
                   draft_rows=cfg.max_draft_nodes + 1)

    # ---- queue -----------------------------------------------------------------
    def add(self, req: Request) -> None:
        if self.waiting and req.arrival < self.waiting[-1].arrival:
            raise ValueError("requests must be added in arrival order")
        self.waiting.append(req)

    def get(self, rid: int) -> Request | None:
        if rid in self.running:
            return self.running[rid]
        return next((r for r in self.waiting if r.rid == rid), None)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def free_slots(self) -> int:
        return self.max_batch_size - len(self.running)

    def next_arrival(self) -> float | None:
        return self.waiting[0].arrival if self.waiting else None

    # ---- slots -----------------------------------------------------------------
    def admit(self, now: float) -> list[Request]:
        """Give slots to waiting requests that have arrived, in arrival order."""
        admitted = []
        while self.waiting and self.free_slots > 0 and self.waiting[0].arrival <= now:
            need = self.rows_needed(self.waiting[0])
            running = sum(self.cache.resident_rows(r.slot) for r in self.running.values())
            if running + need > self.kv_budget:
                break  # waits for running requests to end (in arrival order)
            if (self.prefix is not None and self.waiting[0].use_prefix
                    and self._share_soon(self.waiting[0])):
                break  # waits for a running prefill of its prompt (a few steps)
            req = self.waiting.popleft()
            if self.prefix is None:
                req.slot = self.cache.allocate()
            else:
                self._take_slot(req, need)
            self.cache.expect(req.slot, need)
            self._make_room()
            req.status = RequestStatus.PREFILLING
            req.t_start = now
            self.running[req.rid] = req
            admitted.append(req)
        return admitted

    def rows_needed(self, req: Request) -> int:
        """KV rows the request may write: its prompt, its new tokens, a step's draft."""
        return min(len(req.prompt) + req.params.max_new_tokens + self.draft_rows,
                   self.cache.max_len)

    def resident_rows(self) -> int:
        """KV rows held in memory: what the slots may hold and the pool's copies."""
        return self.cache.resident_rows() + (0 if self.pool is None else
                                             self.pool.resident_tokens)

    def _make_room(self) -> None:
        """Drop pool entries (least recently used first), then retained prefixes (least
        recently retained first), until what the slots and the pool hold fits the budget
        (admission checked that the running requests' rows do)."""
        if self.prefix is None:
            return  # free slots hold nothing: ``release`` gave their rows back
        while self.resident_rows() > self.kv_budget and self.pool is not None:
            if not self.pool.evict_oldest():
                break
        free = set(self.cache.free_slot_ids())
        for slot in self.prefix.oldest():
            if self.resident_rows() <= self.kv_budget:
                return
            self.prefix.forget(slot)
            self.prefix.evicted()
            if slot in free:  # (else someone took it since: its rows are theirs)
                self.cache.give_back(slot)

    def release(self, req: Request) -> None:
        """Take a request out: its slot back to the cache (or out of the queue); the
        memory of its rows goes back, but for a prefix the slot retains (none for a
        cold request: ``Request.use_prefix``)."""
        if req.slot >= 0:
            keep = self._keep_prefix(req) if self.prefix is not None and req.use_prefix else 0
            self.cache.release(req.slot, keep)
            req.slot = -1
        if self.running.pop(req.rid, None) is None and req in self.waiting:
            self.waiting.remove(req)
        req.status = RequestStatus.FINISHED

    def _free_slots(self) -> list[tuple[int, int]]:
        """The cache's free slots with their allocation counts (``PrefixCache.best``)."""
        return [(s, self.cache.allocations(s)) for s in self.cache.free_slot_ids()]

    def _take_slot(self, req: Request, need: int) -> None:
        """Give ``req`` the free slot holding the longest prefix of its prompt, or copy
        a longer one into the slot it gets, from the pool or from a running request's
        slot (the pool on a tie); a slot's retained rows that are about to be
        overwritten go to the pool first (when there is one). A cold request
        (``Request.use_prefix`` False) starts from nothing and counts as no lookup."""
        assert self.prefix is not None
        free = self._free_slots()
        cold = not req.use_prefix
        slot, reused, dropped = self.prefix.choose(req.prompt, req.tenant, free, reuse=not cold)
        entry, n = ((None, 0) if self.pool is None or cold
                    else self.pool.best(req.prompt, req.tenant))
        src, m = (None, 0) if cold else self._running_rows(req)
        from_pool = entry is not None and n > reused and n >= m
        from_running = src is not None and m > max(reused, n)
        # What the slot held past the reused rows is about to be overwritten (e.g. a
        # conversation sharing only the system prompt with the new one): keep it.
        if dropped is not None and (from_pool or from_running or len(dropped.tokens) > reused):
            n_old = len(dropped.tokens)  # its rows are intact until the slot is allocated
            kept = self.pool is not None and self.pool.put(
                dropped.tokens, dropped.tenant, *self.cache.rows(slot, n_old))
            if not kept:
                self.prefix.evicted()
        if self.cache.resident_rows(slot) > need:  # rows past what this request writes
            self.cache.give_back(slot, need)
        req.slot = self.cache.allocate(slot)
        if from_pool:
            assert entry is not None and self.pool is not None
            self.cache.load(slot, entry.k, entry.v, n)
            self.pool.used(entry)
            reused = n
        elif from_running:
            assert src is not None
            self.cache.copy(src.slot, slot, m)
            reused = m
        else:
            self.cache.resume(slot, reused)
        if not cold:
            self.prefix.admitted(len(req.prompt), reused)
        req.prefilled = req.reused = reused

    def _sources(self, req: Request) -> Iterator[Request]:
        """Running requests whose rows ``req`` may start from: its tenant's, unfinished,
        holding a slot without padding entries, not cold."""
        for r in self.running.values():
            if (r.tenant == req.tenant and r.use_prefix and not r.is_finished and r.slot >= 0
                    and self.cache.valid_prefix(r.slot) is None):
                yield r

    def _running_rows(self, req: Request) -> tuple[Request | None, int]:
        """The running request whose committed rows hold the longest prefix of
        ``req``'s prompt (at most all but its last token), and that length."""
        best: Request | None = None
        most, limit = 0, max(len(req.prompt) - 1, 0)
        for r in self._sources(req):
            length = self.cache.length(r.slot)  # rows of prompt + generated[:-1]
            held = np.asarray((r.prompt + r.generated)[:length], dtype=np.int64)
            n = min(common_prefix(held, req.prompt), limit)
            if n > most:
                best, most = r, n
        return best, most

    def _share_soon(self, req: Request) -> bool:
        """Whether a running request still prefilling a prompt that shares
        ``SHARE_WAIT_TOKENS`` more tokens with ``req``'s than any prefix ``req`` could
        start from now will hold them within a few steps (then ``req`` copies them)."""
        assert self.prefix is not None
        limit = len(req.prompt) - 1
        prefilling = [r for r in self._sources(req) if not r.is_prefilled]
        if not prefilling or limit < SHARE_WAIT_TOKENS:
            return False
        prompt = np.asarray(req.prompt, dtype=np.int64)
        soon = max(min(common_prefix(prompt, r.prompt), limit) for r in prefilling)
        if soon < SHARE_WAIT_TOKENS:
            return False
        free = self._free_slots()
        now = max(self.prefix.best(req.prompt, req.tenant, free)[1],
                  0 if self.pool is None else self.pool.best(req.prompt, req.tenant)[1],
                  self._running_rows(req)[1])
        return soon - now >= SHARE_WAIT_TOKENS

    def stats(self) -> PrefixCacheStats | None:
        """The prefix cache's counters (None: it is off)."""
        if self.prefix is None:
            return None
        s = self.prefix.stats(0 if self.pool is None else self.pool.resident_tokens)
        if self.pool is not None:
            s = dataclasses.replace(s, evictions=s.evictions + self.pool.evictions)
        return s

    def _keep_prefix(self, req: Request) -> int:
        """Let the slot retain its rows for later prompts, unless the request failed or
        was aborted (its rows are never reused) or the slot holds padding entries.
        Returns the rows retained."""
        assert self.prefix is not None
        n = self.cache.length(req.slot)
        if req.finish_reason in ("error", "abort") or self.cache.valid_prefix(req.slot) is not None:
            self.prefix.forget(req.slot)
            return 0
        # rows [0, n): the prompt, then the generated tokens fed back as roots
        self.prefix.retain(req.slot, (req.prompt + req.generated)[:n], req.tenant,
                           self.cache.allocations(req.slot))
        return n

    # ---- the step ----------------------------------------------------------------
    def schedule(self) -> StepPlan:
        live = [r for r in self.running.values() if not r.is_finished]
        decoding = tuple(r for r in live if r.is_prefilled)
        prefill: list[PrefillChunk] = []
        budget = self.prefill_chunk
        for req in live:
            if budget <= 0:
                break
            if not req.is_prefilled:
                n = min(budget, len(req.prompt) - req.prefilled)
                prefill.append(PrefillChunk(req, req.prefilled, n))
                budget -= n
        return StepPlan(decoding, tuple(prefill))
