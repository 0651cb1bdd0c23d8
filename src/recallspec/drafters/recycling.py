"""Token Recycling (``recycling``): drafts from the candidates verification threw away.

Every verification forward yields logits for the root and every draft-tree node,
accepted or not. Token Recycling keeps an adjacency table ``table[token] = the top-k
next tokens the model predicted after that token`` (k = 8), overwritten with each
row's top-k after every verification, and drafts by expanding a *static* tree
template breadth-first through the table, starting at the last committed token.

The table belongs to the drafter instance, not to a request: the engine keeps one
instance per (name, options), so the table stays warm across requests. It starts
empty (-1 = unknown) and a proposal only contains nodes whose token is known.

Templates are prefix-closed sets of *rank paths*: the path "01" is the node reached
by taking the rank-0 successor of the root token, then the rank-1 successor of that.
Both templates below were chosen by the same rule: the ``n`` paths of depth <= 6
with the largest product of per-rank hit rates, assuming the rank-r successor is
right with probability ``RANK_HIT[r]`` (a typical top-8 profile; an assumption, not a
measurement on this model). Nodes are kept *best-first* (by that product), so the
first ``m`` nodes of a template are the best ``m``-node tree under the same rule: a
node budget (``max_nodes``, the engine's cap, cost-aware sizing) cuts the least likely
nodes, not a whole level (a BFS prefix of 16 nodes would be depth 2 only).

* ``sam60`` - the SAM-Decoding[T] setting: 60 nodes, depth 6.
* ``tr80`` - the Token Recycling paper's size: 80 nodes, depth 6 (same rule, so its
  shape is ours, not a copy of the paper's hand-tuned tree).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from recallspec.decoding.tree import DraftTree
from recallspec.drafters.base import Drafter

TOPK = 8  # successors kept per token; ranks in templates are < TOPK
# Assumed probability that the rank-r successor is the model's next token.
RANK_HIT = (0.52, 0.14, 0.07, 0.045, 0.03, 0.022, 0.017, 0.013)

_SAM60 = (
    "0 1 2 3 4 5 6 7 00 01 02 03 04 05 06 07 10 11 12 20 21 30 40 50 60 70 000 001 002 003 "
    "004 010 011 020 030 040 100 101 110 200 300 400 0000 0001 0002 0003 0010 0020 0030 0100 "
    "0200 1000 2000 00000 00001 00010 00100 01000 10000 000000"
)
_TR80 = (
    "0 1 2 3 4 5 6 7 00 01 02 03 04 05 06 07 10 11 12 13 20 21 30 31 40 50 60 70 000 001 002 "
    "003 004 005 010 011 020 030 040 050 100 101 110 200 300 400 500 0000 0001 0002 0003 0010 "
    "0011 0020 0030 0100 0101 0110 0200 0300 1000 1001 1010 1100 2000 3000 00000 00001 00002 "
    "00010 00100 01000 10000 000000 000001 000010 000100 001000 010000 100000"
)


def path_value(path: Sequence[int]) -> float:
    """The assumed probability that a whole rank path is accepted."""
    return float(np.prod([RANK_HIT[r] for r in path]))


@dataclass(frozen=True)
class TreeTemplate:
    """A static draft-tree shape, nodes best-first (decreasing ``path_value``).

    Invariants: ``parents[i] < i`` (a child's value is below its parent's, and ties go
    to the shorter path), so every prefix ``[:m]`` is itself a tree; siblings have
    distinct ranks, so the tokens they get from one table row are distinct.
    """

    parents: npt.NDArray[np.int64]  # [n] parent node, -1 = root
    ranks: npt.NDArray[np.int64]  # [n] index into the parent token's top-k row
    by_depth: tuple[npt.NDArray[np.int64], ...]  # [depth] ascending node indices per depth

    def __len__(self) -> int:
        return int(self.parents.shape[0])

    @property
    def depth(self) -> int:
        return len(self.by_depth)

    @staticmethod
    def from_paths(paths: Sequence[Sequence[int]]) -> TreeTemplate:
        """Build from rank paths; every proper prefix of a path must be a path too."""
        uniq = {tuple(int(r) for r in p) for p in paths}
        for p in uniq:
            if not p or any(not 0 <= r < TOPK for r in p):
                raise ValueError(f"bad template path {p}: need 1..depth ranks in [0, {TOPK})")
            if len(p) > 1 and p[:-1] not in uniq:
                raise ValueError(f"template path {p} lacks its prefix {p[:-1]}")
        order = sorted(uniq, key=lambda p: (-path_value(p), len(p), p))
        index = {p: i for i, p in enumerate(order)}
        parents = np.asarray([index[p[:-1]] if len(p) > 1 else -1 for p in order], np.int64)
        ranks = np.asarray([p[-1] for p in order], np.int64)
        depths = np.asarray([len(p) for p in order], np.int64)
        top = int(depths.max(initial=0))
        by_depth = tuple(np.flatnonzero(depths == d).astype(np.int64) for d in range(1, top + 1))
        return TreeTemplate(parents, ranks, by_depth)

    @staticmethod
    def from_string(spec: str) -> TreeTemplate:
        """Paths as digit strings separated by spaces, e.g. ``"0 1 00"``."""
        return TreeTemplate.from_paths([[int(c) for c in w] for w in spec.split()])


TEMPLATES: dict[str, str] = {"sam60": _SAM60, "tr80": _TR80}


def get_template(name: str) -> TreeTemplate:
    try:
        return TreeTemplate.from_string(TEMPLATES[name])
    except KeyError:
        raise ValueError(f"unknown template {name!r}; known: {', '.join(TEMPLATES)}") from None


class AdjacencyTable:
    """``rows[token]`` = the latest top-k successors predicted after ``token`` (-1 = unknown).

    Allocated on the first update, when the vocabulary size is seen in the logits.
    """

    def __init__(self, k: int = TOPK) -> None:
        self.k = k
        self.rows: npt.NDArray[np.int32] | None = None

    def update(self, tokens: npt.NDArray[np.int64], logits: torch.Tensor) -> None:
        """``tokens[i]`` is the token whose next-token logits are ``logits[i]``."""
        if logits.shape[0] != tokens.shape[0]:
            raise ValueError(f"{tokens.shape[0]} tokens but {logits.shape[0]} logit rows")
        if self.rows is None:
            self.rows = np.full((int(logits.shape[-1]), self.k), -1, np.int32)
        k = min(self.k, int(logits.shape[-1]))  # a vocabulary under k leaves columns at -1
        top = torch.topk(logits.float(), k, dim=-1).indices.numpy().astype(np.int32)
        # A token occurring twice in one tree gets one of its rows; either is a fresh guess.
        self.rows[tokens, :k] = top

    def expand(self, root: int, tpl: TreeTemplate, max_nodes: int) -> DraftTree:
        """The template's first (best) ``max_nodes`` nodes, tokens gathered depth by depth.

        A node is dropped when its table entry is unknown or its parent was dropped;
        the survivors are renumbered, keeping the template's order (parents first).
        """
        n = min(len(tpl), max_nodes)
        if self.rows is None or n <= 0 or not 0 <= root < self.rows.shape[0]:
            return DraftTree.empty()
        rows = self.rows
        tokens = np.full(n, -1, np.int64)
        for d, nodes in enumerate(tpl.by_depth):
            idx = nodes[: int(np.searchsorted(nodes, n))]  # this depth's nodes among [:n]
            if not len(idx):
                break  # a prefix of a tree holds no deeper node either
            src = np.full(len(idx), root, np.int64) if d == 0 else tokens[tpl.parents[idx]]
            ok = src >= 0  # a dropped parent (-1) drops its children
            got = np.full(len(idx), -1, np.int64)
            got[ok] = rows[src[ok], tpl.ranks[idx][ok]]
            tokens[idx] = got
        keep = tokens >= 0
        if keep.all():
            return DraftTree(tokens, tpl.parents[:n].copy())
        new_index = np.cumsum(keep) - 1  # old node -> new node, valid where keep
        par = tpl.parents[:n][keep]
        par = np.where(par >= 0, new_index[np.maximum(par, 0)], -1)
        return DraftTree(tokens[keep], par.astype(np.int64))


class RecyclingDrafter(Drafter):
    """Token Recycling; per request it only remembers the last committed token."""

    name = "recycling"
    needs_logits = True

    def __init__(self, *, template: str = "sam60", k: int = TOPK) -> None:
        if not 1 <= k <= TOPK:
            raise ValueError(f"k must be in [1, {TOPK}]")
        self.template_name = template
        self.template = get_template(template)
        if int(self.template.ranks.max(initial=0)) >= k:
            raise ValueError(f"template {template!r} uses ranks >= k={k}")
        self.table = AdjacencyTable(k)
        self._last: dict[int, int] = {}  # rid -> last committed token (the next root)

    def start(self, rid: int, prompt: Sequence[int]) -> None:
        if not prompt:
            raise ValueError("empty prompt")
        self._last[rid] = int(prompt[-1])

    def propose(self, rid: int, max_nodes: int) -> DraftTree:
        return self.table.expand(self._last[rid], self.template, max_nodes)

    def observe(
        self, rid: int, accepted: Sequence[int], tree: DraftTree, logits: torch.Tensor | None
    ) -> None:
        if logits is not None:
            # Row 0 holds the logits after the old root, row i + 1 those after node i.
            row_tokens = np.concatenate(([self._last[rid]], tree.tokens)).astype(np.int64)
            self.table.update(row_tokens, logits)
        if accepted:
            self._last[rid] = int(accepted[-1])

    def stop(self, rid: int) -> None:
        self._last.pop(rid, None)


def make_recycling(*, template: str = "sam60", k: int = TOPK) -> RecyclingDrafter:
    return RecyclingDrafter(template=template, k=k)
