"""The lossless suite on a mixture of experts (the conformance suite's tiny Qwen3-MoE and
gpt-oss checkpoints, converted by llama.cpp's converter, their matrices quantized at
load; gpt-oss also in its published format, MXFP4 experts, made by llama-quantize where
it is built): every
drafter family, batch size 1, 3 and 8 and prefix reuse commit exactly single-sequence
plain decoding's tokens. In a batch, rows of other sequences (and a tree's other nodes)
choose other experts, so each expert's product runs over a different set of rows than
alone: the tokens stay the same only because a row's result never depends on them."""

from __future__ import annotations

import random
from functools import cache

import pytest
from helpers.availability import native_peer_or_unavailable, unavailable
from helpers.conformance import built

from recallspec.conformance.checkpoints import ConformanceSetupError, quantized
from recallspec.decoding.sampling import SamplingParams
from recallspec.engine import Engine, EngineConfig
from recallspec.models import CausalLM, Tokenizer, load_model

# (variant, the file it loads: "F32", matrices quantized to Q8_0 at load, or a
# llama-quantize type)
# llama-quantize's file (the llama.cpp build): a peer test, run last (conftest).
MODELS = [("qwen3-moe", "F32"), ("gpt-oss", "F32"),
          pytest.param(("gpt-oss", "MXFP4_MOE"), marks=pytest.mark.peer)]
IDS = ["qwen3-moe-F32", "gpt-oss-F32", "gpt-oss-MXFP4_MOE"]
# The random gpt-oss never copies from its prompt (no n-gram of its answers is in it),
# so a drafter that recalls the prompt only offers nothing there; its draft rows are
# exercised by the drafters that also recall the answer so far (pld, sam+recycling).
PROMPT_BLIND = {("gpt-oss", "llma")}
# Budgets differ, so sequences leave at different steps and waiting ones join.
BUDGETS = (24, 8, 16, 5, 20, 12, 24, 9, 16)


@cache
def _model(which: tuple[str, str]) -> tuple[CausalLM, Tokenizer]:
    name, quant = which
    b = built(name)
    if quant == "F32":
        path = b.f32_gguf
    else:
        native_peer_or_unavailable()
        try:
            path = quantized(b, quant)
        except ConformanceSetupError as e:
            unavailable(str(e))
    model, tok = load_model(path, dtype="auto", repack_cache=False)
    assert model.config.moe and model.native is not None
    return model, tok


def _prompts(which: tuple[str, str]) -> list[list[int]]:
    """Token prompts of different lengths, each repeating a phrase of its own (so that
    recalled drafts are offered and some accepted, whatever the random model answers)."""
    rng = random.Random(7)
    vocab = _model(which)[0].config.vocab_size
    out = []
    for i in range(len(BUDGETS)):
        phrase = [rng.randrange(3, vocab) for _ in range(5 + i)]
        filler = [rng.randrange(3, vocab) for _ in range(10 + 13 * i)]
        out.append(filler + phrase + filler[:7] + phrase + phrase[:3])
    return out


def _engine(which: tuple[str, str], bs: int, prefix_cache: bool = False) -> Engine:
    model, tok = _model(which)
    return Engine(model, tok, EngineConfig(max_batch_size=bs, prefix_cache=prefix_cache,
                                           mode="fixed"))


@cache
def _single(which: tuple[str, str]) -> list[list[int]]:
    eng = _engine(which, 1)
    return [eng.generate(p, SamplingParams(max_new_tokens=n), drafter="none").token_ids
            for p, n in zip(_prompts(which), BUDGETS, strict=True)]


@pytest.mark.parametrize("which", MODELS, ids=IDS)
@pytest.mark.parametrize("bs", [1, 3, 8])
@pytest.mark.parametrize("drafter", ["none", "llma", "pld", "sam+recycling"])
def test_moe_identical_to_single_ar(which: tuple[str, str], bs: int, drafter: str) -> None:
    eng = _engine(which, bs)
    params = [SamplingParams(max_new_tokens=n) for n in BUDGETS]
    got = eng.generate(_prompts(which), params, drafter=drafter)
    bad = [i for i, (s, g) in enumerate(zip(_single(which), got, strict=True))
           if g.token_ids != s]
    assert not bad, (drafter, bs, bad)
    if drafter != "none" and (which[0], drafter) not in PROMPT_BLIND:
        assert eng.stats.draft_nodes > 0  # verification ran over draft rows


@pytest.mark.parametrize("which", MODELS, ids=IDS)
@pytest.mark.parametrize("bs", [1, 3])
def test_moe_prefix_reuse_identical(which: tuple[str, str], bs: int) -> None:
    """A second turn extends each prompt by its answer and more tokens: with prefix reuse
    its prompt's KV comes from the first turn's, and the answer is the same as without."""
    prompts = _prompts(which)[:4]
    first = _single(which)[:4]
    second = [p + a + p[:9] for p, a in zip(prompts, first, strict=True)]
    params = SamplingParams(max_new_tokens=12)
    off = _engine(which, bs).generate(second, params, drafter="llma")
    eng = _engine(which, bs, prefix_cache=True)
    eng.generate(prompts, SamplingParams(max_new_tokens=1), drafter="none")
    on = eng.generate(second, params, drafter="llma")
    assert [r.token_ids for r in on] == [r.token_ids for r in off]
    assert all(r.cached_tokens > 0 for r in on), [r.cached_tokens for r in on]
