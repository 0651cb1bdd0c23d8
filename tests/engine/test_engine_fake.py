"""Engine behaviour on a bigram test model: losslessness, batching, stops, sampling."""

from __future__ import annotations

import time

import pytest
import torch
from helpers import BigramModel, ByteTokenizer, sample_chain_counts, sampling_chain_case
from helpers.engine import PROMPTS, chain_engine, make_engine
from helpers.stats import chi2_pvalue

from recallspec.decoding.sampling import SamplingParams
from recallspec.engine import Engine, EngineConfig, GenerationResult
from recallspec.errors import ContextLengthError, DataError, UnknownNameError


@pytest.mark.parametrize("drafter", ["pld", "llma"])
def test_greedy_identical_to_ar(drafter: str) -> None:
    eng = make_engine()
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    for p in PROMPTS:
        ar = eng.generate(list(p), params, drafter="none")
        sp = eng.generate(list(p), params, drafter=drafter)
        assert isinstance(ar, GenerationResult) and isinstance(sp, GenerationResult)
        assert sp.token_ids == ar.token_ids
        assert sp.new_tokens == 1 + sum(sp.accept_lengths)
        assert ar.mean_accepted_tokens == 1.0


def test_speculation_takes_fewer_steps_on_repetitive_text() -> None:
    eng = make_engine()
    params = SamplingParams(max_new_tokens=60, ignore_eos=True)
    ar = eng.generate(list(b"abcabcabc"), params, drafter="none")
    sp = eng.generate(list(b"abcabcabc"), params, drafter="pld")
    assert isinstance(ar, GenerationResult) and isinstance(sp, GenerationResult)
    assert sp.steps < ar.steps  # a bigram greedy chain cycles, so lookup drafts hit


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_batches_identical_to_single(batch: int) -> None:
    eng = make_engine(max_batch_size=batch)
    prompts = [list(p) for p in PROMPTS] * 2
    lengths = (5, 30, 12, 44, 3, 20, 9, 27)
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in lengths]
    single = make_engine()
    want = [single.generate(p, sp, drafter="none") for p, sp in zip(prompts, params, strict=True)]
    got = eng.generate(prompts, params, drafter="pld")
    assert isinstance(got, list)
    for w, g in zip(want, got, strict=True):
        assert isinstance(w, GenerationResult)
        assert g.token_ids == w.token_ids
    assert eng.cache.free_slots == batch  # every slot returned


def test_eos_and_stop_strings() -> None:
    eng = chain_engine()  # 1 -> 2 -> 3 -> 4 -> EOS
    r = eng.generate([1], SamplingParams(max_new_tokens=50), drafter="pld")
    assert isinstance(r, GenerationResult)
    assert r.token_ids == [2, 3, 4] and r.finish_reason == "eos"
    r = eng.generate([1], SamplingParams(max_new_tokens=2))
    assert isinstance(r, GenerationResult)
    assert r.token_ids == [2, 3] and r.finish_reason == "length"
    r = eng.generate([1], SamplingParams(max_new_tokens=50, stop=("\x03",)))
    assert isinstance(r, GenerationResult)
    assert r.finish_reason == "stop" and r.text == "\x02"


def test_context_limit_truncates_not_crashes() -> None:
    eng = make_engine(max_len=32)
    r = eng.generate(list(b"abcabcabc"), SamplingParams(max_new_tokens=100, ignore_eos=True),
                     drafter="pld")
    assert isinstance(r, GenerationResult)
    assert r.finish_reason == "context"
    # The cache holds 32 positions; the last committed token never needs caching.
    assert len(b"abcabcabc") + r.new_tokens == 32 + 1


def test_bad_requests() -> None:
    eng = make_engine(max_len=32, max_batch_size=2)
    with pytest.raises(DataError):
        eng.generate("")
    with pytest.raises(ContextLengthError):
        eng.generate(list(b"x" * 40))
    with pytest.raises(UnknownNameError):
        eng.generate([1, 2], drafter="nope")
    # In a batch, a bad request fails alone; the others complete.
    out = eng.generate([list(b"abc"), list(b"y" * 40), list(b"abcd")],
                       SamplingParams(max_new_tokens=4, ignore_eos=True), drafter="pld")
    assert isinstance(out, list)
    assert [r.finish_reason for r in out] == ["length", "error", "length"]
    assert out[1].error and "KV cache" in out[1].error


def test_sampling_distribution_end_to_end() -> None:
    """With temperature 1 the 3 generated tokens follow the bigram chain's exact
    distribution, with and without drafts."""
    table, prompt, keys, probs, _ = sampling_chain_case()
    for drafter in ("none", "pld"):
        eng = Engine(BigramModel(table), ByteTokenizer(),  # type: ignore[arg-type]
                     EngineConfig(mode="fixed"))
        n = 4000
        counts, _ = sample_chain_counts(eng, prompt, keys, n, drafter=drafter)
        assert chi2_pvalue(counts, probs, n) > 1e-3, drafter


def test_seeds_over_the_whole_api_range() -> None:
    """Any seed the API admits (negative ones and up to 2^64 - 1) samples, and the same
    seed gives the same tokens (the requests' numpy generators take seed mod 2^64)."""
    eng = make_engine()

    def run(seed: int) -> list[int]:
        params = SamplingParams(temperature=1.0, seed=seed, max_new_tokens=6, ignore_eos=True)
        return eng.generate(list(b"abc"), params).token_ids  # type: ignore[union-attr]
    for seed in (-(2**63), -1, 0, 7, 2**64 - 1):
        assert run(seed) == run(seed), seed
    assert run(-1) == run(2**64 - 1)


def test_arrivals_hold_requests_back() -> None:
    eng = make_engine(max_batch_size=2)
    ps = [list(b"abcabcabc"), list(b"xyzxyz"), list(b"hello hello")]
    params = SamplingParams(max_new_tokens=6)
    ref = [eng.generate(p, params) for p in ps]
    t0 = time.perf_counter()
    got = eng.generate(ps, params, drafter="pld", arrivals=[0.0, 0.05, 0.3])
    assert time.perf_counter() - t0 >= 0.3
    assert [g.token_ids for g in got] == [r.token_ids for r in ref]
    assert all(g.latency >= g.wall_time for g in got)
    with pytest.raises(ValueError, match="arrivals"):
        eng.generate(ps, params, arrivals=[0.2, 0.1, 0.3])


def test_adaptive_mode_follows_the_cost_curve() -> None:
    from recallspec.cost.curve import CostCurve

    eng = make_engine(max_batch_size=3)
    ps = [list(p) for p in PROMPTS[:3]]
    params = SamplingParams(max_new_tokens=40)
    ref = [eng.generate(p, params) for p in ps]
    drafted = {}
    for name, curve in (("free", CostCurve((1, 512), (1.0, 1.0), 0.0)),
                        ("steep", CostCurve((1, 2), (1.0, 2.0), 0.0))):
        eng.use_cost_curve(curve)
        got = eng.generate(ps, params, drafter="pld", mode="adaptive")
        assert [g.token_ids for g in got] == [r.token_ids for r in ref]
        drafted[name] = eng.stats.draft_nodes
    # Rows that cost a whole step are only spent on occasional 1-node probes.
    assert drafted["steep"] < drafted["free"] / 4


class CountingBigram(BigramModel):
    """A bigram model that counts its forwards."""

    calls = 0

    def __call__(self, meta, cache):  # type: ignore[no-untyped-def]
        self.calls += 1
        return super().__call__(meta, cache)


def test_adaptive_mode_sizes_costly_drafts_before_proposing() -> None:
    """A draft model costs a forward per draft position, spent even on tokens the
    verification then drops; where drafting does not pay, the adaptive mode asks the
    draft model for nothing except occasional probes."""
    from recallspec.cost.curve import CostCurve

    eng = make_engine(max_batch_size=3)
    ps = [list(p) for p in PROMPTS[:3]]
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    ref = [eng.generate(p, params) for p in ps]
    eng.use_cost_curve(CostCurve((1, 2), (1.0, 2.0), 0.0))  # every row costs a whole step
    calls = {}
    for mode in ("fixed", "adaptive"):
        draft = CountingBigram(torch.randn(256, 256, generator=torch.Generator().manual_seed(1)))
        got = eng.generate(ps, params, drafter="draft-model", mode=mode,
                           drafter_options={"model": draft, "gamma": 4})
        assert [g.token_ids for g in got] == [r.token_ids for r in ref]
        calls[mode] = draft.calls
    assert calls["adaptive"] < calls["fixed"] / 4
