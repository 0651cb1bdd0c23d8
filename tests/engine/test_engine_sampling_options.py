"""Penalties, logprobs and seeds through the engine, on the bigram test model: penalised
greedy identical with every drafter and equal to a plain penalised loop, penalised
sampling exactly distributed, a seed's tokens independent of drafts and batch, and
logprobs that are each row's log-softmax, handed out with their tokens."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch
from helpers import BigramModel, ByteTokenizer
from helpers.engine import PROMPTS, chain_engine, make_engine
from helpers.stats import chi2_pvalue

from recallspec.decoding.penalties import Penalties
from recallspec.decoding.sampling import SamplingParams
from recallspec.engine import Engine, EngineConfig, GenerationResult

DRAFTERS = ["pld", "llma", "recycling"]
PENALTIES = [
    {"presence_penalty": 1.5},
    {"frequency_penalty": 0.7},
    {"repeat_penalty": 1.8, "repeat_last_n": 8},
    {"repeat_penalty": 1.3, "repeat_last_n": -1, "presence_penalty": -0.4,
     "frequency_penalty": 0.3},
]


def _one(eng: Engine, prompt: list[int], params: SamplingParams, **kw: object) -> GenerationResult:
    out = eng.generate(prompt, params, **kw)
    assert isinstance(out, GenerationResult)
    return out


def _plain_greedy(table: torch.Tensor, prompt: list[int], p: SamplingParams) -> list[int]:
    """Penalised greedy decoding one token at a time, outside the engine."""
    out: list[int] = []
    for _ in range(p.max_new_tokens):
        text = [*prompt, *out]
        pen = Penalties.of(p, prompt, out)
        row = table[text[-1]]
        out.append(int((pen.apply(row) if pen else row.numpy()).argmax()))
    return out


@pytest.mark.parametrize("kw", PENALTIES)
def test_penalised_greedy_identical_across_drafters(kw: dict[str, float]) -> None:
    eng = make_engine()
    table = eng.model.table
    p = SamplingParams(max_new_tokens=40, ignore_eos=True, **kw)  # type: ignore[arg-type]
    changed = 0
    for prompt in map(list, PROMPTS):
        want = _plain_greedy(table, prompt, p)
        plain = _one(eng, prompt, SamplingParams(max_new_tokens=40, ignore_eos=True))
        changed += plain.token_ids != want
        for drafter in ("none", *DRAFTERS):
            got = _one(eng, prompt, p, drafter=drafter)
            assert got.token_ids == want, (drafter, prompt)
    assert changed  # the penalty really changed the text


def test_penalised_greedy_drafts_are_accepted() -> None:
    """A drafter that proposes the penalised continuation gets its drafts accepted: the
    draft is judged against the penalised rows, not the raw ones."""
    eng = make_engine()
    p = SamplingParams(max_new_tokens=60, ignore_eos=True, repeat_penalty=1.2, repeat_last_n=4)
    sp = _one(eng, list(b"abcabcabc"), p, drafter="pld")
    ar = _one(eng, list(b"abcabcabc"), p, drafter="none")
    assert sp.token_ids == ar.token_ids and sp.steps < ar.steps


def _penalised_chain(table: torch.Tensor, prompt: list[int], p: SamplingParams,
                     length: int) -> tuple[list[tuple[int, ...]], torch.Tensor]:
    """The exact distribution of every ``length``-token continuation at temperature 1."""
    v = int(table.shape[0])
    keys = list(itertools.product(range(v), repeat=length))
    probs = []
    for seq in keys:
        pr = 1.0
        for i, t in enumerate(seq):
            pen = Penalties.of(p, prompt, seq[:i])
            assert pen is not None
            row = torch.from_numpy(pen.apply(table[([*prompt, *seq[:i]])[-1]]))
            pr *= float(torch.softmax(row.double(), -1)[t])
        probs.append(pr)
    return keys, torch.tensor(probs)


def test_penalised_sampling_distribution_end_to_end() -> None:
    g = torch.Generator().manual_seed(7)
    table = torch.randn(4, 4, generator=g)
    table[:, 0] = -30.0  # EOS (id 0) out of reach
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    p = SamplingParams(temperature=1.0, max_new_tokens=3, presence_penalty=0.8,
                       frequency_penalty=0.4, repeat_penalty=1.5, repeat_last_n=3)
    keys, probs = _penalised_chain(table, prompt, p, 3)
    n = 3000
    for drafter in ("none", "pld"):
        eng = Engine(BigramModel(table), ByteTokenizer(),  # type: ignore[arg-type]
                     EngineConfig(mode="fixed"))
        counts: dict[int, int] = {}
        for seed in range(n):
            r = _one(eng, prompt, replace(p, seed=seed), drafter=drafter)
            k = keys.index(tuple(r.token_ids))
            counts[k] = counts.get(k, 0) + 1
        assert chi2_pvalue(counts, probs, n) > 1e-3, drafter


def test_a_seed_gives_the_same_tokens_alone_batched_and_with_drafts() -> None:
    """Sampling takes one uniform of the request's own generator per committed token,
    so neither the drafts nor the other requests of a batch change its tokens."""
    p = SamplingParams(temperature=0.8, max_new_tokens=40, ignore_eos=True, seed=123)
    prompt = list(PROMPTS[0])
    alone = _one(make_engine(), prompt, p, drafter="none").token_ids
    for drafter in ("none", *DRAFTERS):
        eng = make_engine(max_batch_size=4)
        others = [list(q) for q in PROMPTS[1:]]
        out = eng.generate([*others[:2], prompt, others[2]],
                           [SamplingParams(temperature=1.0, max_new_tokens=n, seed=s)
                            for n, s in ((7, 1), (30, None))] + [p]
                           + [SamplingParams(max_new_tokens=12)], drafter=drafter)
        assert isinstance(out, list) and out[2].token_ids == alone, drafter
    assert alone != _one(make_engine(), prompt, replace(p, seed=124)).token_ids


@pytest.mark.parametrize("drafter", ["none", "pld"])
def test_logprobs_are_each_rows_log_softmax(drafter: str) -> None:
    eng = make_engine()
    table = eng.model.table
    prompt = list(b"abcabcabcab")
    for params in (SamplingParams(max_new_tokens=30, ignore_eos=True, logprobs=3),
                   SamplingParams(temperature=1.0, seed=5, max_new_tokens=30,
                                  ignore_eos=True, logprobs=0, presence_penalty=0.5)):
        r = _one(eng, prompt, params, drafter=drafter)
        assert r.logprobs is not None and len(r.logprobs) == len(r.token_ids)
        prev = prompt[-1]
        for t, lp in zip(r.token_ids, r.logprobs, strict=True):
            ref = torch.log_softmax(table[prev].double(), -1)  # raw: no penalty, no t
            assert lp.token == t and math.isclose(lp.logprob, float(ref[t]), abs_tol=1e-9)
            assert len(lp.top) == params.logprobs
            if lp.top:
                assert [i for i, _ in lp.top] == torch.topk(ref, 3).indices.tolist()
                if params.greedy:
                    assert lp.top[0][0] == t  # greedy takes the most likely token
            prev = t
    assert _one(eng, prompt, SamplingParams(max_new_tokens=4)).logprobs is None


def test_streamed_logprobs_ride_with_their_tokens() -> None:
    """Online deltas: one logprob per new token id, and none for a final EOS."""
    eng = chain_engine()  # 1 -> 2 -> 3 -> 4 -> EOS
    rid = eng.add_request([1], SamplingParams(max_new_tokens=20, logprobs=2), drafter="pld")
    ids: list[int] = []
    lps = []
    while eng.has_unfinished():
        for out in eng.step():
            assert out.rid == rid
            assert [lp.token for lp in out.new_logprobs] == list(out.new_token_ids)
            ids += out.new_token_ids
            lps += out.new_logprobs
    assert ids == [2, 3, 4] and len(lps) == 3
    assert out.result is not None and out.result.logprobs == lps
