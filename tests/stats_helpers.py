"""Statistical checks for the sampling tests: does a sample follow a distribution."""

from __future__ import annotations

import torch


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
