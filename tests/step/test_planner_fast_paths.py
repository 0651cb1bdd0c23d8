"""The planner's hot paths (Python on a few nodes, memoised rates, unchecked trees built
from valid ones) give exactly the numbers of the numpy definitions they replace, so the
cost-aware policy's decisions do not change; the checked fast paths keep the errors."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytest

from recallspec.cost.sizing import AcceptanceStats, _row_rates, choose_draft_sizes, running_min
from recallspec.decoding.tree import DraftTree, limit_depth
from recallspec.drafters.sam import _BUCKET_EDGES, length_bucket
from recallspec.recall.automata._arrays import as_tokens
from recallspec.step.pricing import best_rate as _best_rate
from recallspec.step.pricing import price as _price


def _random_tree(rng: random.Random, n: int) -> list[int]:
    if rng.random() < 0.5:
        return list(range(-1, n - 1))  # a chain
    return [rng.randint(-1, i - 1) for i in range(n)]


def _random_path(rng: random.Random, par: list[int]) -> list[int]:
    """Nodes of a random accepted path from the root."""
    acc: list[int] = []
    for j, p in enumerate(par):
        if ((p < 0 and not acc) or (bool(acc) and p == acc[-1])) and rng.random() < 0.7:
            acc.append(j)
    return acc


def _reference_choice(
    gains: list[np.ndarray], cost: Callable[[int, int], float], base_rows: int,
) -> list[int]:
    """choose_draft_sizes as it was written with numpy (the sort for every batch)."""
    cand: list[tuple[float, int, int]] = []
    for i, g in enumerate(gains):
        run = np.minimum.accumulate(np.asarray(g, np.float64)) if len(g) else g
        cand.extend((-float(x), i, j) for j, x in enumerate(run))
    cand.sort()
    best_val = len(gains) / cost(base_rows, len(gains))
    best_n, tokens = 0, float(len(gains))
    for n, (neg, _, _) in enumerate(cand, start=1):
        if -neg <= 0.0:
            break
        tokens += -neg
        val = tokens / cost(base_rows + n, len(gains))
        if val > best_val * (1 + 1e-9):
            best_val, best_n = val, n
    sizes = [0] * len(gains)
    for _, i, _ in cand[:best_n]:
        sizes[i] += 1
    return sizes


@pytest.mark.parametrize("seed", range(5))
def test_key_node_rates_match_numpy_through_updates(seed: int) -> None:
    """Bit-equal to node_rates(key_rates(prior)) after every update of the request's or
    the prior's rows (the memo must notice both)."""
    rng = random.Random(seed)
    contexts, nodes = 3, 8
    st = AcceptanceStats(nodes, contexts=contexts)
    prior = AcceptanceStats(nodes, decay=0.99, contexts=contexts)
    for _ in range(300):
        st.context = rng.randrange(contexts)
        par = _random_tree(rng, rng.randint(0, nodes + 2))
        for p in (prior, None):
            want = st.node_rates(np.asarray(par, np.int64), st.key_rates(p)).tolist()
            assert st.key_node_rates(par, p) == want
        acc = _random_path(rng, par[:nodes])
        key = st.key
        if rng.random() < 0.8:
            st.update(par, acc)
        if rng.random() < 0.8:
            prior.update(par, acc, key=key)


def test_row_rates_match_the_filled_target_formula() -> None:
    """The pooled-target row (index 0 set in Python) is the filled-array formula."""
    rng = np.random.default_rng(1)
    for _ in range(2000):
        reach = rng.random(int(rng.integers(1, 40))) * float(rng.choice([1, 10, 100]))
        acc = reach.copy() if rng.random() < 0.2 else reach * rng.random(len(reach))
        weight, default = float(rng.choice([1.0, 4.0, 5 * rng.random()])), float(rng.random())
        pooled = (float(acc[1:].sum()) + default) / (float(reach[1:].sum()) + 1.0)
        target = np.full(acc.shape, pooled)
        target[0] = default
        want = np.minimum((acc + weight * target) / (reach + weight), 1.0)
        assert _row_rates(acc, reach, None, weight, default).tobytes() == want.tobytes()


def test_fused_price_matches_its_parts() -> None:
    rng = random.Random(3)
    st = AcceptanceStats(16)
    for _ in range(500):
        par = _random_tree(rng, rng.randint(0, 16))
        st.update(par, _random_path(rng, par))
        rates = st.key_rate_list()
        costs = [1e-3 * (1 + rng.random()) for _ in range(len(par) + 1)]
        overhead = 1e-4 * rng.random()
        gains = running_min(st.key_node_rates(par))
        assert _price(par, rates, costs, overhead) == (gains, _best_rate(gains, costs, overhead))


def test_running_min_and_best_rate_match_numpy() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        g = np.round(rng.random(rng.integers(0, 17)), int(rng.integers(1, 4)))
        run = running_min(g)
        assert run == np.minimum.accumulate(g).tolist()
        costs = (rng.random(len(g) + 1) * 1e-3 + 1e-3).tolist()
        overhead = float(rng.random() * 1e-4)
        table = np.asarray(costs) + overhead
        want = float(np.max((1.0 + np.concatenate(([0.0], np.cumsum(run))))
                            / table[: len(run) + 1]))
        assert _best_rate(run, costs, overhead) == want
    nan = running_min([0.5, float("nan"), 0.1])
    assert nan[0] == 0.5 and np.isnan(nan[1:]).all()  # numpy propagates NaN too


@pytest.mark.parametrize("seed", range(20))
def test_one_sequence_sizing_matches_the_sorted_scan(seed: int) -> None:
    rng = random.Random(seed)
    ks = (1, 2, 3, 4, 6, 8, 16, 32)
    secs = [1.0, 1.3, 1.25, 1.05, 1.2, 1.3, 1.9, 3.2]
    table = [rng.uniform(0.9, 1.1) * s for s in secs]

    def cost(rows: int, seqs: int) -> float:
        return float(np.interp(rows, ks, table)) + 0.01 * (seqs - 1)

    for _ in range(20):
        nseq = rng.choice([1, 1, 2])
        gains = [np.array([rng.choice([0.0, 0.25, 0.5, rng.random()])
                           for _ in range(rng.randint(0, 10))]) for _ in range(nseq)]
        assert choose_draft_sizes(gains, cost, base_rows=nseq) == \
            _reference_choice(gains, cost, nseq)


def test_trees_built_without_the_check_are_valid() -> None:
    rng = random.Random(1)
    for _ in range(200):
        n = rng.randint(0, 12)
        par = _random_tree(rng, n)
        tree = DraftTree.from_lists([rng.randint(0, 9) for _ in range(n)], par)
        for cut in (limit_depth(tree.truncate(rng.randint(0, 12)), rng.randint(0, 6)),
                    DraftTree.chain(tree.tokens), DraftTree.empty()):
            DraftTree(cut.tokens, cut.parents)  # the public check passes
            assert cut.tokens.dtype == cut.parents.dtype == np.int64
        depth: list[int] = []
        for p in par:
            depth.append(1 if p < 0 else depth[p] + 1)
        d = rng.randint(1, 6)
        assert len(limit_depth(tree, d)) == sum(x <= d for x in depth)
    with pytest.raises(ValueError, match="parents"):
        DraftTree.from_lists([1, 2], [-1, 1])
    with pytest.raises(ValueError):
        DraftTree.chain([[1, 2], [3, 4]])  # type: ignore[list-item]


def test_short_token_lists_keep_the_checks() -> None:
    for ok in ([], [0, 7, 2**32 - 2]):
        got = as_tokens(ok)
        assert got.dtype == np.uint32 and got.flags.c_contiguous and got.tolist() == ok
    assert as_tokens([np.int64(3)]).tolist() == [3]  # not plain ints: the general path
    with pytest.raises(ValueError, match="negative"):
        as_tokens([1, -1])
    with pytest.raises(ValueError, match="out of range"):
        as_tokens([1, 2**32 - 1])
    with pytest.raises(ValueError, match="vocab_size 5"):
        as_tokens([4, 5], vocab_size=5)
    for bad in ([True], [1.0], ["a"], [[1]]):
        with pytest.raises((TypeError, ValueError)):
            as_tokens(bad)


def test_length_bucket_counts_the_edges_reached() -> None:
    for n in range(-2, 80):
        assert length_bucket(n) == sum(n >= e for e in _BUCKET_EDGES)
