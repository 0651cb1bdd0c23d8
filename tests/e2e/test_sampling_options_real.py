"""Penalties, logprobs and seeds on the real model: penalised greedy token-identical
with every drafter and equal to a plain penalised loop over the model's own forward;
logprobs of speculative decoding the same bits as autoregressive decoding's (and the
plain loop's log-softmax); a seed's sampled tokens the same alone, batched and with
drafts."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
import torch

from recallspec.decoding.penalties import Penalties
from recallspec.decoding.sampling import SamplingParams
from recallspec.engine import GenerationResult
from recallspec.runtime.batch import SequenceInput, build_batch

NEW_TOKENS = 20
DRAFTERS = ("pld", "llma", "sam")
PROMPTS = [
    "List the days of the week, then list them again: Monday, Tuesday,",
    "Write a Python function that adds two numbers, and a second one that adds three.",
]
PENALTIES = [
    {"presence_penalty": 1.2},
    {"frequency_penalty": 0.9},
    {"repeat_penalty": 1.1},  # over llama.cpp's window: the last 64 tokens
]


def _one(engine: Any, ids: list[int], params: SamplingParams, **kw: Any) -> GenerationResult:
    out = engine.generate(ids, params, **kw)
    assert isinstance(out, GenerationResult)
    return out


def _plain(engine: Any, ids: list[int], p: SamplingParams) -> tuple[list[int], list[torch.Tensor]]:
    """Penalised greedy decoding one forward per token, outside the engine: the tokens
    and each step's raw logits row."""
    model, cache = engine.model, engine.cache
    slot = cache.allocate()
    out: list[int] = []
    rows: list[torch.Tensor] = []
    try:
        with torch.inference_mode():
            last = model(build_batch([SequenceInput(slot, 0, ids, logits="last")]), cache)[0]
            cache.commit(slot, 0, range(len(ids)))
            for i in range(p.max_new_tokens):
                rows.append(last.clone())
                pen = Penalties.of(p, ids, out)
                out.append(int((pen.apply(last) if pen else last.numpy()).argmax()))
                last = model(build_batch([SequenceInput(slot, len(ids) + i, out[-1:])]),
                             cache)[0]
                cache.commit(slot, len(ids) + i, [0])
    finally:
        cache.release(slot)
    return out, rows


@pytest.mark.parametrize("kw", PENALTIES)
def test_penalised_greedy_identical_across_drafters(engine: Any, kw: dict[str, float]) -> None:
    p = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True, **kw)  # type: ignore[arg-type]
    changed = accepted = 0
    for prompt in PROMPTS:
        ids = engine.encode_prompt(prompt, chat=True)
        want, _ = _plain(engine, ids, p)
        changed += want != _one(engine, ids, replace(p, presence_penalty=0.0,
                                                     frequency_penalty=0.0,
                                                     repeat_penalty=1.0)).token_ids
        assert _one(engine, ids, p, drafter="none").token_ids == want
        for drafter in DRAFTERS:
            got = _one(engine, ids, p, drafter=drafter)
            assert got.token_ids == want, (drafter, prompt)
            accepted += sum(got.accept_lengths) - got.steps
    assert changed  # the penalty changed the text
    assert accepted > 0  # drafts were verified against penalised rows and accepted


def test_logprobs_speculative_equal_autoregressive(engine: Any) -> None:
    """The same bits from the verifying forward's rows as from plain decoding's (the
    kernels are batch-invariant: no tolerance), and within float rounding of
    ``torch.log_softmax`` of the plain loop's rows (an independent computation)."""
    ids = engine.encode_prompt(PROMPTS[0], chat=True)
    greedy = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True, logprobs=5)
    ar = _one(engine, ids, greedy, drafter="none")
    assert ar.logprobs is not None and len(ar.logprobs) == NEW_TOKENS
    plain, rows = _plain(engine, ids, greedy)
    assert ar.token_ids == plain
    for lp, row in zip(ar.logprobs, rows, strict=True):
        ref = torch.log_softmax(row.double(), -1)
        assert lp.top[0][0] == lp.token and lp.logprob == max(v for _, v in lp.top)
        assert math.isclose(lp.logprob, float(ref[lp.token]), abs_tol=1e-6)
        assert [t for t, _ in lp.top] == torch.topk(ref, 5).indices.tolist()
    accepted = 0
    for drafter in DRAFTERS:
        sp = _one(engine, ids, greedy, drafter=drafter)
        assert sp.token_ids == ar.token_ids and sp.logprobs == ar.logprobs, drafter
        accepted += sum(sp.accept_lengths) - sp.steps
    assert accepted > 0
    sampled = SamplingParams(temperature=0.8, seed=11, max_new_tokens=NEW_TOKENS,
                             ignore_eos=True, logprobs=2)
    ar = _one(engine, ids, sampled, drafter="none")
    for drafter in DRAFTERS:
        sp = _one(engine, ids, sampled, drafter=drafter)
        assert sp.token_ids == ar.token_ids and sp.logprobs == ar.logprobs, drafter


def test_a_seed_gives_the_same_tokens_alone_and_batched(engine: Any) -> None:
    prompts = [engine.encode_prompt(q, chat=True) for q in (
        *PROMPTS, "Name three rivers.", "Tell me a very short story about a robot.")]
    p = SamplingParams(temperature=1.0, top_p=0.95, seed=2024, max_new_tokens=NEW_TOKENS,
                       ignore_eos=True)
    alone = _one(engine, prompts[0], p, drafter="none").token_ids
    others = [SamplingParams(temperature=1.0, max_new_tokens=n) for n in (5, 17, 9)]
    for drafter in ("none", *DRAFTERS):
        out = engine.generate(prompts, [p, *others], drafter=drafter)
        assert isinstance(out, list) and out[0].token_ids == alone, drafter
        out = engine.generate(prompts[::-1], [*others, p], drafter=drafter)
        assert isinstance(out, list) and out[-1].token_ids == alone, drafter
    assert _one(engine, prompts[0], replace(p, seed=2025)).token_ids != alone
