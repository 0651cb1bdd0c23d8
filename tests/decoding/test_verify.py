"""Verification: greedy path selection and lossless sampling on rigged logits."""

from __future__ import annotations

import collections

import pytest
import torch
from helpers.stats import chi2_pvalue, first_two_tokens

from recallspec.decoding.sampling import SamplingParams, inverse_cdf, probabilities
from recallspec.decoding.tree import DraftTree, limit_depth
from recallspec.decoding.verify import verify_greedy, verify_greedy_argmax

V = 6


def rigged(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32).log()


def one_hot_logits(argmaxes: list[int]) -> torch.Tensor:
    x = torch.zeros(len(argmaxes), V)
    for i, a in enumerate(argmaxes):
        x[i, a] = 5.0
    return x


def test_greedy_chain_accepts_prefix_and_bonus() -> None:
    tree = DraftTree.chain([3, 4, 5])
    # target: root->3, after 3 ->4, after 4 ->1 (draft said 5): accept 3,4 then bonus 1
    v = verify_greedy(tree, one_hot_logits([3, 4, 1, 2]))
    assert v.accepted_nodes == (0, 1)
    assert v.tokens == (3, 4, 1)


def test_greedy_rejects_first_token() -> None:
    v = verify_greedy(DraftTree.chain([3, 4]), one_hot_logits([2, 4, 0]))
    assert v.accepted_nodes == () and v.tokens == (2,)


def test_greedy_tree_picks_matching_branch() -> None:
    # root children: 1 (node0), 2 (node1); node1 children: 3 (node2), 4 (node3)
    tree = DraftTree.from_lists([1, 2, 3, 4], [-1, -1, 1, 1])
    v = verify_greedy(tree, one_hot_logits([2, 0, 4, 5, 5]))
    assert v.accepted_nodes == (1, 3)
    assert v.tokens == (2, 4, 5)


def test_empty_tree_is_plain_step() -> None:
    v = verify_greedy(DraftTree.empty(), one_hot_logits([4]))
    assert v.tokens == (4,)


def test_logits_shape_checked() -> None:
    with pytest.raises(ValueError, match="logits"):
        verify_greedy(DraftTree.chain([1, 2]), one_hot_logits([1, 2]))
    with pytest.raises(ValueError, match="argmax"):
        verify_greedy_argmax([1, 2], [-1, 0], [1, 2])


def test_greedy_with_the_forwards_argmax_is_the_same() -> None:
    """Row argmaxes handed in (the native forward's) give the verdict of the logits' own,
    ties (first index) included."""
    g = torch.Generator().manual_seed(0)
    trees = [DraftTree.empty(), DraftTree.chain([1, 2, 3]),
             DraftTree.from_lists([1, 2, 3, 4, 0], [-1, -1, 1, 1, 0])]
    for tree in trees:
        for _ in range(50):
            logits = torch.randint(0, 3, (len(tree) + 1, V), generator=g).float()
            want = verify_greedy(tree, logits)
            ids = logits.argmax(-1).tolist()
            assert verify_greedy_argmax(tree.tokens.tolist(), tree.parents.tolist(), ids) == want


def test_tree_validation() -> None:
    with pytest.raises(ValueError):
        DraftTree.from_lists([1, 2], [0, -1])
    t = limit_depth(DraftTree.from_lists([1, 2, 3, 4], [-1, 0, 1, -1]), 2)
    assert t.tokens.tolist() == [1, 2, 4] and t.parents.tolist() == [-1, 0, -1]


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=4),
    SamplingParams(temperature=1.3, top_p=0.8),
])
def test_sampling_matches_target_distribution(params: SamplingParams) -> None:
    """Tree: root -> {a=1, b=2}, a -> {c=3}. The first committed token must follow the
    root distribution, and the token after a must follow a's distribution, whatever
    the draft proposes."""
    rows = [
        [0.05, 0.30, 0.25, 0.10, 0.20, 0.10],  # root
        [0.10, 0.10, 0.10, 0.40, 0.20, 0.10],  # node a (token 1)
        [0.30, 0.10, 0.10, 0.10, 0.10, 0.30],  # node b (token 2)
        [0.20, 0.20, 0.20, 0.20, 0.10, 0.10],  # node c (token 3)
    ]
    logits = rigged(rows)
    tree = DraftTree.from_lists([1, 2, 3], [-1, -1, 0])
    gen = torch.Generator().manual_seed(1234)
    n = 20000
    first, after_a = first_two_tokens(tree, logits, params, gen, n)
    p_root = probabilities(logits[0], params)
    p_a = probabilities(logits[1], params)
    assert chi2_pvalue(first, p_root, n) > 1e-3
    assert chi2_pvalue(after_a, p_a, sum(after_a.values())) > 1e-3


def test_biased_sampler_is_detected() -> None:
    """The test above can fail: accepting drafts with probability 1 is caught."""
    logits = rigged([[0.05, 0.30, 0.25, 0.10, 0.20, 0.10]])
    p = probabilities(logits[0], SamplingParams(temperature=1.0))
    biased = collections.Counter({1: 8000, 2: 1000, 4: 1000})
    assert chi2_pvalue(biased, p, 10000) < 1e-6


def test_draw_follows_the_distribution_and_never_draws_zero_mass() -> None:
    """The reference inverse-CDF draw (top-k / top-p): unnormalised mass with
    zeros inside and at both ends; the chi-square check refuses any draw outside the
    support (``chi2_pvalue``'s assertion)."""
    mass = torch.tensor([0.0, 3.0, 0.0, 1.0, 0.5, 0.0, 2.0, 0.0])
    gen = torch.Generator().manual_seed(7)
    n = 20000
    counts = collections.Counter(
        inverse_cdf(mass, float(torch.rand((), dtype=torch.float64, generator=gen)))
        for _ in range(n))
    assert chi2_pvalue(counts, mass / mass.sum(), n) > 1e-3


def test_inverse_cdf_lands_on_mass_at_both_ends_of_the_unit_interval() -> None:
    """u = 0 takes the first entry with mass; the largest double below 1 (where u * total
    may round up to the total) the last one; interval edges go to the entry above."""
    mass = torch.tensor([0.0, 0.2, 0.0, 0.8, 0.0, 0.0])
    assert inverse_cdf(mass, 0.0) == 1
    assert inverse_cdf(mass, 1.0 - 2.0**-53) == 3
    assert inverse_cdf(torch.tensor([1.0, 1.0, 1.0]), 1.0 / 3.0) == 1
    assert inverse_cdf(torch.tensor([0.1, 0.2, 0.7]), 0.25) == 1


def test_top_p_keeps_smallest_prefix() -> None:
    p = probabilities(rigged([[0.5, 0.3, 0.1, 0.05, 0.03, 0.02]])[0],
                      SamplingParams(temperature=1.0, top_p=0.75))
    assert (p > 0).tolist() == [True, True, False, False, False, False]
