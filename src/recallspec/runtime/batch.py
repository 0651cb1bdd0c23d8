"""Flat ragged batch metadata for one forward pass.

A forward pass processes T new tokens that belong to B sequences. Each sequence
contributes a contiguous run of rows (its prompt chunk, its last token, or its last
token followed by a draft tree). Nothing is padded: sequence b owns the rows
``query_start[b]:query_start[b+1]`` and writes its keys/values into its own KV-cache
slot starting at ``cache_lens[b]``.

Tree structure is expressed by ``parents``: within a sequence's run, row i attends to
the whole cached prefix of its sequence plus itself and its ancestors in the run.
A chain (prefill, plain decoding, a linear draft) has ``parents[i] = i - 1``.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass(frozen=True)
class SequenceInput:
    """What one sequence feeds into a forward pass.

    ``parents`` are local indices into ``tokens`` (-1 for the first token, which
    follows the cached prefix directly). Node i must come after its parent
    (topological order), so ``parents[i] < i``.
    """

    slot: int  # KV-cache slot of this sequence
    cache_len: int  # tokens already in the slot; new rows are written from here
    tokens: Sequence[int]  # new tokens, length n >= 1
    parents: Sequence[int] | None = None  # local parents, None = chain
    logits: str = "all"  # which rows need logits: "all", "last" or "none"
    # Masked KV entries (``KVCache.pad``; written only by EMS-SD's padded-KV baselines, a
    # benchmark ablation): the slot's cached prefix may hold entries that no query may
    # see. ``cache_valid`` is [cache_len] bool (None = every cached key is real) and
    # ``start_pos`` the logical position of the first new row (None = cache_len; smaller
    # when the prefix holds masked entries). Generic here because the native forward's
    # C++ side implements the mask (``csrc/native/native_plan.cpp``).
    cache_valid: torch.Tensor | None = None
    start_pos: int | None = None


@dataclass(frozen=True, eq=False)  # identity: compared and hashed as objects
class BatchMetadata:
    """One flat ragged forward. Shapes: T = total new tokens, B = sequences, R = logit rows.

    Every integer array lives in ONE int64 buffer, ``ints``, filled by one call: the
    native forward reads addresses into it, and tensors are made only where asked for
    (the named views below), since each tensor or numpy call on a decode step's path
    costs microseconds, many more right after a forward has swept the caches (issue 18).
    """

    # [6 T + 2 R] int64 ("q"): input_ids, positions, seq_index, cache_pos,
    # cache_slot_per_row, parents ([T] each, the views below), then logits_indices [R],
    # then argmax [R] (-1 until a forward that computes it writes it).
    ints: array[int]
    num_tokens: int  # T
    num_logits: int  # R
    query_start: tuple[int, ...]  # [B+1]: sequence b owns rows query_start[b]:query_start[b+1]
    cache_slots: tuple[int, ...]  # [B]: KV-cache slot of each sequence
    cache_lens: tuple[int, ...]  # [B]: cached tokens of each sequence before this forward
    is_chain: tuple[bool, ...]  # [B]: True when the sequence's run is a plain chain (causal mask)
    cache_valid: tuple[torch.Tensor | None, ...] = ()  # [B] of [cache_lens[b]] bool or None

    @cached_property
    def _tensor(self) -> torch.Tensor:  # ``ints`` as a tensor (shared memory)
        return torch.frombuffer(self.ints, dtype=torch.int64)

    def _row_array(self, i: int) -> torch.Tensor:
        t = self.num_tokens
        return self._tensor[i * t : (i + 1) * t]

    @cached_property
    def input_ids(self) -> torch.Tensor:  # [T]: new token ids, sequences concatenated
        return self._row_array(0)

    @cached_property
    def positions(self) -> torch.Tensor:  # [T]: absolute position = cache_len + tree depth
        return self._row_array(1)

    @cached_property
    def seq_index(self) -> torch.Tensor:  # [T]: which sequence (0..B-1) each row belongs to
        return self._row_array(2)

    @cached_property
    def cache_pos(self) -> torch.Tensor:  # [T]: KV-cache position (cache_len + local index)
        return self._row_array(3)

    @cached_property
    def cache_slot_per_row(self) -> torch.Tensor:  # [T]: KV-cache slot each row is written to
        return self._row_array(4)

    @cached_property
    def parents(self) -> torch.Tensor:  # [T]: local parent index in the sequence's run, -1 = none
        return self._row_array(5)

    @cached_property
    def logits_indices(self) -> torch.Tensor:  # [R]: rows whose logits the forward returns
        t = 6 * self.num_tokens
        return self._tensor[t : t + self.num_logits]

    @cached_property
    def argmax(self) -> torch.Tensor:
        """[R]: the argmax of each returned logits row (first index of the maximum, as
        ``torch.argmax``), written by a forward that computes it (the native one); -1
        until then."""
        t = 6 * self.num_tokens + self.num_logits
        return self._tensor[t : t + self.num_logits]

    def argmax_list(self) -> list[int]:
        """``argmax`` as a list, read without a tensor."""
        t = 6 * self.num_tokens + self.num_logits
        return self.ints[t : t + self.num_logits].tolist()

    @property
    def num_seqs(self) -> int:
        return len(self.cache_slots)

    def rows(self, b: int) -> slice:
        return slice(self.query_start[b], self.query_start[b + 1])

    def kv_len(self, b: int) -> int:
        """Keys visible to sequence b after this forward's writes."""
        return self.cache_lens[b] + self.query_start[b + 1] - self.query_start[b]


def tree_depths(parents: Sequence[int]) -> tuple[list[int], bool]:
    """Depth of each node (root-level nodes, parent -1, have depth 0), and whether the
    nodes form a chain (``parents[i] = i - 1``)."""
    depths: list[int] = []
    chain = True
    for i, p in enumerate(parents):
        if p >= i:
            raise ValueError(f"tree node {i} has parent {p}: parents must precede children")
        depths.append(0 if p < 0 else depths[p] + 1)
        chain = chain and p == i - 1
    return depths, chain


def build_batch(seqs: Sequence[SequenceInput]) -> BatchMetadata:
    """Concatenate per-sequence inputs into one ragged batch (no padding)."""
    if not seqs:
        raise ValueError("a batch needs at least one sequence")
    ids: list[int] = []
    pos: list[int] = []
    seq_index: list[int] = []
    cache_pos: list[int] = []
    slot_rows: list[int] = []
    parents: list[int] = []
    logit_rows: list[int] = []
    starts = [0]
    slots: list[int] = []
    lens: list[int] = []
    chains: list[bool] = []
    valid: list[torch.Tensor | None] = []
    for b, s in enumerate(seqs):
        n = len(s.tokens)
        if n == 0:
            raise ValueError(f"sequence {b} has no new tokens")
        p0 = s.cache_len if s.start_pos is None else s.start_pos
        if s.parents is None:  # a chain: depth = local index
            parents.extend(range(-1, n - 1))
            pos.extend(range(p0, p0 + n))
            chains.append(True)
        else:
            if len(s.parents) != n:
                raise ValueError(f"sequence {b}: {n} tokens but {len(s.parents)} parents")
            depths, chain = tree_depths(s.parents)
            parents.extend(s.parents)
            pos.extend([p0 + d for d in depths])
            chains.append(chain)
        if s.cache_valid is not None and tuple(s.cache_valid.shape) != (s.cache_len,):
            raise ValueError(f"sequence {b}: cache_valid must have shape [{s.cache_len}]")
        base = starts[-1]
        ids.extend(s.tokens)
        seq_index.extend([b] * n)
        cache_pos.extend(range(s.cache_len, s.cache_len + n))
        slot_rows.extend([s.slot] * n)
        if s.logits == "all":
            logit_rows.extend(range(base, base + n))
        elif s.logits == "last":
            logit_rows.append(base + n - 1)
        elif s.logits != "none":
            raise ValueError(f"unknown logits selector {s.logits!r}")
        starts.append(base + n)
        slots.append(s.slot)
        lens.append(s.cache_len)
        valid.append(s.cache_valid)
    r = len(logit_rows)
    return BatchMetadata(  # (array("q", ...) takes anything with __index__, nothing else)
        ints=array("q", [*ids, *pos, *seq_index, *cache_pos, *slot_rows, *parents,
                         *logit_rows, *([-1] * r)]),
        num_tokens=starts[-1],
        num_logits=r,
        query_start=tuple(starts),
        cache_slots=tuple(slots),
        cache_lens=tuple(lens),
        is_chain=tuple(chains),
        cache_valid=tuple(valid),
    )
