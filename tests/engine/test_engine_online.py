"""The online engine API (add_request / step / abort) on the bigram double: deltas add
up to the offline result, mixed drafters in one step, aborts free everything at once,
one request's exception fails that request only, bad input raises when added, streamed
text never splits a UTF-8 character or leaks a stop string."""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise
from typing import Any

import pytest
import torch
from helpers import BigramModel, ByteTokenizer, successor_model

from recallspec.bench.suite.padded_layouts import padded_layout
from recallspec.cost.curve import CostCurve
from recallspec.decoding.sampling import SamplingParams
from recallspec.decoding.tree import DraftTree
from recallspec.drafters import Drafter, create_drafter
from recallspec.engine import Engine, EngineConfig, GenerationResult, RequestOutput
from recallspec.errors import ContextLengthError, DataError, UnknownNameError

PROMPTS = [b"abcabcabcab", b"hello hello hello", b"xyz", b"the cat sat on the mat; the cat"]


class FingerprintedBytes(ByteTokenizer):
    fingerprint = "byte-tokenizer-test"


def make_engine(**cfg: Any) -> Engine:
    table = torch.randn(256, 256, generator=torch.Generator().manual_seed(0)) * 3
    cfg.setdefault("mode", "fixed")  # named drafters at fixed sizes unless a test says
    return Engine(BigramModel(table), FingerprintedBytes(), EngineConfig(**cfg))  # type: ignore[arg-type]


def run_all(eng: Engine) -> dict[int, list[RequestOutput]]:
    """Step until idle; every request's outputs in order."""
    outs: dict[int, list[RequestOutput]] = defaultdict(list)
    for _ in range(10_000):
        if not eng.has_unfinished():
            break
        for o in eng.step():
            assert not outs[o.rid] or not outs[o.rid][-1].finished, "output after the last"
            outs[o.rid].append(o)
    assert not eng.has_unfinished()
    return outs


def check_deltas(outs: list[RequestOutput], want: GenerationResult) -> None:
    """The deltas of one request add up to its offline result."""
    assert outs[-1].finished and all(not o.finished for o in outs[:-1])
    res = outs[-1].result
    assert res is not None and res.token_ids == want.token_ids
    assert [t for o in outs for t in o.new_token_ids] == want.token_ids
    assert "".join(o.new_text for o in outs) == want.text == res.text
    assert outs[-1].finish_reason == want.finish_reason
    s = outs[-1].spec
    assert s.num_steps == res.steps and s.num_step_tokens == sum(res.accept_lengths)
    assert sum(s.accepted_per_pos) == s.num_accepted_tokens <= s.num_draft_tokens
    assert all(a >= b for a, b in zip(s.accepted_per_pos, s.accepted_per_pos[1:], strict=False))
    assert (s.accepted_per_pos[0] if s.accepted_per_pos else 0) <= s.num_drafts <= s.num_steps
    # Accepted draft tokens + one bonus token per step, less what stops cut off.
    assert s.num_step_tokens <= s.num_accepted_tokens + s.num_steps


def test_top_level_imports() -> None:
    from recallspec import Engine as E
    from recallspec import SamplingParams as S

    assert E is Engine and S is SamplingParams


@pytest.mark.parametrize("layout", ["ems", "vanilla"])
def test_mixed_drafters_in_one_step_match_offline(layout: str) -> None:
    """Four requests with four drafters (fixed, adaptive, a costly draft model sized
    before proposing) decode in the same steps, unpadded (the engine's EMS-SD) and in
    EMS-SD's padded baseline (a benchmark ablation, ``bench/suite/padded_layouts.py``); each
    equals plain AR, and the deltas add up to the offline result."""
    eng = make_engine(max_batch_size=4)
    eng.use_cost_curve(CostCurve((1, 512), (1.0, 1.2), 0.0))  # drafting pays
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (40, 17, 33, 25)]
    prompts = [list(p) for p in PROMPTS]
    ar = eng.generate(prompts, params, drafter="none")
    draft = BigramModel(torch.randn(256, 256, generator=torch.Generator().manual_seed(0)) * 3)
    setups: list[dict[str, Any]] = [
        {"drafter": "pld"},
        {"drafter": "llma", "mode": "adaptive"},
        {"drafter": "draft-model", "drafter_options": {"model": draft}, "mode": "adaptive"},
        {"drafter": "sam", "mode": "fixed"},
    ]
    with padded_layout(eng, layout) as pad:
        rids = [eng.add_request(p, sp, request_id=f"r{i}", **kw)
                for i, (p, sp, kw) in enumerate(zip(prompts, params, setups, strict=True))]
        assert eng.num_waiting == 4 and eng.num_running == 0
        first = eng.step()  # all four admitted and prefilled in one step
        assert eng.num_running == 4 and {o.rid for o in first} == set(rids)
        outs = run_all(eng)
    assert (pad.rows > 0 and pad.kv_entries > 0) is (layout == "vanilla")  # it really padded
    for rid, o0, want in zip(rids, first, ar, strict=True):
        check_deltas([o0, *outs[rid]], want)
        assert o0.request_id == f"r{rids.index(rid)}"
    assert sum(outs[rids[2]][-1].spec.accepted_per_pos) > 0  # the draft model drafted
    assert eng.cache.free_slots == 4


def test_requests_join_while_others_decode() -> None:
    eng = make_engine(max_batch_size=2)
    p = SamplingParams(max_new_tokens=30, ignore_eos=True)
    want = [eng.generate(list(q), p, drafter="none") for q in PROMPTS]
    outs: dict[int, list[RequestOutput]] = defaultdict(list)
    rids = []
    for q in PROMPTS:  # one new request every few steps
        rids.append(eng.add_request(list(q), p, drafter="pld"))
        for _ in range(3):
            for o in eng.step():
                outs[o.rid].append(o)
    for rid, o in run_all(eng).items():
        outs[rid] += o
    for rid, w in zip(rids, want, strict=True):
        check_deltas(outs[rid], w)


def test_abort_frees_slot_and_drafter_state_at_once() -> None:
    eng = make_engine(max_batch_size=1)
    p = SamplingParams(max_new_tokens=50, ignore_eos=True)
    d = eng.drafter("pld")
    a = eng.add_request(list(PROMPTS[0]), p, drafter="pld")
    b = eng.add_request(list(PROMPTS[1]), p, drafter="pld")
    for _ in range(3):
        eng.step()
    assert eng.num_running == 1 and eng.num_waiting == 1 and a in d._states  # type: ignore[attr-defined]
    out = eng.abort(a)
    assert out is not None and out.finished and out.finish_reason == "abort"
    assert out.result is not None and out.result.finish_reason == "abort"
    assert eng.cache.free_slots == 1 and a not in d._states  # type: ignore[attr-defined]
    assert eng.abort(a) is None  # already gone
    c = eng.add_request(list(PROMPTS[2]), p, drafter="pld")
    out = eng.abort(c)  # still waiting: never admitted
    assert out is not None and out.finish_reason == "abort" and out.new_token_ids == ()
    outs = run_all(eng)
    assert set(outs) == {b} and outs[b][-1].finish_reason == "length"
    assert eng.cache.free_slots == 1 and not d._states  # type: ignore[attr-defined]


class FaultyDrafter(Drafter):
    """pld, except that it raises for one prompt (in propose or observe)."""

    name = "faulty"
    needs_logits = False

    def __init__(self, bad_first_token: int, where: str) -> None:
        self.inner = create_drafter("pld")
        self.bad, self.where = bad_first_token, where
        self.rids: set[int] = set()

    def start(self, rid: int, prompt: Any) -> None:
        if prompt[0] == self.bad:
            if self.where == "start":
                raise RuntimeError("drafter start failed")
            self.rids.add(rid)
        self.inner.start(rid, prompt)

    def propose(self, rid: int, max_nodes: int) -> DraftTree:
        if rid in self.rids and self.where == "propose":
            raise RuntimeError("drafter propose failed")
        return self.inner.propose(rid, max_nodes)

    def observe(self, rid: int, accepted: Any, tree: DraftTree, logits: Any) -> None:
        if rid in self.rids and self.where == "observe":
            raise RuntimeError("drafter observe failed")
        self.inner.observe(rid, accepted, tree, logits)

    def stop(self, rid: int) -> None:
        self.inner.stop(rid)


@pytest.mark.parametrize("where", ["start", "propose", "observe"])
def test_an_exception_fails_only_its_request(where: str) -> None:
    eng = make_engine(max_batch_size=3)
    p = SamplingParams(max_new_tokens=20, ignore_eos=True)
    want = eng.generate([list(q) for q in PROMPTS], p, drafter="none")
    faulty = FaultyDrafter(PROMPTS[1][0], where)
    rids = [eng.add_request(list(q), p, drafter=faulty if i == 1 else "llma")
            for i, q in enumerate(PROMPTS)]
    outs = run_all(eng)
    bad = outs[rids[1]][-1]
    assert bad.finish_reason == "error" and bad.error and f"drafter {where} failed" in bad.error
    for i in (0, 2, 3):
        check_deltas(outs[rids[i]], want[i])
    assert eng.cache.free_slots == 3
    # Offline, the exception reaches the caller (after every slot was given back).
    with pytest.raises(RuntimeError, match=f"drafter {where} failed"):
        eng.generate([list(q) for q in PROMPTS], p, drafter=faulty)
    assert eng.cache.free_slots == 3 and not eng.has_unfinished()
    assert eng.generate(list(PROMPTS[0]), p).token_ids == want[0].token_ids


def test_bad_input_raises_when_added() -> None:
    eng = make_engine(max_len=32)
    bad: list[tuple[Any, dict[str, Any], type[Exception]]] = [
        ("", {}, DataError),
        ([], {}, DataError),
        ([True, False], {}, DataError),
        ([1, -1], {}, DataError),
        ([1, 256], {}, DataError),
        ([{"role": "user", "content": "hi"}], {}, DataError),  # no chat template
        ([1, "a"], {}, DataError),
        ({"a": 1}, {}, DataError),
        (list(b"x" * 40), {}, ContextLengthError),
        ([1, 2], {"drafter": "nope"}, UnknownNameError),
        ([1, 2], {"drafter": "pld", "drafter_options": {"max_ngram": 0}}, UnknownNameError),
        ([1, 2], {"drafter": "pld", "drafter_options": {"max_ngram": [3]}}, UnknownNameError),
        ([1, 2], {"mode": "nope"}, UnknownNameError),
        ([1, 2], {"params": "greedy"}, DataError),
    ]
    for prompt, kw, err in bad:
        with pytest.raises(err):
            eng.add_request(prompt, **kw)
    assert not eng.has_unfinished()
    with pytest.raises(DataError, match="chat template"):
        eng.chat([{"role": "user", "content": "hi"}])
    rid = eng.add_request("ok")
    with pytest.raises(RuntimeError, match="idle"):
        eng.generate("x")
    eng.abort(rid)
    r = eng.generate("abcabc", SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert isinstance(r, GenerationResult) and r.new_tokens == 4  # text prompts work


@pytest.mark.parametrize("drafter", ["none", "pld"])
def test_streamed_text_is_whole_characters_without_stop_strings(drafter: str) -> None:
    # A greedy chain over distinct bytes: ">" -> "Hé€!STOPq" -> EOS (multi-byte chars).
    text = "Hé€!STOPq".encode()
    chain = [ord(">"), *text, 0]
    succ = torch.zeros(256, dtype=torch.long)
    for a, b in pairwise(chain):
        succ[a] = b
    eng = Engine(successor_model(succ), ByteTokenizer(),  # type: ignore[arg-type]
                 EngineConfig(max_batch_size=2, mode="fixed"))
    for stop, want, reason in (((), "Hé€!STOPq", "eos"), (("STOP",), "Hé€!", "stop"),
                               (("€!S",), "Hé", "stop")):
        rid = eng.add_request([ord(">")], SamplingParams(max_new_tokens=40, stop=stop),
                              drafter=drafter)
        outs = run_all(eng)[rid]
        pieces = [o.new_text for o in outs]
        assert "".join(pieces) == want and outs[-1].finish_reason == reason
        assert all("\ufffd" not in p for p in pieces)
        for s in stop:  # no prefix of the stop string was streamed before the end
            assert all(s[:2] not in p for p in pieces[:-1])


def test_chat_and_text_on_the_real_model(engine: Any) -> None:
    """``Engine.chat`` takes messages (one conversation or several) or text; the ids are
    the chat template's, as ``encode_prompt(..., chat=True)`` gives them."""
    p = SamplingParams(max_new_tokens=8)
    q1, q2 = "Name three colours.", "What is 2 + 2?"
    ref = engine.generate(engine.encode_prompt(q1, chat=True), p)
    one = engine.chat([{"role": "user", "content": q1}], p, drafter="pld")
    text = engine.chat(q1, p)
    both = engine.chat([[{"role": "user", "content": q1}], [{"role": "user", "content": q2}]], p)
    assert one.token_ids == text.token_ids == both[0].token_ids == ref.token_ids
    assert both[1].token_ids == engine.generate(engine.encode_prompt(q2, chat=True), p).token_ids
    plain = engine.generate(engine.encode_prompt(q1), p)
    assert engine.generate(q1, p).token_ids == plain.token_ids


def test_config_default_drafter_takes_request_options() -> None:
    """A request naming no drafter gets the config's spec, its options under the
    request's (how ``recallspec serve --drafter sam --index x`` reaches requests)."""
    eng = make_engine(drafter="pld:max_tokens=3", mode="adaptive")
    eng.use_cost_curve(CostCurve((1, 512), (1.0, 1.2), 0.0))
    d = eng.resolve_drafter(None)
    assert d.name == "pld" and d.max_tokens == 3  # type: ignore[attr-defined]
    d2 = eng.resolve_drafter(None, {"max_ngram": 2})
    assert d2.max_tokens == 3 and d2.max_ngram == 2  # type: ignore[attr-defined]
    assert eng.resolve_drafter("pld") is not d
    rid = eng.add_request(list(PROMPTS[0]), SamplingParams(max_new_tokens=5))
    req = eng.scheduler.get(rid)
    assert req is not None and req.drafter is d and req.sizing == "adaptive"  # the config's
    eng.abort(rid)
