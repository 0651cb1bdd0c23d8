"""Verification of a draft tree against the target model's logits: pure functions.

Inputs are the draft tree (``DraftTree``: node i has token ``tokens[i]`` and parent
``parents[i]``, -1 = the root) and the target logits of one verification forward,
``logits[0]`` for the root (the last committed token) and ``logits[i + 1]`` for node i.

Definitions used throughout:
  * accepted tokens: the draft tokens on one root-to-node path that the target
    accepts, in order; ``accepted_nodes`` are their node indices.
  * bonus token: one more token chosen from the target's distribution at the end of
    the accepted path. Each step therefore commits ``len(accepted) + 1`` tokens,
    which is the step's *accept length*.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from recallspec.spec.sampling import Rng, SamplingParams, Weights, uniform
from recallspec.spec.tree import DraftTree


@dataclass(frozen=True)
class Verdict:
    accepted_nodes: tuple[int, ...]  # node indices of the accepted path, root side first
    tokens: tuple[int, ...]  # committed tokens: accepted draft tokens + the bonus token

    @property
    def accept_length(self) -> int:
        return len(self.tokens)


def verify_greedy(tree: DraftTree, logits: torch.Tensor) -> Verdict:
    """Greedy verification: the longest root-to-node path whose every token equals the
    target's argmax at its parent; the bonus token is the argmax at the path's end.

    The committed tokens are exactly what plain greedy decoding would produce next.
    """
    _check(tree, logits)
    # Only the rows on the walked path need their argmax (len(path) + 1 of n + 1 rows):
    # a reduction over the vocabulary per row is most of a greedy step's verification.
    rows = _numpy_view(logits)
    return _greedy_walk(tree.tokens.tolist(), tree.parents.tolist(),
                        lambda r: int(rows[r].argmax()))


def verify_greedy_argmax(
    tokens: Sequence[int], parents: Sequence[int], argmax: Sequence[int]
) -> Verdict:
    """``verify_greedy`` of the tree ``tokens``/``parents`` (``DraftTree``'s arrays as
    lists) from each row's argmax (first index of the maximum), as the native forward
    computes them (``BatchMetadata.argmax``): no logits are read."""
    if not len(tokens) == len(parents) == len(argmax) - 1:
        raise ValueError(f"need {len(tokens) + 1} row argmaxes and {len(tokens)} parents "
                         f"for a {len(tokens)}-node tree, got {len(argmax)} and {len(parents)}")
    return _greedy_walk(tokens, parents, argmax.__getitem__)


def _greedy_walk(
    tokens: Sequence[int], parents: Sequence[int], row_argmax: Callable[[int], int]
) -> Verdict:
    """The greedy path, asking ``row_argmax`` for the rows it walks (row 0 the root's,
    row i + 1 node i's). One pass in node order: a node's children come after it, and
    siblings carry distinct tokens, so at most one child of the current node matches."""
    path: list[int] = []
    node = -1
    want = row_argmax(0)
    for i, p in enumerate(parents):
        if p == node and tokens[i] == want:
            path.append(i)
            node = i
            want = row_argmax(i + 1)
    return Verdict(tuple(path), (*(tokens[i] for i in path), want))


def verify_sampling(
    tree: DraftTree,
    logits: torch.Tensor,
    params: SamplingParams,
    generator: Rng = None,
) -> Verdict:
    """Lossless sampling verification of a deterministic draft tree.

    At the current node with target distribution p (``Weights``), the children
    are tried in order: child x is accepted with probability p(x) under the current
    residual; if rejected, p(x) is set to 0 and p renormalised before the next child
    (multi-draft rejection with point-mass drafts). If a child is accepted, the walk
    continues from it with its own fresh distribution; if none is, the bonus token
    is sampled from the residual. Every committed token is thus distributed exactly
    as sampling from the model one token at a time.
    """
    _check(tree, logits)
    if params.greedy:
        return verify_greedy(tree, logits)
    children = tree.children()
    toks = tree.tokens.tolist()
    rows = _numpy_view(logits)
    path: list[int] = []
    node = -1
    while True:
        target = Weights(rows[node + 1], params)
        accepted = None
        for c in children[node + 1]:
            x = toks[c]
            px = target.prob(x)
            if px <= 0.0:
                continue
            u = uniform(generator)
            if u < px:
                accepted = c
                break
            target.remove(x)
        if accepted is None:
            bonus = target.draw(generator)
            return Verdict(tuple(path), (*(toks[i] for i in path), bonus))
        path.append(accepted)
        node = accepted


def sample(logits: torch.Tensor, params: SamplingParams, generator: Rng) -> int:
    """One token from a single row of logits (argmax when greedy)."""
    if params.greedy:
        return int(_numpy_view(logits).argmax())
    return Weights(logits, params).draw(generator)


def _numpy_view(logits: torch.Tensor) -> Any:
    """``logits`` as a numpy array (shared memory) when it can be, else as is. Both
    ``argmax`` return the first index of the maximum; numpy's is ~10x faster than
    torch's on the CPU over a large vocabulary, a per-step cost (issue 18)."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        return logits.detach().numpy()
    return logits


def _check(tree: DraftTree, logits: torch.Tensor) -> None:
    if logits.ndim != 2 or logits.shape[0] != len(tree) + 1:
        raise ValueError(
            f"need logits [{len(tree) + 1}, vocab] for a {len(tree)}-node tree, "
            f"got {tuple(logits.shape)}"
        )
