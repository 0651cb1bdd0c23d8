"""Prefix KV reuse on the real model: multi-turn chats, agent-style transcripts and
shared-document requests answer token for token as with the cache off, at several
batch sizes and with drafting; reuse really happens (``cached_tokens``), never across
tenants, and never from a failed request."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from recallspec.decoding.sampling import SamplingParams
from recallspec.engine import Engine, EngineConfig, GenerationResult
from recallspec.runtime.batch import SequenceInput, build_batch

NEW = 24  # tokens per answer: enough for answers to differ wherever the KV differs


def _engine(engine: Any, bs: int, prefix_cache: bool) -> Engine:
    # Shares the loaded weights and the cost curve; the KV cache is the engine's own.
    eng = Engine(engine.model, engine.tokenizer,
                 EngineConfig(max_batch_size=bs, prefix_cache=prefix_cache, mode="fixed"))
    eng.use_cost_curve(engine.cost_curve())
    return eng


def _chats(spec_bench_prompts: list[str], n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": q}] for q in spec_bench_prompts[1 : 1 + 2 * n : 2]]


def _turns(eng: Engine, chats: list[list[dict[str, str]]], follow: list[str], drafter: str,
           ) -> list[list[GenerationResult]]:
    """Every chat, turn by turn (all chats' turn k answered in one batched call): each
    turn appends the previous answer and the next follow-up to the transcript."""
    chats = [list(c) for c in chats]
    out: list[list[GenerationResult]] = [[] for _ in chats]
    params = SamplingParams(max_new_tokens=NEW)
    for k in range(len(follow) + 1):
        got = eng.generate([eng.prompt_ids(c) for c in chats], params,
                           drafter=drafter)
        for i, r in enumerate(got):
            out[i].append(r)
            if k < len(follow):
                chats[i] += [{"role": "assistant", "content": r.text},
                             {"role": "user", "content": follow[k]}]
    return out


FOLLOW = ["Shorter, please.", "Now list the key points.", "Thanks. Anything else?"]


@pytest.mark.parametrize("bs", [1, 3])
@pytest.mark.parametrize("drafter", ["none", "sam"])
def test_multi_turn_identical_with_and_without_prefix_cache(
    engine: Any, spec_bench_prompts: list[str], bs: int, drafter: str
) -> None:
    chats = _chats(spec_bench_prompts, 3)
    off = _turns(_engine(engine, bs, False), chats, FOLLOW, drafter)
    on = _turns(_engine(engine, bs, True), chats, FOLLOW, drafter)
    for a, b in zip(off, on, strict=True):
        assert [r.token_ids for r in a] == [r.token_ids for r in b]
        assert all(r.cached_tokens == 0 for r in a)
    # Every turn >= 2 starts from the previous turn's rows: from its slot, or from the
    # pool where the slot went to another chat (bs 1: 3 chats share one slot).
    later = [r.cached_tokens for conv in on for r in conv[1:]]
    assert all(c > 0 for c in later)
    for conv in on:
        for r in conv[1:]:
            assert r.cached_tokens < r.prompt_tokens


def test_agent_loop_and_shared_document(engine: Any, spec_bench_prompts: list[str]) -> None:
    """An agent-style transcript (each step re-sends everything plus a tool result) and
    two questions over one shared document: identical on and off, reused when on."""
    doc = max(spec_bench_prompts, key=len)  # the longest (a summarization article)
    on, off = _engine(engine, 2, True), _engine(engine, 2, False)
    params = SamplingParams(max_new_tokens=NEW)
    for eng_pair in ((on, off),):
        transcript = f"Task: answer questions about this text.\n\n{doc}\n"
        for step in range(3):
            prompt = eng_pair[0].encode_prompt(transcript, chat=True)
            a, b = (e.generate(prompt, params) for e in eng_pair)
            assert a.token_ids == b.token_ids
            if step:
                assert a.cached_tokens > len(prompt) // 2 and b.cached_tokens == 0
            transcript += f"Step {step}: {a.text}\nTool result: ok ({step})\n"
    questions = ["What is the main point?", "Who is involved?"]
    prompts = [on.encode_prompt(f"{doc}\n\n{q}", chat=True) for q in questions]
    got_on = [on.generate(p, params) for p in prompts]
    got_off = [off.generate(p, params) for p in prompts]
    assert [r.token_ids for r in got_on] == [r.token_ids for r in got_off]
    assert got_on[1].cached_tokens > len(prompts[1]) // 2


@pytest.mark.parametrize("drafter", ["none", "sam"])
def test_requests_together_copy_a_running_prefill(
    engine: Any, spec_bench_prompts: list[str], drafter: str
) -> None:
    """Three questions over one document sent together (as ``n`` choices or a RAG burst
    are): the second and third copy the document's rows from the first's running slot
    instead of prefilling them, and every answer is as with the cache off."""
    doc = max(spec_bench_prompts, key=len)
    on, off = _engine(engine, 3, True), _engine(engine, 3, False)
    prompts = [on.encode_prompt(f"{doc}\n\n{q}", chat=True)
               for q in ("What is the main point?", "Who is involved?", "Who is involved?")]
    params = SamplingParams(max_new_tokens=NEW)
    got_on = on.generate(prompts, params, drafter=drafter)
    got_off = off.generate(prompts, params, drafter=drafter)
    assert [r.token_ids for r in got_on] == [r.token_ids for r in got_off]
    assert got_on[0].cached_tokens == 0
    assert min(r.cached_tokens for r in got_on[1:]) > len(prompts[1]) // 2


def test_tenants_do_not_share_prefixes(engine: Any, spec_bench_prompts: list[str]) -> None:
    eng = _engine(engine, 2, True)
    prompt = eng.encode_prompt(spec_bench_prompts[3], chat=True)
    params = SamplingParams(max_new_tokens=4)

    def run(tenant: str) -> GenerationResult:
        rid = eng.add_request(prompt, params, tenant=tenant)
        while eng.has_unfinished():
            for o in eng.step():
                if o.finished and o.rid == rid:
                    assert o.result is not None
                    res = o.result
        return res

    first = run("alice")
    assert first.cached_tokens == 0
    assert run("bob").cached_tokens == 0  # same prompt, another tenant: prefilled
    again = run("alice")
    assert again.cached_tokens == len(prompt) - 1 and again.token_ids == first.token_ids


def test_a_slot_written_by_someone_else_is_not_reused(
    engine: Any, spec_bench_prompts: list[str]
) -> None:
    """Rows a caller writes into a free slot directly (as tests and tools running the
    model on the engine's cache do) are never taken for the prefix the slot retained."""
    eng = _engine(engine, 1, True)
    prompt = eng.encode_prompt(spec_bench_prompts[5], chat=True)
    params = SamplingParams(max_new_tokens=NEW)
    first = eng.generate(prompt, params)
    slot = eng.cache.allocate()
    with torch.inference_mode():  # other tokens over the retained rows
        other = eng.encode_prompt(spec_bench_prompts[6], chat=True)
        eng.model(build_batch([SequenceInput(slot, 0, other, logits="none")]), eng.cache)
    eng.cache.release(slot)
    again = eng.generate(prompt, params)
    assert again.cached_tokens == 0 and again.token_ids == first.token_ids
