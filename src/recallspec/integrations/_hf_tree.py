"""Tree verification over a transformers ``DynamicCache``: masks, positions, compaction.

Layout invariant. The batch keeps one cache whose per-layer tensors are
``[B, kv_heads, L, head_dim]``, but the L columns are not aligned across rows: row b's
cached entries are the columns where ``valid[b]`` is True, in text order, and
``kpos[b, j]`` is the position id column j was computed at. The other columns are
holes (left padding; draft nodes a row rejected while another row accepted more; a
shorter tree's filler rows) that every query masks out. So a row's positions come from
its own token count, never from a column index, and holes cost compute but never
change a result: their attention weight is exactly 0 (additive ``finfo.min`` underflows
to 0 after the softmax's max subtraction, as transformers' own padding masks do).

The cache holds every committed token of a row except the last one, the *root*: each
verification forward feeds the root and the draft tree, and afterwards the entries of
the root and of the accepted nodes become the row's newest cached entries.

Cache tensors are edited in place through ``layer.keys`` / ``layer.values`` of
``DynamicLayer`` (the layer kind a ``DynamicCache()`` built without a config creates
for every layer): ``DynamicLayer.update`` only concatenates, so any column order we
leave is what the next forward attends over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from recallspec.decoding.tree import DraftTree


def ancestors(tree: DraftTree) -> npt.NDArray[np.bool_]:
    """[n + 1, n + 1] bool: row q may attend to column k (q, k: 0 = root, i + 1 = node i)
    iff k is q itself or one of its ancestors (the root is everyone's ancestor)."""
    n = len(tree)
    out = np.zeros((n + 1, n + 1), np.bool_)
    out[0, 0] = True
    for i, p in enumerate(tree.parents.tolist()):
        out[i + 1] = out[p + 1]  # parents precede children: row p + 1 is complete
        out[i + 1, i + 1] = True
    return out


def depths(tree: DraftTree) -> npt.NDArray[np.int64]:
    """[n + 1]: 0 for the root, 1 + the parent's depth for node i (at index i + 1)."""
    out = np.zeros(len(tree) + 1, np.int64)
    for i, p in enumerate(tree.parents.tolist()):
        out[i + 1] = out[p + 1] + 1
    return out


@dataclass
class Layout:
    """Where each row's entries sit in the cache (the module docstring's invariant)."""

    valid: torch.Tensor  # [B, L] bool
    kpos: torch.Tensor  # [B, L] int64, position id of each column (holes: anything)

    @property
    def length(self) -> int:
        return int(self.valid.shape[1])


@dataclass(frozen=True)
class StepInputs:
    input_ids: torch.Tensor  # [B, N]
    position_ids: torch.Tensor  # [B, N]
    attention_mask: torch.Tensor | dict[str, torch.Tensor]  # [B, 1, N, L + N] additive
    qpos: torch.Tensor  # [B, N] == position_ids (kept for the cache layout)


@dataclass(frozen=True)
class Windows:
    """Which masks the model's forward takes: one tensor (``full`` = None: plain causal,
    an int: every layer slides over that many positions), or, for models mixing layer
    types, a dict keyed by ``config.layer_types`` names."""

    full: int | None = None
    sliding: int | None = None  # set: pass {"full_attention": .., "sliding_attention": ..}


def step_inputs(
    roots: Sequence[int], trees: Sequence[DraftTree], root_pos: Sequence[int], layout: Layout,
    dtype: torch.dtype, windows: Windows,
) -> StepInputs:
    """Inputs of one verification forward: row b feeds its root and tree (then filler
    copies of the root up to the widest row, attending only to themselves)."""
    device = layout.valid.device
    b, n = len(trees), max(len(t) for t in trees) + 1
    ids = np.empty((b, n), np.int64)
    pos = np.empty((b, n), np.int64)
    tree_allowed = np.zeros((b, n, n), np.bool_)
    for r, (root, tree, p0) in enumerate(zip(roots, trees, root_pos, strict=True)):
        m = len(tree) + 1
        ids[r, 0], ids[r, 1:m], ids[r, m:] = root, tree.tokens, root
        pos[r, :m] = p0 + depths(tree)
        pos[r, m:] = p0
        tree_allowed[r, :m, :m] = ancestors(tree)
        tree_allowed[r, np.arange(m, n), np.arange(m, n)] = True
    qpos = torch.from_numpy(pos).to(device)
    allowed = torch.cat(
        [layout.valid[:, None, :].expand(b, n, layout.length),
         torch.from_numpy(tree_allowed).to(device)], dim=2)
    kpos = torch.cat([layout.kpos, qpos], dim=1)

    def additive(window: int | None) -> torch.Tensor:
        a = allowed
        if window is not None:  # transformers' sliding overlay: q - k < window
            a = a & (qpos[:, :, None] - kpos[:, None, :] < window)
        zero = torch.zeros((), dtype=dtype, device=device)
        low = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=device)
        return torch.where(a, zero, low)[:, None]

    mask: torch.Tensor | dict[str, torch.Tensor]
    if windows.sliding is not None:
        mask = {"full_attention": additive(None), "sliding_attention": additive(windows.sliding)}
    else:
        mask = additive(windows.full)
    return StepInputs(torch.from_numpy(ids).to(device), qpos, mask, qpos)


def _layers(cache: Any) -> list[Any]:
    """The cache's initialised layers (a layer a model never wrote, e.g. KV sharing,
    has nothing to edit)."""
    return [lay for lay in cache.layers if getattr(lay, "is_initialized", False)
            and getattr(lay, "keys", None) is not None and lay.keys.numel()]


def _gather_columns(cache: Any, start: int, index: torch.Tensor) -> None:
    """Per row b, columns ``start + index[b]`` move to ``start + arange(K)``; the cache
    is cut after them. ``index`` [B, K] (on the cache's device)."""
    k = int(index.shape[1])
    for lay in _layers(cache):
        for name in ("keys", "values"):
            t = getattr(lay, name)
            idx = index[:, None, :, None].expand(t.shape[0], t.shape[1], k, t.shape[3])
            moved = torch.gather(t[:, :, start:], 2, idx)  # a copy: safe to write back
            t[:, :, start:start + k] = moved
            setattr(lay, name, t[:, :, :start + k])


def keep_accepted(
    cache: Any, layout: Layout, qpos: torch.Tensor, keep: Sequence[Sequence[int]]
) -> Layout:
    """After a verification forward appended N columns per row: row b keeps the columns
    ``keep[b]`` of that block (root first, then its accepted nodes, as block offsets),
    moved to the block's front in that order; the block is cut to the longest list."""
    device = layout.valid.device
    k = max(len(x) for x in keep)
    index = torch.zeros((len(keep), k), dtype=torch.int64)
    for r, cols in enumerate(keep):
        index[r, : len(cols)] = torch.tensor(cols, dtype=torch.int64)
    index = index.to(device)
    _gather_columns(cache, layout.length, index)
    counts = torch.tensor([len(x) for x in keep], device=device)
    new_valid = torch.arange(k, device=device)[None, :] < counts[:, None]
    return Layout(torch.cat([layout.valid, new_valid], 1),
                  torch.cat([layout.kpos, torch.gather(qpos, 1, index)], 1))


def select_rows(cache: Any, layout: Layout, rows: Sequence[int]) -> Layout:
    """Keep only batch rows ``rows`` (finished rows leave the batch)."""
    idx = torch.tensor(list(rows), dtype=torch.int64, device=layout.valid.device)
    for lay in _layers(cache):
        lay.keys = lay.keys.index_select(0, idx)
        lay.values = lay.values.index_select(0, idx)
    return Layout(layout.valid.index_select(0, idx), layout.kpos.index_select(0, idx))


def compact(cache: Any, layout: Layout) -> Layout:
    """Move every row's entries to the front (text order kept) and drop the columns
    that are holes in every row; a no-op for the results (holes are masked anyway)."""
    counts = layout.valid.sum(1)
    k = int(counts.max())
    # Stable sort on "is a hole": valid columns first, each group in column order.
    order = torch.sort((~layout.valid).to(torch.int8), dim=1, stable=True).indices[:, :k]
    _gather_columns(cache, 0, order)
    valid = torch.arange(k, device=order.device)[None, :] < counts[:, None]
    return Layout(valid, torch.gather(layout.kpos, 1, order))


def holes(layout: Layout) -> float:
    """Fraction of cache columns that are holes."""
    return 1.0 - float(layout.valid.float().mean()) if layout.valid.numel() else 0.0
