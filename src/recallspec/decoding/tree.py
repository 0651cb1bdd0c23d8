"""Draft trees as plain arrays.

A draft tree hangs below a *root*: the last committed token, whose KV is not yet
cached (it is the first row of the verification forward). Node i carries
``tokens[i]`` and hangs below ``parents[i]`` (-1 = the root). Nodes are in
topological order (``parents[i] < i``) and siblings carry distinct tokens.
A chain draft has ``parents = [-1, 0, 1, ...]``.

The constructor checks shapes and topological order. Trees built here from a valid
tree or by construction (``empty``, ``chain``, ``truncate``, ``limit_depth``) skip that
check (``_trusted``): the planner builds and cuts several trees a step, and the check
cost more than the rest of a cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class DraftTree:
    tokens: npt.NDArray[np.int64]  # [n] draft token ids
    parents: npt.NDArray[np.int64]  # [n] parent node index, -1 = root

    def __post_init__(self) -> None:
        if self.tokens.ndim != 1 or self.tokens.shape != self.parents.shape:
            raise ValueError(
                f"tokens {self.tokens.shape} and parents {self.parents.shape} must be equal 1-D"
            )
        if len(self.parents) and (
            np.any(self.parents >= np.arange(len(self.parents))) or np.any(self.parents < -1)
        ):
            raise ValueError("draft tree parents must satisfy -1 <= parents[i] < i")

    @classmethod
    def _trusted(
        cls, tokens: npt.NDArray[np.int64], parents: npt.NDArray[np.int64]
    ) -> DraftTree:
        """A tree without ``__post_init__``'s check, for arrays that satisfy it by
        construction (the callers below say why). Never for arrays from outside."""
        tree = object.__new__(cls)
        object.__setattr__(tree, "tokens", tokens)
        object.__setattr__(tree, "parents", parents)
        return tree

    def __len__(self) -> int:
        return len(self.tokens)

    @staticmethod
    def empty() -> DraftTree:
        return DraftTree._trusted(np.zeros(0, np.int64), np.zeros(0, np.int64))

    @staticmethod
    def chain(tokens: Sequence[int] | npt.NDArray[np.integer]) -> DraftTree:
        n = len(tokens)
        # reshape(n) raises unless the tokens are n scalars; parents -1..n-2 are a chain.
        return DraftTree._trusted(
            np.asarray(tokens, np.int64).reshape(n), np.arange(-1, n - 1, dtype=np.int64)
        )

    @staticmethod
    def from_lists(tokens: Sequence[int], parents: Sequence[int]) -> DraftTree:
        return DraftTree(np.asarray(tokens, np.int64), np.asarray(parents, np.int64))

    @property
    def is_chain(self) -> bool:
        return bool(np.array_equal(self.parents, np.arange(-1, len(self) - 1)))

    def truncate(self, max_nodes: int) -> DraftTree:
        """Keep the first ``max_nodes`` nodes (still a valid tree: parents precede children)."""
        if len(self) <= max_nodes:
            return self
        # A prefix of a topologically ordered tree is one (parents precede children).
        return DraftTree._trusted(self.tokens[:max_nodes].copy(),
                                  self.parents[:max_nodes].copy())

    def children(self) -> list[list[int]]:
        """children()[p + 1] lists the nodes under p (index 0 = the root)."""
        out: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for i, p in enumerate(self.parents.tolist()):
            out[p + 1].append(i)
        return out

    def depth(self) -> int:
        """Longest root-to-leaf path in nodes (0 for an empty tree)."""
        d = [0] * len(self)
        for i, p in enumerate(self.parents.tolist()):
            d[i] = 1 if p < 0 else d[p] + 1
        return max(d, default=0)


def limit_depth(tree: DraftTree, max_depth: int) -> DraftTree:
    """Drop every node deeper than ``max_depth`` (depth 1 = children of the root)."""
    if max_depth <= 0:
        return DraftTree.empty()
    if len(tree) <= max_depth:  # no path is longer than the tree has nodes
        return tree
    par = tree.parents.tolist()
    depth: list[int] = []
    for p in par:
        depth.append(1 if p < 0 else depth[p] + 1)
    if max(depth, default=0) <= max_depth:
        return tree
    keep = [i for i, d in enumerate(depth) if d <= max_depth]
    new_index = {old: new for new, old in enumerate(keep)}
    # A kept node's parent is shallower, so kept too and renumbered below it (``keep``
    # is in order): still topological.
    return DraftTree._trusted(
        tree.tokens[keep].copy(),
        np.asarray([-1 if par[i] < 0 else new_index[par[i]] for i in keep], np.int64),
    )
