"""Cost-aware draft sizing: the greedy prefix scan is the exact optimum; the online
acceptance estimate tracks what it sees; the cost curve interpolates and round-trips."""

from __future__ import annotations

import itertools
import random
import re
from types import SimpleNamespace

import numpy as np
import pytest

from recallspec.cost.cache import curve_key
from recallspec.cost.curve import CostCurve
from recallspec.cost.sizing import FULL, MISS, PARTIAL, AcceptanceStats, choose_draft_sizes
from recallspec.kernels import isa


def _value(
    sizes: list[int], gains: list[np.ndarray], cost: CostCurve, base: int, node_cost: float,
) -> float:
    toks = len(gains) + sum(
        float(np.minimum.accumulate(g)[:k].sum()) for g, k in zip(gains, sizes, strict=True)
    )
    return toks / (cost(base + sum(sizes), len(gains)) + node_cost * sum(sizes))


@pytest.mark.parametrize("seed", range(30))
def test_choice_is_the_brute_force_optimum(seed: int) -> None:
    rng = random.Random(seed)
    # A bumpy curve like MKL's (2-3 rows dearer than 4).
    ks = (1, 2, 3, 4, 6, 8, 16, 32)
    base_s = [1.0, 1.3, 1.25, 1.05, 1.2, 1.3, 1.9, 3.2]
    curve = CostCurve(ks, tuple(b * rng.uniform(0.9, 1.1) for b in base_s), rng.uniform(0, 0.05))
    nseq = rng.randint(1, 3)
    gains = [np.sort(np.array([rng.random() for _ in range(rng.randint(0, 5))]))[::-1]
             for _ in range(nseq)]
    node_cost = rng.choice([0.0, rng.uniform(0.0, 0.3)])  # drafts that cost a forward each
    sizes = choose_draft_sizes(gains, curve, base_rows=nseq, node_cost=node_cost)
    best = max(
        _value(list(c), gains, curve, nseq, node_cost)
        for c in itertools.product(*[range(len(g) + 1) for g in gains])
    )
    assert _value(sizes, gains, curve, nseq, node_cost) == pytest.approx(best, rel=1e-9)
    assert all(0 <= k <= len(g) for k, g in zip(sizes, gains, strict=True))


def test_useless_drafts_are_dropped_and_free_ones_kept() -> None:
    flat = CostCurve((1, 64), (1.0, 1.0), 0.0)  # rows cost nothing: draft everything useful
    steep = CostCurve((1, 2), (1.0, 2.0), 0.0)  # every row costs a whole step
    g = [np.array([0.9, 0.5, 0.1]), np.array([0.2])]
    assert choose_draft_sizes(g, flat, base_rows=2) == [3, 1]
    assert choose_draft_sizes(g, steep, base_rows=2) == [0, 0]
    assert choose_draft_sizes([np.zeros(4)], flat, base_rows=1) == [0]


CHAIN4 = [-1, 0, 1, 2]


def test_acceptance_stats_conditional_and_prior() -> None:
    st = AcceptanceStats(4, decay=1.0)
    for _ in range(10):
        st.update([-1, 0, 1], [0, 1])  # a 3-chain, first two accepted
    assert st.state == PARTIAL
    c = st.conditional_rates()[PARTIAL]
    # 10 of 10 (+1 pseudo-count at 0.5) / pooled deep rate (10 + 0.5) / (20 + 1) = 0.5 (+1)
    # / never reached: the pooled rate.
    assert c[0] == pytest.approx(10.5 / 11) and c[1] == pytest.approx(10.5 / 11)
    assert c[2] == pytest.approx(0.5 / 11) and c[3] == pytest.approx(0.5)
    r = st.node_rates(np.array([-1, 0, 1, 2]), st.conditional_rates())
    assert r.tolist() == pytest.approx(np.cumprod(c).tolist())  # a chain: products
    prior = AcceptanceStats(4, decay=1.0)
    for _ in range(50):
        prior.update(CHAIN4, [0, 1, 2, 3], key=PARTIAL)
    assert prior.state == PARTIAL  # a shared prior keeps no state of its own
    fresh = AcceptanceStats(4)  # starts PARTIAL, where the prior recorded its drafts
    assert fresh.conditional_rates(prior.conditional_rates())[PARTIAL].min() > 0.95


def test_acceptance_conditioned_on_last_outcome() -> None:
    """Bimodal drafts (a copied span, then misses): after a full acceptance the estimate
    is high, after a miss it is low, instead of one blurred average."""
    st = AcceptanceStats(4, decay=1.0)
    for _ in range(20):  # spans of 5 fully accepted drafts, then 5 misses
        for _ in range(5):
            st.update(CHAIN4, [0, 1, 2, 3])
        for _ in range(5):
            st.update(CHAIN4, [])
    assert st.state == MISS
    after_miss = st.node_rates(np.array(CHAIN4), st.conditional_rates())
    st.update(CHAIN4, [0, 1, 2, 3])
    assert st.state == FULL
    after_full = st.node_rates(np.array(CHAIN4), st.conditional_rates())
    # Conditioned: about 4/5 and 1/5 (unconditioned, both would be 1/2).
    assert after_full[0] == pytest.approx(0.8, abs=0.02)
    assert after_miss[0] == pytest.approx(0.2, abs=0.02)
    tree = AcceptanceStats(4)
    tree.update([-1, -1, 0, 1], [1, 3])  # accepted down to a leaf: FULL
    assert tree.state == FULL
    tree.update([-1, -1, 0, 1], [0])  # node 0 has a drafted child: PARTIAL
    assert tree.state == PARTIAL
    before = tree.reached.copy()
    tree.update([], [])  # no draft: nothing changes
    assert tree.state == PARTIAL and np.array_equal(tree.reached, before)


def test_contexts_are_counted_apart() -> None:
    """Two draft contexts (say a long and a short match) with opposite outcomes: each
    context's estimate follows its own drafts, and a shared prior keeps them apart too."""
    st = AcceptanceStats(4, decay=1.0, contexts=2)
    prior = AcceptanceStats(4, decay=1.0, contexts=2)
    rng = random.Random(0)  # contexts in random order: the outcome state alone can't tell
    for _ in range(200):
        st.context = rng.randint(0, 1)
        key = st.key
        acc = [0, 1, 2, 3] if st.context == 1 else []
        st.update(CHAIN4, acc)
        prior.update(CHAIN4, acc, key=key)
    rates = {}
    for c in (0, 1):
        st.context = c
        for s_ in (MISS, FULL):
            st.state = s_
            rates[c, s_] = st.node_rates(np.array(CHAIN4), st.conditional_rates())[0]
    assert rates[1, MISS] > 0.9 and rates[1, FULL] > 0.9  # context 1: always accepted
    assert rates[0, MISS] < 0.1 and rates[0, FULL] < 0.1  # context 0: never
    fresh = AcceptanceStats(4, contexts=2)
    fresh.state, fresh.context = FULL, 1
    assert fresh.node_rates(np.array(CHAIN4), fresh.conditional_rates(
        prior.conditional_rates()))[0] > 0.9
    fresh.context = 2
    with pytest.raises(ValueError, match="context"):
        _ = fresh.key


def test_unexplored_depths_are_not_frozen() -> None:
    """A depth that was rejected a few times and then no longer drafted follows the
    pooled rate of the other depths instead of keeping its old zero."""
    st = AcceptanceStats(8, decay=0.95)
    for _ in range(3):
        st.update(list(range(-1, 7)), list(range(7)), key=FULL)  # node 7 rejected
    assert st.conditional_rates()[FULL][7] < 0.3
    for _ in range(60):
        st.update(list(range(-1, 6)), list(range(7)), key=FULL)  # 7-chains, all accepted
    c = st.conditional_rates()[FULL]
    assert c[7] > 0.8  # its old rejections faded; the pooled deep rate took over


def test_cost_curve_interpolates_and_round_trips() -> None:
    c = CostCurve((1, 4, 8), (1.0, 2.0, 4.0), 0.5, "k")
    assert c(1) == 1.0 and c(2) == pytest.approx(1 + 1 / 3) and c(6) == 3.0
    assert c(12) == 6.0  # extrapolates the last segment
    assert c(4, 3) == 3.0
    assert CostCurve.from_json(c.to_json()) == c
    with pytest.raises(ValueError):
        CostCurve((2, 1), (1.0, 1.0), 0.0)


def test_a_noisy_busy_curve_prices_every_forward_positively() -> None:
    """A curve measured on a busy machine (falling at its last size and last context,
    rising 5x from its first context to its second) prices every forward, at any rows,
    batch and context, at a positive time that grows past its points, and the sizing
    sizes with it. (Extending such a curve by its lines priced a short prompt's forward
    at 0 s: a ZeroDivisionError in a request CI served while a compiler ran.)"""
    from recallspec.cost.curve import BELOW_FIRST_CONTEXT, CostGrid

    rows = (1, 2, 4, 8)
    grid = CostGrid(rows, (128, 512, 1024, 2048), ((1.0, 1.1, 1.3, 1.8), (5.0, 5.2, 5.5, 6.0),
                                                   (5.5, 5.6, 6.0, 6.4), (5.2, 5.3, 5.9, 5.0)))
    curve = CostCurve((1, 2, 4, 8, 16, 32), (1.0, 1.1, 1.3, 1.8, 2.6, 2.2), 0.01, "k", grid)
    ks = np.arange(1, 65, dtype=np.float64)
    for ctx in (0, 1, 64, 127, 128, 300, 2048, 4000, 100_000):
        many = curve.costs(ks, 2, ctx)
        one = [curve(int(k), 2, ctx) for k in ks]
        assert np.all(np.isfinite(many)) and np.all(many > 0), ctx
        assert list(many) == pytest.approx(one, rel=1e-12), ctx
        assert np.all(many[8:] >= many[7]), ctx  # past the grid: never cheaper than its end
        assert np.all(np.diff(many[31:]) >= 0), ctx  # past the last size: rising only
    # below the first context: no less than BELOW_FIRST_CONTEXT of its cost there
    assert curve(1, 1, 0) == pytest.approx(BELOW_FIRST_CONTEXT * curve(1, 1, 128))
    # past the last context: the last segment falls (6.0 -> 5.0 at 8 rows): flat
    assert curve(8, 1, 4000) == curve(8, 1, 2048) == 5.0
    assert curve(64, 1, None) >= curve(16, 1, None)  # past the reference's falling end
    gains = [np.array([0.9, 0.8, 0.7, 0.6])]
    for ctx in (0, 128, 5000):
        sizes = choose_draft_sizes(gains, lambda r, b, c=ctx: curve(r, b, c), base_rows=1)
        assert 0 <= sizes[0] <= 4
    for bad in ((1.0, 0.0), (1.0, -1.0), (1.0, float("nan"))):
        with pytest.raises(ValueError, match="positive"):
            CostCurve((1, 2), bad, 0.0)
        with pytest.raises(ValueError, match="positive"):
            CostGrid((1, 2), (0,), (bad,))


def test_curve_key_names_the_cpu_generation_and_the_kernels_build(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cached cost curve is reused only on the same CPU generation and the same build of
    the kernels: one model name covered a Zen 4 and a Zen 5 under KVM, and a rebuilt
    product changed what a 1-row forward costs by 1.5x."""
    model = SimpleNamespace(config=SimpleNamespace(num_layers=2, hidden_size=8, vocab_size=10),
                            weight_format="q4_1", kv_dtype="torch.float32", native=None)
    key = curve_key(model, "fp", 2)
    assert key == curve_key(model, "fp", 2) and key != curve_key(model, "fp", 1)
    with monkeypatch.context() as m:
        m.setattr(isa, "kernels_build", lambda: "another build")
        assert curve_key(model, "fp", 2) != key
    with monkeypatch.context() as m:
        m.setattr(isa, "cpu_identity", lambda: isa.cpu_model() + " (0/0/0)")
        assert curve_key(model, "fp", 2) != key
    assert re.fullmatch(r".+ \(\S+/\S+/\S+\)", isa.cpu_identity())


def test_step_overhead_ignores_drift_and_stalls() -> None:
    """The planner's step overhead is the time outside the forward (in the curve's
    seconds): a machine running slower than the curve does not inflate it, and one
    stalled step does not swing it (a large overhead makes rows look cheap)."""
    from types import SimpleNamespace

    from recallspec.drafters.lookup import make_pld
    from recallspec.step.planner import DraftPlanner

    curve = CostCurve((1, 16), (0.003, 0.006), 0.0)
    req = SimpleNamespace(sizing="adaptive", drafter=make_pld(), cached_length=100)
    planner = DraftPlanner(16, lambda: curve)
    outside = 0.0002
    for step in range(40):
        # The forward runs 1.5x the curve's price (drift); a 30 ms stall outside the
        # forward at step 20 and inside it at step 30.
        fwd = 1.5 * curve(1, 1, 100) + (0.03 if step == 30 else 0.0)
        stall = 0.03 if step == 20 else 0.0
        planner.note_step([req], 1, fwd + outside + stall, 0.0, curve, fwd)  # type: ignore[list-item]
        if step >= 1:
            # Drift scales the outside time to the curve's seconds (/ 1.5), no more.
            assert planner.step_overhead == pytest.approx(outside / 1.5, rel=1e-6), step
    # Without a measured forward time, everything beyond the curve counts.
    legacy = DraftPlanner(16, lambda: curve)
    legacy.note_step([req], 1, 0.005, 0.0, curve, 0.0)  # type: ignore[list-item]
    assert legacy.step_overhead == pytest.approx(0.005 - curve(1, 1, 100))
