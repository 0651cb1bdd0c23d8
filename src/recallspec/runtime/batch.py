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

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
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
    # Padded-KV mode only (EMS-SD's vanilla baseline): the slot's cached prefix may hold
    # padding entries that no query may see. ``cache_valid`` is [cache_len] bool (None =
    # every cached key is real) and ``start_pos`` the logical position of the first new
    # row (None = cache_len; smaller when the prefix holds padding).
    cache_valid: torch.Tensor | None = None
    start_pos: int | None = None


@dataclass(frozen=True)
class BatchMetadata:
    """One flat ragged forward. Shapes: T = total new tokens, B = sequences, R = logit rows."""

    input_ids: torch.Tensor  # [T] int64: new token ids, sequences concatenated
    positions: torch.Tensor  # [T] int64: absolute position = cache_len + depth in the tree
    seq_index: torch.Tensor  # [T] int64: which sequence (0..B-1) each row belongs to
    cache_pos: torch.Tensor  # [T] int64: KV-cache position of each row (cache_len + local index)
    cache_slot_per_row: torch.Tensor  # [T] int64: KV-cache slot each row is written to
    parents: torch.Tensor  # [T] int64: local parent index within the sequence's run, -1 = none
    logits_indices: torch.Tensor  # [R] int64: rows whose logits the forward returns, in order
    query_start: tuple[int, ...]  # [B+1]: sequence b owns rows query_start[b]:query_start[b+1]
    cache_slots: tuple[int, ...]  # [B]: KV-cache slot of each sequence
    cache_lens: tuple[int, ...]  # [B]: cached tokens of each sequence before this forward
    is_chain: tuple[bool, ...]  # [B]: True when the sequence's run is a plain chain (causal mask)
    cache_valid: tuple[torch.Tensor | None, ...] = ()  # [B] of [cache_lens[b]] bool or None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return len(self.cache_slots)

    def rows(self, b: int) -> slice:
        return slice(self.query_start[b], self.query_start[b + 1])

    def kv_len(self, b: int) -> int:
        """Keys visible to sequence b after this forward's writes."""
        return self.cache_lens[b] + self.query_start[b + 1] - self.query_start[b]


def tree_depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node (root-level nodes, parent -1, have depth 0)."""
    depths: list[int] = []
    for i, p in enumerate(parents):
        if p >= i:
            raise ValueError(f"tree node {i} has parent {p}: parents must precede children")
        depths.append(0 if p < 0 else depths[p] + 1)
    return depths


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
    chains: list[bool] = []
    for b, s in enumerate(seqs):
        n = len(s.tokens)
        if n == 0:
            raise ValueError(f"sequence {b} has no new tokens")
        par = list(range(-1, n - 1)) if s.parents is None else list(s.parents)
        if len(par) != n:
            raise ValueError(f"sequence {b}: {n} tokens but {len(par)} parents")
        depths = tree_depths(par)
        if s.cache_valid is not None and tuple(s.cache_valid.shape) != (s.cache_len,):
            raise ValueError(f"sequence {b}: cache_valid must have shape [{s.cache_len}]")
        p0 = s.cache_len if s.start_pos is None else s.start_pos
        base = starts[-1]
        ids.extend(int(t) for t in s.tokens)
        pos.extend(p0 + d for d in depths)
        seq_index.extend([b] * n)
        cache_pos.extend(range(s.cache_len, s.cache_len + n))
        slot_rows.extend([s.slot] * n)
        parents.extend(par)
        if s.logits == "all":
            logit_rows.extend(range(base, base + n))
        elif s.logits == "last":
            logit_rows.append(base + n - 1)
        elif s.logits != "none":
            raise ValueError(f"unknown logits selector {s.logits!r}")
        starts.append(base + n)
        chains.append(all(p == i - 1 for i, p in enumerate(par)))
    # One array for the six [T] rows (each row of it is a contiguous view): building a
    # tensor from Python lists costs microseconds per call, per step (issue 18).
    rows = torch.from_numpy(
        np.array([ids, pos, seq_index, cache_pos, slot_rows, parents], dtype=np.int64))
    return BatchMetadata(
        input_ids=rows[0],
        positions=rows[1],
        seq_index=rows[2],
        cache_pos=rows[3],
        cache_slot_per_row=rows[4],
        parents=rows[5],
        logits_indices=torch.tensor(logit_rows, dtype=torch.int64),
        query_start=tuple(starts),
        cache_slots=tuple(s.slot for s in seqs),
        cache_lens=tuple(s.cache_len for s in seqs),
        is_chain=tuple(chains),
        cache_valid=tuple(s.cache_valid for s in seqs),
    )
