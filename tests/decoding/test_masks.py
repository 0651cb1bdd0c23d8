"""Grammar masks in verification, sampling and log-probabilities (``decoding/masks.py``):
masked verification of a draft tree must choose, row by row, what constrained plain
decoding chooses; no model, random logits and masks."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from helpers.stats import chi2_pvalue

from recallspec.decoding import masks as M
from recallspec.decoding.logprobs import token_logprob
from recallspec.decoding.penalties import Penalties
from recallspec.decoding.sampling import SamplingParams, Weights
from recallspec.decoding.tree import DraftTree
from recallspec.decoding.verify import (
    sample,
    verify_greedy,
    verify_greedy_masked_argmax,
    verify_sampling,
)
from recallspec.errors import DataError

V = 70  # not a multiple of 32: the last mask word is partial


def mask_of(allowed: list[int] | np.ndarray, vocab: int = V) -> np.ndarray:
    m = np.zeros(M.words(vocab), np.int32)
    for t in allowed:
        m.view(np.uint32)[t >> 5] |= np.uint32(1 << (t & 31))
    return m


def random_case(rng: np.random.Generator, n: int) -> tuple[DraftTree, torch.Tensor, np.ndarray]:
    """A random tree whose nodes its parents' masks allow (as ``Constraint.constrain``
    leaves it), random logits, and masks allowing 1-8 tokens a row, often not the argmax."""
    logits = torch.from_numpy(rng.normal(size=(n + 1, V)).astype(np.float32))
    masks = np.stack([mask_of(rng.choice(V, int(rng.integers(1, 9)), replace=False))
                      for _ in range(n + 1)])
    toks: list[int] = []
    parents: list[int] = []
    for _ in range(n):
        i = len(toks)
        p = int(rng.integers(-1, i)) if i else -1
        ok = M.allowed_ids(masks[p + 1], V)
        siblings = {toks[j] for j in range(i) if parents[j] == p}
        if rng.random() < 0.5:  # the parent's masked argmax: a path that goes on
            t = M.masked_argmax(logits[p + 1].numpy(), masks[p + 1])
        else:
            t = int(rng.choice(np.flatnonzero(ok)))
        if t in siblings:
            t = next((int(x) for x in np.flatnonzero(ok) if int(x) not in siblings), -1)
        if t < 0:
            continue
        toks.append(t)
        parents.append(p)
    tree = DraftTree(np.array(toks, np.int64), np.array(parents, np.int64))
    k = len(tree)
    return tree, logits[: k + 1].contiguous(), masks[: k + 1]


def stepwise_greedy(tree: DraftTree, logits: torch.Tensor, masks: np.ndarray) -> tuple[int, ...]:
    """Constrained plain greedy decoding along the tree: at each node the masked argmax,
    then the child carrying it, if any."""
    kids = tree.children()
    node, out = -1, []
    while True:
        want = M.masked_argmax(logits[node + 1].numpy(), masks[node + 1])
        out.append(want)
        nxt = next((c for c in kids[node + 1] if int(tree.tokens[c]) == want), None)
        if nxt is None:
            return tuple(out)
        node = nxt


def test_guides_are_canonical_and_checked() -> None:
    a = M.Guide.json_schema({"b": 1, "a": {"y": 2, "x": 3}})
    assert a == M.Guide.json_schema({"b": 1, "a": {"y": 2, "x": 3}})  # the cache's key
    assert hash(a) == hash(M.Guide("json_schema", '{"b":1,"a":{"y":2,"x":3}}'))
    # Property order is the output's order: another order is another guide.
    assert a != M.Guide.json_schema({"a": {"x": 3, "y": 2}, "b": 1})
    with pytest.raises(DataError, match="unknown guide kind"):
        M.Guide("yaml", "x")  # type: ignore[arg-type]
    with pytest.raises(DataError, match="non-empty"):
        M.Guide("regex", "")
    with pytest.raises(DataError, match="bytes, over"):
        M.Guide("gbnf", "x" * (M.MAX_GUIDE_BYTES + 1))
    with pytest.raises(DataError, match="not JSON"):
        M.Guide.json_schema({"a": float("nan")})
    with pytest.raises(ValueError, match="ignore_eos"):
        SamplingParams(guide=M.Guide.json_object(), ignore_eos=True)


def test_mask_bits() -> None:
    m = mask_of([0, 31, 32, 69])
    assert [t for t in range(V) if M.allowed(m, t)] == [0, 31, 32, 69]
    assert M.count_allowed(m, V) == 4
    row = np.arange(V, dtype=np.float32)
    assert M.masked_argmax(row, m) == 69 and M.masked_argmax(-row, m) == 0
    x = M.apply(row, m)
    assert np.isneginf(x).sum() == V - 4 and x[31] == 31.0
    with pytest.raises(ValueError, match="allows no token"):
        M.apply(row, mask_of([]))


@pytest.mark.parametrize("seed", range(40))
def test_masked_greedy_is_constrained_plain_greedy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tree, logits, masks = random_case(rng, int(rng.integers(0, 12)))
    want = stepwise_greedy(tree, logits, masks)
    got = verify_greedy(tree, logits, masks=masks)
    assert got.tokens == want
    # From the rows' own argmax, reading logits only where it is forbidden: the same.
    argmax = [int(r.argmax()) for r in logits]
    fast = verify_greedy_masked_argmax(tree.tokens.tolist(), tree.parents.tolist(), argmax,
                                       logits, masks)
    assert fast == got
    # Sampling verification at greedy is the greedy verdict.
    assert verify_sampling(tree, logits, SamplingParams(), None, masks=masks) == got


def test_masked_greedy_with_penalties_penalises_then_masks() -> None:
    rng = np.random.default_rng(7)
    params = SamplingParams(repeat_penalty=3.0, repeat_last_n=-1)
    for _ in range(20):
        tree, logits, masks = random_case(rng, 6)
        pen = Penalties.of(params, [1, 2, 3], [int(tree.tokens[0])] if len(tree) else [])
        assert pen is not None
        kids, toks = tree.children(), tree.tokens.tolist()
        node, path, want = -1, [], []
        while True:
            t = M.masked_argmax(pen.apply(logits[node + 1], path), masks[node + 1])
            want.append(t)
            nxt = next((c for c in kids[node + 1] if toks[c] == t), None)
            if nxt is None:
                break
            node = nxt
            path.append(t)
        assert verify_greedy(tree, logits, pen, masks).tokens == tuple(want)


def test_seeded_masked_sampling_is_the_same_with_and_without_drafts() -> None:
    """A seed gives the same tokens whatever the tree: each committed position takes one
    uniform and its token from the masked row's distribution, as plain sampling does."""
    params = SamplingParams(temperature=0.9)
    rng = np.random.default_rng(3)
    for case in range(30):
        tree, logits, masks = random_case(rng, 8)
        v = verify_sampling(tree, logits, params, np.random.default_rng(case), masks=masks)
        gen = np.random.default_rng(case)
        kids, toks, node = tree.children(), tree.tokens.tolist(), -1
        plain = []
        for _ in v.tokens:  # plain sampling down the same rows
            t = sample(logits[node + 1], params, gen, mask=masks[node + 1])
            plain.append(t)
            node = next((c for c in kids[node + 1] if toks[c] == t), -2)
            if node == -2:
                break
        assert tuple(plain) == v.tokens
        assert all(M.allowed(masks[r], t) for r, t in zip(v.rows, v.tokens, strict=True))


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7),
                                    SamplingParams(temperature=1.3, top_k=3),
                                    SamplingParams(temperature=1.0, top_p=0.6)])
def test_masked_sampling_follows_the_masked_distribution(params: SamplingParams) -> None:
    """Chi-square of the first token (root row) and of the token after an accepted node 0
    against the softmax of the masked rows (temperature, then top-k / top-p over the
    allowed tokens only)."""
    rng = np.random.default_rng(11)
    logits = torch.from_numpy(rng.normal(size=(2, V)).astype(np.float32) * 2)
    masks = np.stack([mask_of(range(0, V, 5)), mask_of([1, 2, 3, 40, 69])])
    node0 = M.masked_argmax(logits[0].numpy(), masks[0])
    tree = DraftTree.chain([node0])
    gen = np.random.default_rng(0)
    first: Counter[int] = Counter()
    after: Counter[int] = Counter()
    n = 20_000
    for _ in range(n):
        v = verify_sampling(tree, logits, params, gen, masks=masks)
        first[v.tokens[0]] += 1
        if v.tokens[0] == node0:
            after[v.tokens[1]] += 1
    from recallspec.decoding.sampling import probabilities

    for row, counts, total in ((0, first, n), (1, after, sum(after.values()))):
        x = torch.from_numpy(M.apply(logits[row].numpy(), masks[row]))
        p = probabilities(x, params)
        assert all(M.allowed(masks[row], t) for t in counts)
        if int((p > 0).sum()) == 1:  # top-p kept one token: a point mass, no test to run
            assert set(counts) == {int(p.argmax())}
            continue
        # A fair sampler fails this at the 1e-4 level once in ten thousand runs.
        assert chi2_pvalue(dict(counts), p, total) > 1e-4


def test_weights_take_forbidden_tokens_and_a_point_mass() -> None:
    """The native temperature kernel on a masked row: -inf entries get weight 0, and a
    row with one allowed token always draws it."""
    row = np.random.default_rng(1).normal(size=V).astype(np.float32)
    x = M.apply(row, mask_of([5, 9]))
    w = Weights(x, SamplingParams(temperature=0.8))
    assert w.prob(3) == 0.0 and w.prob(5) + w.prob(9) == pytest.approx(1.0)
    one = Weights(M.apply(row, mask_of([42])), SamplingParams(temperature=0.5))
    gen = np.random.default_rng(0)
    assert {one.draw(gen) for _ in range(200)} == {42}


def test_masked_logprobs() -> None:
    row = np.random.default_rng(2).normal(size=V).astype(np.float32)
    lp = token_logprob(row, 42, 5, mask_of([42]))
    assert lp.logprob == 0.0 and lp.top == ((42, 0.0),)  # forced: certain, no alternatives
    m = mask_of([3, 7, 11])
    lp = token_logprob(row, 7, 20, m)
    assert {t for t, _ in lp.top} == {3, 7, 11}
    z = row[[3, 7, 11]].astype(np.float64)
    ref = z[1] - np.log(np.exp(z).sum())
    assert lp.logprob == pytest.approx(ref, abs=1e-12)
