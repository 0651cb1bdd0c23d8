"""Prefix KV kept beyond the slots: copies of evicted slots' rows, within a token budget.

The slots themselves are the first level of the prefix cache (``prefix_cache.py``: a
free slot keeps its last request's rows). With more conversations than slots, a slot is
soon given to another request and its rows would be lost; instead its rows are copied
here first (``put``), and a later request whose prompt starts with them has them copied
back into its slot (``best``, then ``KVCache.load``): a memory copy of a token's keys and
values (46 KB at SmolLM2-135M in fp32) in place of that token's share of a prefill, far
dearer.

Entries hold at most ``budget_tokens`` tokens in all; the least recently used go first.
A copy that would take more than half the memory available now is not made (the pool
must never push the process into swapping). Tenants as in ``prefix_cache.py``: an entry
is matched only by its own tenant's prompts. Rows are copied bit for bit, so reuse from
here is as exact as reuse from a slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from recallspec.engine.prefix_cache import common_prefix
from recallspec.params import DEFAULT_POOL_BYTES, DEFAULT_POOL_TOKENS
from recallspec.runtime.kv_memory import available_memory


def default_pool_tokens(bytes_per_token: int) -> int:
    """The default pool budget for a cache whose token weighs ``bytes_per_token``."""
    return min(DEFAULT_POOL_TOKENS, DEFAULT_POOL_BYTES // max(bytes_per_token, 1))


@dataclass(eq=False)  # identity: entries are compared as objects
class PoolEntry:
    tokens: np.ndarray  # [n] int64: the token ids whose keys and values k and v hold
    tenant: str
    k: torch.Tensor  # [layers, kv_heads, n, head_dim], the cache's dtype
    v: torch.Tensor
    stamp: int  # last use (larger = more recent)


class PrefixPool:
    def __init__(self, budget_tokens: int = DEFAULT_POOL_TOKENS) -> None:
        if budget_tokens < 0:
            raise ValueError("the prefix pool's budget must be >= 0 tokens")
        self.budget_tokens = budget_tokens
        self._entries: list[PoolEntry] = []
        self._stamp = 0
        self.evictions = 0  # entries dropped to stay within the budget
        self.hits = 0  # admissions served from here

    @property
    def resident_tokens(self) -> int:
        return sum(e.tokens.shape[0] for e in self._entries)

    def put(self, tokens: Sequence[int] | np.ndarray, tenant: str, k: torch.Tensor,
            v: torch.Tensor) -> bool:
        """Keep copies ``k``, ``v`` of the rows of ``tokens`` (already copied by the
        caller); False when they do not fit (larger than the budget, or the memory)."""
        n = len(tokens)
        nbytes = k.numel() * k.element_size() + v.numel() * v.element_size()
        avail = available_memory()
        if not n or n > self.budget_tokens or (avail is not None and nbytes > avail // 2):
            return False
        toks = np.asarray(tokens, dtype=np.int64)
        # An entry this one extends (or repeats) is redundant: drop it.
        self._entries = [e for e in self._entries if not (
            e.tenant == tenant and e.tokens.shape[0] <= n
            and common_prefix(e.tokens, toks) == e.tokens.shape[0])]
        while self.resident_tokens + n > self.budget_tokens and self.evict_oldest():
            pass
        self._stamp += 1
        self._entries.append(PoolEntry(toks, tenant, k, v, self._stamp))
        return True

    def evict_oldest(self) -> bool:
        """Drop the least recently used entry (to make room in the KV budget: the
        scheduler); False when there is none."""
        if not self._entries:
            return False
        self._entries.remove(min(self._entries, key=lambda e: e.stamp))
        self.evictions += 1
        return True

    def best(self, prompt: Sequence[int], tenant: str) -> tuple[PoolEntry | None, int]:
        """The entry of ``tenant`` sharing the longest prefix with ``prompt`` and that
        length, at most len(prompt) - 1 (the last prompt token is always prefilled)."""
        limit = max(len(prompt) - 1, 0)
        best: PoolEntry | None = None
        most = 0
        for e in self._entries:
            if e.tenant != tenant:
                continue
            n = min(common_prefix(e.tokens, prompt), limit)
            if n > most:
                best, most = e, n
        return best, most

    def used(self, entry: PoolEntry) -> None:
        """An admission took its rows from ``entry``: it is the most recently used."""
        self._stamp += 1
        entry.stamp = self._stamp
        self.hits += 1
