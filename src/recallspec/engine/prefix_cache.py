"""Prefix KV reuse across requests: finished requests' KV stays in their slots.

A request that ends well (not failed, not aborted) leaves its slot's KV in place: the
slot returns to the free list *retaining* the token ids whose keys and values it holds
(its prompt and the generated tokens whose rows were committed). A new request is given
the free slot whose retained tokens share the longest prefix with its prompt, starts
from that many positions and prefills only the rest; a chat's next turn, an agent's next
step (the whole transcript plus one more message) or a request repeating a shared
document finds the previous one's slot. Slots whose content matches nothing are reused
least recently retained first (their content is then evicted), after the empty ones.

Exact by construction: a slot's rows are bit-identical to what a prefill of the same
tokens would write now (every kernel is row-local and batch-invariant, and a row's keys
and values depend only on the tokens up to it), so starting from them changes no output
(``tests/e2e/test_prefix_cache_real.py`` checks outputs with the cache on and off).

Tenants: a retained prefix is reused only by requests of the tenant whose request
computed it (the anonymous tenant ``""`` shares among anonymous requests). No row of one
tenant's text is ever attended to by another tenant's request.

This module only keeps the bookkeeping (which slot holds what, the counters); the
scheduler asks it which slot to take, and the KV cache (``runtime/kv_cache.py``) keeps
the rows. A slot's rows that another request is about to overwrite can be copied out to
the pool (``prefix_pool.py``) first: ``choose`` hands back what the slot held.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(eq=False)  # identity: records are compared as objects
class Retained:
    tokens: np.ndarray  # [n] int64: the token ids whose KV the slot holds, in order
    tenant: str
    stamp: int  # retention order (larger = more recent)
    allocation: int  # the KV cache's allocation count of the slot when it was released


@dataclass(frozen=True)
class PrefixCacheStats:
    """Counters since the engine started (named after vLLM's ``prefix_cache_*``)."""

    queries: int  # prompt tokens looked up (every admitted prompt's length)
    hits: int  # of them, tokens whose KV was reused (not prefilled)
    evictions: int  # retained prefixes dropped (from a slot not copied out, or the pool)
    resident_tokens: int  # tokens retained for reuse now (free slots and the pool)
    retained_slots: int  # free slots holding a retained prefix now


def common_prefix(a: np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    """Length of the longest common prefix of two token id sequences."""
    bb = np.asarray(b, dtype=np.int64)
    n = min(a.shape[0], bb.shape[0])
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != bb[:n])
    return int(diff[0]) if diff.size else n


class PrefixCache:
    """Which free slots retain whose KV; which slot a new prompt should take."""

    def __init__(self) -> None:
        self._slots: dict[int, Retained] = {}
        self._stamp = 0
        self._queries = self._hits = self._evictions = 0

    def retain(self, slot: int, tokens: Sequence[int], tenant: str, allocation: int) -> None:
        """A request ended well: ``slot`` (being freed) holds the KV of ``tokens``;
        ``allocation``: the cache's allocation count of the slot (``KVCache.allocations``)."""
        self._stamp += 1
        if len(tokens):
            self._slots[slot] = Retained(np.asarray(tokens, dtype=np.int64), tenant,
                                          self._stamp, allocation)
        else:
            self._slots.pop(slot, None)

    def oldest(self) -> list[int]:
        """The slots retaining a prefix, least recently retained first."""
        return sorted(self._slots, key=lambda s: self._slots[s].stamp)

    def forget(self, slot: int) -> None:
        """The slot's rows are no longer trusted (e.g. a failed or aborted request)."""
        self._slots.pop(slot, None)

    def best(
        self, prompt: Sequence[int], tenant: str, free: Sequence[tuple[int, int]]
    ) -> tuple[int, int]:
        """(slot, reused): the free slot of ``tenant`` retaining the longest prefix of
        ``prompt`` (the most recently retained among equals) and its length, at most
        len(prompt) - 1 (the prompt's last token is always prefilled: its row's logits
        give the first new token); (-1, 0) when none shares a token. ``free``: the
        cache's free slots with their allocation counts; a slot allocated since it was
        retained (by anyone) retains nothing and is forgotten here."""
        self._prune(free)
        best_slot, best = -1, 0
        limit = max(len(prompt) - 1, 0)
        for s, _ in free:
            r = self._slots.get(s)
            if r is None or r.tenant != tenant:
                continue
            n = min(common_prefix(r.tokens, prompt), limit)
            if n > best or (n == best and n > 0 and r.stamp > self._slots[best_slot].stamp):
                best_slot, best = s, n
        return best_slot, best

    def _prune(self, free: Sequence[tuple[int, int]]) -> None:
        """Forget the free slots allocated since they were retained (their rows were
        overwritten): nothing may start from them, nor copy them out."""
        for s, allocation in free:
            r = self._slots.get(s)
            if r is not None and r.allocation != allocation:
                del self._slots[s]

    def choose(
        self, prompt: Sequence[int], tenant: str, free: Sequence[tuple[int, int]], *,
        reuse: bool = True,
    ) -> tuple[int, int, Retained | None]:
        """(slot, reused, dropped): the free slot to give a request with this prompt
        (``best``'s, else an empty slot, else the least recently retained), how many of
        its first tokens' KV that slot already holds, and what the slot retained (None:
        nothing), which it no longer does (the request's rows overwrite it past
        ``reused``: the caller may copy it out first, ``prefix_pool.py``).
        ``reuse=False``: a cold request, given an empty slot (else the least recently
        retained) and 0 reused tokens, whatever its prompt shares."""
        if not free:
            raise ValueError("no free slot to choose from")
        if reuse:
            best_slot, best = self.best(prompt, tenant, free)
        else:
            self._prune(free)
            best_slot, best = -1, 0
        if best == 0:  # nothing to reuse: an empty slot, else the least recently retained
            slots = [s for s, _ in free]
            empty = [s for s in slots if s not in self._slots]
            best_slot = empty[0] if empty else min(slots, key=lambda s: self._slots[s].stamp)
        return best_slot, best, self._slots.pop(best_slot, None)

    def admitted(self, prompt_tokens: int, reused: int) -> None:
        """Count an admission: its prompt's length and the tokens it did not prefill."""
        self._queries += prompt_tokens
        self._hits += reused

    def evicted(self, n: int = 1) -> None:
        """Count retained prefixes dropped for good (not kept elsewhere)."""
        self._evictions += n

    def stats(self, pool_tokens: int = 0) -> PrefixCacheStats:
        """The counters; ``pool_tokens``: tokens kept beyond the slots (``prefix_pool``)."""
        return PrefixCacheStats(
            self._queries, self._hits, self._evictions,
            sum(r.tokens.shape[0] for r in self._slots.values()) + pool_tokens,
            len(self._slots),
        )
