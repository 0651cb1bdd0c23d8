"""Attention masks for ragged, tree-structured batches: all masks are built here.

For sequence b of a batch, query row i (local) may attend to
  * every cached key of its sequence (positions < cache_len), and
  * the new rows that are its ancestors in the draft tree, and itself,
and, for sliding-window layers, only keys whose position is within the window:
``pos_q - pos_k < window``. A slot's cached prefix may contain masked entries
(``meta.cache_valid[b]`` False, ``KVCache.pad``: EMS-SD's padded-KV benchmark ablation)
that no query sees; positions of the cached keys are then their logical positions (the
count of real keys before them).

A mask is a bool tensor ``[n_b, kv_len_b]`` (True = attend) or ``None`` when the
query may see every key (a single chain token with no window cut).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from recallspec.runtime.batch import BatchMetadata


def ancestor_matrix(parents: torch.Tensor) -> torch.Tensor:
    """[n, n] bool: entry (i, j) is True when j is i itself or an ancestor of i.

    ``parents`` is [n] int64 with local indices (-1 = root) in topological order.
    """
    n = int(parents.shape[0])
    anc = torch.eye(n, dtype=torch.bool)
    par = parents.tolist()
    for i in range(n):
        p = par[i]
        if p >= 0:
            anc[i] |= anc[p]
    return anc


@dataclass(frozen=True)
class AttentionMasks:
    """Per-sequence masks for one forward, one list per distinct window size."""

    full: tuple[torch.Tensor | None, ...]  # [B] masks for global-attention layers
    windowed: dict[int, tuple[torch.Tensor | None, ...]]  # window -> [B] masks

    def for_layer(self, window: int | None) -> tuple[torch.Tensor | None, ...]:
        return self.full if window is None else self.windowed[window]


def build_attention_masks(meta: BatchMetadata, windows: set[int] | None = None) -> AttentionMasks:
    """Build every mask the forward needs, once, for all layers."""
    full: list[torch.Tensor | None] = []
    windowed: dict[int, list[torch.Tensor | None]] = {w: [] for w in (windows or set())}
    for b in range(meta.num_seqs):
        rows = meta.rows(b)
        n = rows.stop - rows.start
        c = meta.cache_lens[b]
        kv = c + n
        valid = meta.cache_valid[b] if meta.cache_valid else None  # [c] bool or None
        if meta.is_chain[b] and n == 1 and valid is None:
            base: torch.Tensor | None = None
        else:
            base = torch.ones(n, kv, dtype=torch.bool)
            if valid is not None:
                base[:, :c] = valid[None, :]
            if meta.is_chain[b]:
                base[:, c:] = torch.ones(n, n, dtype=torch.bool).tril_()
            else:
                base[:, c:] = ancestor_matrix(meta.parents[rows])
        full.append(base)
        for w, masks in windowed.items():
            q_pos = meta.positions[rows]  # [n]
            cached_pos = (
                torch.arange(c, dtype=torch.int64) if valid is None
                else valid.to(torch.int64).cumsum(0) - 1
            )
            k_pos = torch.cat([cached_pos, q_pos])  # [kv]
            in_window = (q_pos[:, None] - k_pos[None, :]) < w  # [n, kv]
            if base is None and bool(in_window.all()):
                masks.append(None)
            else:
                masks.append(in_window if base is None else base & in_window)
    return AttentionMasks(
        full=tuple(full), windowed={w: tuple(m) for w, m in windowed.items()}
    )
