"""Lossless under a grammar, on the real model: constrained speculative decoding gives
constrained plain decoding's output (greedy token for token, sampling by seed and in
distribution) in every guide mode, alone and batched, with the prefix cache,
penalties, logprobs and several choices; and the output follows the grammar."""

from __future__ import annotations

import collections
import dataclasses
import json
import re
from typing import Any

import numpy as np
import pytest
import torch
from helpers.stats import chi2_pvalue

from recallspec.decoding import masks as M
from recallspec.decoding.masks import Guide
from recallspec.decoding.sampling import SamplingParams, probabilities
from recallspec.engine import GenerationResult
from recallspec.server.tool_calls import (
    ToolChoice,
    parse_tool_calls,
    shipped_template,
    validate_tools,
)
from recallspec.server.tool_grammar import tool_guide

NEW_TOKENS = 48
PEOPLE = [("Ada Lovelace", "London", 36), ("Alan Turing", "Manchester", 41),
          ("Grace Hopper", "New York", 85), ("Marie Curie", "Paris", 66),
          ("Nikola Tesla", "Smiljan", 86), ("Emmy Noether", "Erlangen", 53),
          ("Katherine Johnson", "White Sulphur Springs", 101), ("Carl Gauss", "Brunswick", 77),
          ("Rosalind Franklin", "London", 37), ("John von Neumann", "Budapest", 53)]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "city", "age"],
          "properties": {"name": {"type": "string"}, "city": {"type": "string"},
                         "age": {"type": "integer"}}}
GBNF = 'root ::= "Answer: " ("yes" | "no") "." " Because " [a-z ]{1,40} "."'
REGEX = r"[A-Z][a-z]+ was born in [A-Z][a-z]+( [A-Z][a-z]+)* in the year 1[0-9]{3}\."
MODES = {"json_object": Guide.json_object(), "json_schema": Guide.json_schema(SCHEMA),
         "regex": Guide("regex", REGEX), "gbnf": Guide("gbnf", GBNF)}
TOOLS = validate_tools([
    {"type": "function", "function": {"name": "record_person", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "lookup_city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
# The tool-call grammars the server gives SmolLM2 (Hermes calls, the shipped template).
TOOL_MODES = {
    "tools_required": tool_guide(TOOLS, ToolChoice("required"), family="hermes",
                                 parallel_tool_calls=False),
    "tools_auto": tool_guide(TOOLS, ToolChoice("auto"), family="hermes"),
}


def prompts(engine: Any) -> list[list[int]]:
    """20 chat prompts asking for a record of a person (two wordings per person)."""
    out = []
    for name, city, age in PEOPLE:
        for text in (f"{name} lived in {city} and reached the age of {age}. Give her or his "
                     "name, city and age as a JSON object.",
                     f"Describe {name} ({city}) briefly. Reply in JSON."):
            out.append(engine.encode_prompt(text, chat=True))
    return out


def tool_prompts(engine: Any) -> list[list[int]]:
    """The 20 asks rendered with the tools by the shipped template (as the server does)."""
    tok = engine.tokenizer.with_chat_template(shipped_template())
    tools = [t.to_openai() for t in TOOLS]
    out = []
    for name, city, age in PEOPLE:
        for text in (f"Record {name}, who lived in {city} and reached the age of {age}.",
                     f"Where did {name} live? Look the city up."):
            out.append(tok.encode(tok.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tools=tools)))
    return out


def valid(mode: str, r: GenerationResult) -> bool:
    """Whether a finished output is one the guide allows."""
    if r.finish_reason != "eos":
        return True  # cut by max_tokens: a prefix, checked by the grammar itself
    if mode.startswith("tools"):
        calls = parse_tool_calls("hermes", r.text).calls
        return (mode == "tools_auto" or len(calls) == 1) and all(
            isinstance(json.loads(c.arguments), dict) for c in calls)
    if mode in ("json_object", "json_schema"):
        value = json.loads(r.text)
        return isinstance(value, dict) and (mode == "json_object" or (
            set(value) == {"name", "city", "age"} and isinstance(value["age"], int)))
    if mode == "regex":
        return re.fullmatch(REGEX, r.text) is not None
    return re.fullmatch(r"Answer: (yes|no)\. Because [a-z ]{1,40}\.", r.text) is not None


@pytest.mark.parametrize("mode", sorted(MODES) + sorted(TOOL_MODES))
def test_constrained_speculation_equals_constrained_ar(engine: Any, mode: str) -> None:
    """Greedy, 20 prompts, batch 1: each drafter gives AR's tokens; then the 20 as
    batches of 8 (ragged, with a drafter) give them too."""
    params = SamplingParams(max_new_tokens=NEW_TOKENS, guide={**MODES, **TOOL_MODES}[mode])
    ps = tool_prompts(engine) if mode.startswith("tools") else prompts(engine)
    ar = [engine.generate(p, params, drafter="none") for p in ps]
    assert all(r.finish_reason in ("eos", "length") for r in ar), [r.error for r in ar]
    assert all(valid(mode, r) for r in ar)
    if mode != "tools_auto":  # (free text under auto runs to max_tokens)
        assert sum(r.finish_reason == "eos" for r in ar) >= 10  # most outputs complete
    steps = {}
    for drafter in ("llma", "pld"):
        got = [engine.generate(p, params, drafter=drafter) for p in ps]
        assert [g.token_ids for g in got] == [r.token_ids for r in ar], drafter
        steps[drafter] = sum(g.steps for g in got)
    assert min(steps.values()) < sum(r.steps for r in ar)  # drafts (or forced tokens) paid
    for lo in range(0, len(ps), 8):
        batch = engine.generate(ps[lo:lo + 8], params, drafter="llma")
        assert [b.token_ids for b in batch] == [r.token_ids for r in ar[lo:lo + 8]]


def test_forced_tokens_are_drafted_and_accepted(engine: Any) -> None:
    """The schema's forced keys, quotes and braces are drafted by the grammar: accepted
    forced tokens, fewer steps than plain decoding, the same tokens; plain decoding
    (drafter "none") drafts nothing, forced tokens included."""
    params = SamplingParams(max_new_tokens=NEW_TOKENS, guide=MODES["json_schema"])
    p = prompts(engine)[0]
    ar = engine.generate(p, params, drafter="none")
    assert engine.stats.forced_tokens == 0 and ar.steps == ar.new_tokens - 1 + (
        ar.finish_reason == "eos")
    got = engine.generate(p, params, drafter="pld")
    assert got.token_ids == ar.token_ids
    assert engine.stats.forced_tokens > 0 and got.steps < ar.steps


def test_prefix_cache_penalties_logprobs_and_choices(engine: Any) -> None:
    """With the prefix cache reused (the same prompt twice), penalties on, masked
    logprobs asked for: speculative equals AR bit for bit, logprobs included; forbidden
    tokens never appear among the alternatives."""
    p = prompts(engine)[2]
    params = SamplingParams(max_new_tokens=NEW_TOKENS, guide=MODES["json_schema"],
                            repeat_penalty=1.3, presence_penalty=0.5, logprobs=3)
    ar = engine.generate(p, params, drafter="none")
    for drafter in ("llma", "pld", "llma"):  # the second llma starts from a reused prefix
        got = engine.generate(p, params, drafter=drafter)
        assert got.token_ids == ar.token_ids
        assert got.logprobs == ar.logprobs
    assert got.cached_tokens > 0
    assert ar.logprobs is not None and max(lp.logprob for lp in ar.logprobs) == 0.0  # forced
    # n = 3 choices of one seed each (as the server submits them): each is the choice's
    # own AR output, with or without drafts.
    sp = dataclasses.replace(params, temperature=0.8, logprobs=None)
    seeds = [dataclasses.replace(sp, seed=100 + i) for i in range(3)]
    plain = engine.generate([p] * 3, seeds, drafter="none")
    spec = engine.generate([p] * 3, seeds, drafter="llma")
    assert [s.token_ids for s in spec] == [a.token_ids for a in plain]
    assert all(valid("json_schema", a) for a in plain)


def test_seeded_constrained_sampling_identity_across_modes(engine: Any) -> None:
    ps = prompts(engine)[:8]
    for mode in ("json_object", "regex"):
        params = [SamplingParams(temperature=1.0, top_p=0.95, seed=s, max_new_tokens=32,
                                 guide=MODES[mode]) for s in range(8)]
        plain = engine.generate(ps, params, drafter="none")
        for drafter in ("llma", "pld"):
            got = engine.generate(ps, params, drafter=drafter)
            assert [g.token_ids for g in got] == [a.token_ids for a in plain], (mode, drafter)


def test_constrained_first_token_follows_the_masked_distribution(engine: Any) -> None:
    """Chi-square over 2,000 seeds: the first token of a regex-constrained request is
    distributed as the softmax of the prompt's last row masked by the grammar."""
    p = engine.encode_prompt("Name a city.", chat=True)
    guide = Guide("regex", r"(Paris|Rome|Berlin|Madrid|Lisbon|Vienna|Prague|Oslo)")
    constraint = engine.guides.compile(guide, engine.tokenizer,
                                       vocab_size=int(engine.model.config.vocab_size)).matcher()
    from recallspec.runtime.batch import SequenceInput, build_batch

    slot = engine.cache.allocate()
    try:
        with torch.inference_mode():
            row = engine.model(build_batch([SequenceInput(slot, 0, p, logits="last")]),
                               engine.cache)[0].float().clone()
    finally:
        engine.cache.release(slot)
    from recallspec.decoding.tree import DraftTree

    mask = constraint.constrain(DraftTree.empty(), 0, 0).masks[0]
    t = SamplingParams(temperature=1.5)
    probs = probabilities(torch.from_numpy(M.apply(row.numpy(), mask)), t)
    n = 2000
    params = [SamplingParams(temperature=1.5, seed=s, max_new_tokens=1, guide=guide)
              for s in range(n)]
    got = engine.generate([p] * n, params, drafter="none")
    counts = collections.Counter(g.token_ids[0] for g in got)
    assert all(M.allowed(mask, tok) for tok in counts)
    # Pool the tokens of expected count < 5 (the chi-square approximation's rule).
    big = [i for i in np.flatnonzero(probs.numpy() * n >= 5)]
    assert big, "no token frequent enough to test"
    pooled = {int(i): counts.get(int(i), 0) for i in big}
    rest = n - sum(pooled.values())
    pp = torch.zeros(len(big) + 1, dtype=torch.float64)
    pp[: len(big)] = torch.tensor([float(probs[i]) for i in big], dtype=torch.float64)
    pp[-1] = 1.0 - float(pp[: len(big)].sum())
    cc = {i: pooled[int(b)] for i, b in enumerate(big)} | {len(big): rest}
    if pp[-1] <= 0:
        pp, cc = pp[:-1], {k: v for k, v in cc.items() if k < len(big)}
    # A fair sampler fails this at the 1e-4 level once in ten thousand runs.
    assert chi2_pvalue(cc, pp, n) > 1e-4


@pytest.fixture(scope="module")
def adaptive_engine() -> Any:
    """The real model under cost-aware sizing, priced by a synthetic curve (rows cheap
    enough that drafts and forced nodes pay, dear enough that sizing cuts some)."""
    from helpers.real_model import TEST_DTYPE

    from recallspec.cost.curve import CostCurve
    from recallspec.engine import Engine

    eng = Engine.load(None, max_batch_size=8, dtype=TEST_DTYPE, mode="adaptive")
    eng.use_cost_curve(CostCurve((1, 8, 64), (1.0, 1.3, 4.0), 0.0))
    yield eng
    eng.close()


@pytest.mark.parametrize("mode", ["json_schema", "tools_required"])
def test_adaptive_sizing_under_a_grammar_equals_constrained_ar(adaptive_engine: Any,
                                                                mode: str) -> None:
    """The default policy, cost-aware (forced nodes priced and cut to size): AR's tokens
    alone and as a batch of 8, greedy and seeded sampling."""
    eng = adaptive_engine
    guide = {**MODES, **TOOL_MODES}[mode]
    ps = (tool_prompts(eng) if mode.startswith("tools") else prompts(eng))[:8]
    for params in (SamplingParams(max_new_tokens=NEW_TOKENS, guide=guide),
                   SamplingParams(max_new_tokens=NEW_TOKENS, guide=guide, temperature=0.9,
                                  seed=3)):
        ar = [eng.generate(p, params, drafter="none") for p in ps]
        alone = [eng.generate(p, params, drafter="portfolio") for p in ps]
        batch = eng.generate(ps, [params] * len(ps), drafter="portfolio")
        assert [a.token_ids for a in alone] == [r.token_ids for r in ar]
        assert [b.token_ids for b in batch] == [r.token_ids for r in ar]
    assert eng.stats.forced_tokens > 0  # forced nodes were priced in, and accepted
