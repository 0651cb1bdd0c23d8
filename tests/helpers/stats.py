"""Statistical checks for the sampling tests: does a sample follow a distribution."""

from __future__ import annotations

from collections import Counter

import torch

from recallspec.decoding.sampling import SamplingParams
from recallspec.decoding.tree import DraftTree
from recallspec.decoding.verify import verify_sampling


def chi2_pvalue(counts: dict[int, int], probs: torch.Tensor, n: int) -> float:
    """Pearson chi-square goodness of fit, p-value via the regularized gamma function."""
    support = [i for i in range(len(probs)) if probs[i] > 0]
    stat = 0.0
    for i in support:
        e = n * float(probs[i])
        stat += (counts.get(i, 0) - e) ** 2 / e
    assert sum(counts.get(i, 0) for i in support) == n, "sample outside the support"
    dof = len(support) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(stat / 2.0)))


def first_two_tokens(tree: DraftTree, logits: torch.Tensor, params: SamplingParams,
                     gen: torch.Generator, n: int) -> tuple[Counter[int], Counter[int]]:
    """Sample-verify ``tree`` ``n`` times: how often each token came first, and how often
    each came second after the tree's first node (node 0) was accepted. A tree
    root -> {node 0, ...} tests both of sampling verification's distributions: the root's
    (the first token) and node 0's (the token after it)."""
    first: Counter[int] = Counter()
    after: Counter[int] = Counter()
    node0 = int(tree.tokens[0])
    for _ in range(n):
        v = verify_sampling(tree, logits, params, gen)
        first[v.tokens[0]] += 1
        if v.tokens[0] == node0:
            assert len(v.tokens) >= 2  # node 0 accepted: its row gives the next token
            after[v.tokens[1]] += 1
    return first, after
