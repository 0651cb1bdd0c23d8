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
  * penalties (``decoding/penalties.py``): with a ``Penalties`` context, every row is
    penalised with the draft path to it before it is read, greedy included.
  * masks (``decoding/masks.py``): with a grammar's ``masks`` ([1 + len(tree), words]),
    every row is masked after its penalties: forbidden tokens are never chosen. The
    tree's nodes must be ones the grammar allows (``Constraint.constrain`` cut the
    others), so each row's mask is the one constrained plain decoding has there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from recallspec.decoding import masks as _masks
from recallspec.decoding.masks import Mask
from recallspec.decoding.penalties import Penalties
from recallspec.decoding.sampling import Rng, SamplingParams, Weights
from recallspec.decoding.tree import DraftTree


@dataclass(frozen=True)
class Verdict:
    accepted_nodes: tuple[int, ...]  # node indices of the accepted path, root side first
    tokens: tuple[int, ...]  # committed tokens: accepted draft tokens + the bonus token

    @property
    def accept_length(self) -> int:
        return len(self.tokens)

    @property
    def rows(self) -> tuple[int, ...]:
        """The logits row each committed token was chosen from: the root's (0) for the
        first, accepted node i's (i + 1) for the token after it."""
        return (0, *(n + 1 for n in self.accepted_nodes))


def verify_greedy(
    tree: DraftTree, logits: torch.Tensor, penalties: Penalties | None = None,
    masks: Mask | None = None,
) -> Verdict:
    """Greedy verification: the longest root-to-node path whose every token equals the
    target's argmax at its parent; the bonus token is the argmax at the path's end.
    With ``penalties``, the argmax of each row penalised given the path to it; with
    ``masks``, of each row's allowed tokens.

    The committed tokens are exactly what plain greedy decoding would produce next.
    """
    _check(tree, logits, masks)
    # Only the rows on the walked path need their argmax (len(path) + 1 of n + 1 rows):
    # a reduction over the vocabulary per row is most of a greedy step's verification.
    rows = _numpy_view(logits)
    toks = tree.tokens.tolist()
    if penalties is None and masks is None:
        return _greedy_walk(toks, tree.parents.tolist(), lambda r, _: int(rows[r].argmax()))
    return _greedy_walk(toks, tree.parents.tolist(), lambda r, path: int(
        _row(rows[r], r, penalties, masks, [toks[i] for i in path]).argmax()))


def verify_greedy_argmax(
    tokens: Sequence[int], parents: Sequence[int], argmax: Sequence[int]
) -> Verdict:
    """``verify_greedy`` of the tree ``tokens``/``parents`` (``DraftTree``'s arrays as
    lists) from each row's argmax (first index of the maximum), as the native forward
    computes them (``BatchMetadata.argmax``): no logits are read."""
    if not len(tokens) == len(parents) == len(argmax) - 1:
        raise ValueError(f"need {len(tokens) + 1} row argmaxes and {len(tokens)} parents "
                         f"for a {len(tokens)}-node tree, got {len(argmax)} and {len(parents)}")
    return _greedy_walk(tokens, parents, lambda r, _: argmax[r])


def verify_greedy_masked_argmax(
    tokens: Sequence[int], parents: Sequence[int], argmax: Sequence[int],
    logits: torch.Tensor, masks: Mask,
) -> Verdict:
    """``verify_greedy(tree, logits, masks=masks)`` from the rows' own argmax: masking
    only removes tokens, so where a row's argmax is allowed it is the masked argmax, and
    only the other rows' logits are read."""
    if not len(tokens) == len(parents) == len(argmax) - 1 == len(masks) - 1:
        raise ValueError(f"need {len(tokens) + 1} row argmaxes and masks for a "
                         f"{len(tokens)}-node tree, got {len(argmax)} and {len(masks)}")
    rows = _numpy_view(logits)

    def best(r: int, _: list[int]) -> int:
        a = argmax[r]
        return a if _masks.allowed(masks[r], a) else _masks.masked_argmax(rows[r], masks[r])
    return _greedy_walk(tokens, parents, best)


def _row(row: Any, r: int, penalties: Penalties | None, masks: Mask | None,
         path: list[int]) -> Any:
    """Row ``r`` of a tree's logits as decoding reads it: penalised given ``path`` (the
    draft tokens down to its node), then masked."""
    if penalties is not None:
        row = penalties.apply(row, path)
    if masks is not None:
        row = _masks.apply(row, masks[r])
    return row


def _greedy_walk(
    tokens: Sequence[int], parents: Sequence[int],
    row_argmax: Callable[[int, list[int]], int],
) -> Verdict:
    """The greedy path, asking ``row_argmax(row, path)`` for the rows it walks (row 0
    the root's, row i + 1 node i's; ``path``: the accepted nodes down to the row's node).
    One pass in node order: a node's children come after it, and siblings carry distinct
    tokens, so at most one child of the current node matches."""
    path: list[int] = []
    node = -1
    want = row_argmax(0, path)
    for i, p in enumerate(parents):
        if p == node and tokens[i] == want:
            path.append(i)
            node = i
            want = row_argmax(i + 1, path)
    return Verdict(tuple(path), (*(tokens[i] for i in path), want))


def verify_sampling(
    tree: DraftTree,
    logits: torch.Tensor,
    params: SamplingParams,
    generator: Rng = None,
    penalties: Penalties | None = None,
    masks: Mask | None = None,
) -> Verdict:
    """Lossless sampling verification of a deterministic draft tree, coupled to plain
    sampling through the generator.

    At the current node the next token is drawn from the target distribution
    (``Weights`` of the node's row, penalised given the path), with one uniform of
    ``generator``, exactly as plain sampling draws it. The child carrying that token, if
    any, is accepted and the walk goes on from it; otherwise the drawn token is the
    bonus token. Every committed position thus takes one uniform, in order, and its
    token from the distribution plain sampling has there: the committed text is what
    plain sampling with the same generator draws (the rows being the same bits), so a
    seed gives the same text with any drafter or none, alone or batched. A draft only
    decides how many of these draws one forward pays for. Child x is accepted with
    probability p(x), as under multi-draft rejection with point-mass drafts (which also
    accepts some child with probability sum of p over the children). With ``masks``,
    each row is masked after its penalties (the module docstring).
    """
    _check(tree, logits, masks)
    if params.greedy:
        return verify_greedy(tree, logits, penalties, masks)
    children = tree.children()
    toks = tree.tokens.tolist()
    rows = _numpy_view(logits)
    path: list[int] = []
    node = -1
    while True:
        row = rows[node + 1]
        if penalties is not None or masks is not None:
            row = _row(row, node + 1, penalties, masks, [toks[i] for i in path])
        token = Weights(row, params).draw(generator)
        # Siblings carry distinct tokens: at most one child matches.
        accepted = next((c for c in children[node + 1] if toks[c] == token), None)
        if accepted is None:
            return Verdict(tuple(path), (*(toks[i] for i in path), token))
        path.append(accepted)
        node = accepted


def sample(
    logits: torch.Tensor, params: SamplingParams, generator: Rng,
    penalties: Penalties | None = None, mask: Mask | None = None,
) -> int:
    """One token from a single row of logits (argmax when greedy), penalised as the
    next token of the committed text, then masked by ``mask`` (one row's)."""
    row = _numpy_view(logits) if penalties is None else penalties.apply(logits)
    if mask is not None:
        row = _masks.apply(row, mask)
    if params.greedy:
        return int(row.argmax())
    return Weights(row, params).draw(generator)


def _numpy_view(logits: torch.Tensor) -> Any:
    """``logits`` as a numpy array (shared memory) when it can be, else as is. Both
    ``argmax`` return the first index of the maximum; numpy's is much faster than
    torch's on the CPU over a large vocabulary, a per-step cost (issue 18)."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        return logits.detach().numpy()
    return logits


def _check(tree: DraftTree, logits: torch.Tensor, masks: Mask | None = None) -> None:
    if logits.ndim != 2 or logits.shape[0] != len(tree) + 1:
        raise ValueError(
            f"need logits [{len(tree) + 1}, vocab] for a {len(tree)}-node tree, "
            f"got {tuple(logits.shape)}"
        )
    if masks is not None and (masks.ndim != 2 or masks.shape[0] != len(tree) + 1
                              or masks.shape[1] < _masks.words(logits.shape[1])):
        raise ValueError(f"need masks [{len(tree) + 1}, {_masks.words(logits.shape[1])}] "
                         f"for a {len(tree)}-node tree, got {tuple(masks.shape)}")
