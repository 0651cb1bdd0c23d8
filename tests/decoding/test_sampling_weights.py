"""The native sampling distribution (``spec.sampling.Weights``): its probabilities against
the torch reference softmax, the same bits on every kernel path, draws that follow the
(residual) distribution and never land on zero mass, the inverse CDF's edges, and the
fallbacks (top-k / top-p, overflow, NaN)."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from helpers.stats import chi2_pvalue

from recallspec import _kernels
from recallspec.decoding.sampling import SamplingParams, Weights, probabilities
from recallspec.kernels import isa


def _logits(n: int, seed: int, spread: float = 4.0) -> torch.Tensor:
    """Logits like a language model's: a few large ones over a broad low floor."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * spread
    x[torch.randint(0, n, (5,), generator=g)] += 12.0
    return x


def _native(x: torch.Tensor, t: float, code: int) -> tuple[np.ndarray, np.ndarray, float]:
    w = np.empty(len(x), dtype=np.float32)
    chunks = np.empty((len(x) + 63) // 64, dtype=np.float64)
    total = _kernels.sample_weights(x.numpy(), t, w, chunks, code)
    return w, chunks, total


@pytest.mark.parametrize("t", [0.3, 0.7, 1.0, 1.3])
def test_probabilities_match_the_softmax(t: float) -> None:
    """Every token's probability against the softmax of the same float32 shifted logits
    d = x / t - max(x / t) (both sides round those alike) taken in float64: within 5e-7
    relative for those above 1e-30, since only our exp (~1-2 ulp of float32, <= 1.2e-7)
    and the float64 sums differ. torch's float32 softmax (the top-k / top-p reference)
    is itself off by its float32 sum over 49,192 entries, whose rounding errors add up to
    about sqrt(49,192) x 2^-24 = 1.3e-5 relative (3e-6 seen with AVX-512's summation
    order, 1.22e-5 on an AVX2-only Zen 3), so it is held to 3e-5.
    Below e^-86 of the largest our weights are exactly 0 (< 1e-37)."""
    x = _logits(49_152 + 40, seed=int(t * 10))  # (a partial last chunk)
    x[[0, 100, len(x) - 1]] = float("-inf")  # masked tokens: probability exactly 0
    y = x / t
    exact = torch.exp((y - y.max()).double())
    exact /= exact.sum()
    wts = Weights(x, SamplingParams(temperature=t))
    got = torch.tensor([wts.prob(i) for i in range(len(x))], dtype=torch.float64)
    assert got[[0, 100, len(x) - 1]].eq(0).all()
    big = exact > 1e-30
    rel = ((got - exact).abs() / exact)[big]
    assert float(rel.max()) < 5e-7, float(rel.max())
    assert float(got[~big].max()) < 1e-30
    assert abs(float(got.sum()) - 1.0) < 1e-12  # the total is the sum the draws walk
    ref = probabilities(x, SamplingParams(temperature=t)).double()
    assert float(((ref - exact).abs() / exact)[big].max()) < 3e-5


def test_same_bits_on_every_kernel_path() -> None:
    x = _logits(49_152 + 17, seed=3)
    outs = {v: _native(x, 0.7, isa.code(v)) for v in isa.variants()}
    first = next(iter(outs.values()))
    for v, (w, chunks, total) in outs.items():
        assert np.array_equal(w, first[0]), v
        assert np.array_equal(chunks, first[1]), v
        assert total == first[2], v
    w, chunks, _ = first
    u = np.linspace(0.0, 1.0 - 2.0**-53, 257)
    assert len({tuple(_kernels.sample_draw(w, chunks, float(a)) for a in u)}) == 1


def test_draws_follow_the_residual_and_never_land_on_zero_mass() -> None:
    """200 tokens (four chunks), masked ones at both ends and inside; a rejected draft
    token removed: 20,000 draws follow the renormalised rest (chi-square; a draw outside
    the support fails ``chi2_pvalue``'s assertion)."""
    x = _logits(200, seed=5, spread=1.5)
    x[[0, 63, 64, 130, 199]] = float("-inf")
    params = SamplingParams(temperature=0.9)
    p = probabilities(x, params)
    top = int(p.argmax())
    residual = p.clone()
    residual[top] = 0.0
    residual /= residual.sum()
    gen = torch.Generator().manual_seed(11)
    n = 20_000
    counts: collections.Counter[int] = collections.Counter()
    for _ in range(n):
        wts = Weights(x, params)
        before = wts.prob(top)
        wts.remove(top)
        assert wts.prob(top) == 0.0 and abs(wts.prob(int(residual.argmax()))
                                             - float(residual.max())) < 1e-6 * (1 + before)
        counts[wts.draw(gen)] += 1
    assert chi2_pvalue(counts, residual, n) > 1e-3


def test_inverse_cdf_edges() -> None:
    """u = 0 takes the first token with mass, the largest double below 1 the last one
    (where u * total may round up to the total), with zero-mass chunks around them."""
    x = torch.full((300,), float("-inf"))
    x[[70, 71, 250]] = torch.tensor([0.0, 1.0, 2.0])
    w, chunks, total = _native(x, 1.0, isa.code())
    assert _kernels.sample_draw(w, chunks, 0.0) == 70
    assert _kernels.sample_draw(w, chunks, 1.0 - 2.0**-53) == 250
    edge = float(w[70]) / total  # token 70's interval ends here, 71's begins
    assert _kernels.sample_draw(w, chunks, edge * (1 - 1e-9)) == 70
    assert _kernels.sample_draw(w, chunks, edge * (1 + 1e-9)) == 71
    _kernels.sample_remove(w, chunks, 250, isa.code())
    assert _kernels.sample_draw(w, chunks, 1.0 - 2.0**-53) == 71
    with pytest.raises(ValueError, match="u must be in"):
        _kernels.sample_draw(w, chunks, 1.0)


def test_fallbacks_and_refusals() -> None:
    x = _logits(1000, seed=9)
    # top-k / top-p: the reference distribution, same interface.
    k4 = Weights(x, SamplingParams(temperature=1.0, top_k=4))
    assert sum(k4.prob(i) > 0 for i in range(len(x))) == 4
    # x / t overflows: the reference (which puts all mass on the largest logits).
    tiny = Weights(x, SamplingParams(temperature=1e-38))
    assert tiny.draw(torch.Generator().manual_seed(0)) == int(x.argmax())
    tiny_k = Weights(x, SamplingParams(temperature=1e-38, top_k=3))
    assert tiny_k.draw(torch.Generator().manual_seed(0)) == int(x.argmax())
    with pytest.raises(ValueError, match="NaN"):
        Weights(torch.tensor([0.0, float("nan"), 1.0]), SamplingParams(temperature=1.0))
    with pytest.raises(ValueError, match="temperature > 0"):
        Weights(x, SamplingParams(temperature=0.0))
