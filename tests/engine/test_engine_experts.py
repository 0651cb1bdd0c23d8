"""A mixture of experts' engine feeds its planner the experts each step's verification
forward woke (``Engine._execute``, ``NativeVerifier``), read from the native forward's
last-call counts: every step without prompt chunks is observed, at the verification
forward's own rows and count, never at a drafter's forward of the same step (one before
the verification and one after it, of as many rows); a step that carries a prompt chunk
is not observed (its rows would read as every row waking fresh experts). On a bigram
double whose rows route by token (``helpers/routed.py``): what each forward woke is
known from its tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from helpers import ByteTokenizer
from helpers.engine import bigram_table
from helpers.routed import Call, RoutedBigram

from recallspec.cost.expert_counts import WokenExperts, expert_shape
from recallspec.decoding.sampling import SamplingParams
from recallspec.decoding.tree import DraftTree
from recallspec.drafters import create_drafter
from recallspec.drafters.base import Drafter
from recallspec.engine import Engine, EngineConfig
from recallspec.runtime.batch import SequenceInput, build_batch

FILLER = 7  # the token of the drafter's own forwards: they wake one expert a layer


class Peeking(Drafter):
    """pld's drafts, and the target's forward of its own around each verification: one
    of 3 rows before each draft, one of as many rows as the request's verification
    after it (in ``observe``), every row FILLER."""

    name = "peeking"

    def __init__(self, model: RoutedBigram) -> None:
        self.inner = create_drafter("pld")
        self.model = model
        self.cache = model.new_cache(1, 64)
        self.slot = self.cache.allocate()

    def _forward(self, rows: int) -> None:
        routing = self.model.native
        routing.caller = "drafter"
        try:
            self.model(build_batch([SequenceInput(self.slot, 0, [FILLER] * rows)]), self.cache)
        finally:
            routing.caller = "engine"

    def start(self, rid: int, prompt: Sequence[int]) -> None:
        self.inner.start(rid, prompt)

    def propose(self, rid: int, max_nodes: int) -> DraftTree:
        self._forward(3)
        return self.inner.propose(rid, max_nodes)

    def observe(self, rid: int, accepted: Sequence[int], tree: DraftTree, logits: Any) -> None:
        self.inner.observe(rid, accepted, tree, logits)
        self._forward(1 + len(tree))

    def stop(self, rid: int) -> None:
        self.inner.stop(rid)


def _engine(model: RoutedBigram, batch: int) -> Engine:
    return Engine(model, ByteTokenizer(),  # type: ignore[arg-type]
                  EngineConfig(max_batch_size=batch, mode="fixed"))


def test_the_fake_is_a_mixture_with_counters() -> None:
    model = RoutedBigram(bigram_table())
    shape = expert_shape(model)
    assert shape is not None and (shape.experts, shape.experts_used) == (64, 1)
    counter = WokenExperts.of(model)
    assert counter is not None
    model(build_batch([SequenceInput(0, 0, [1, 2, 65, 3])]), model.new_cache(1, 8))
    assert counter.last(4) == 3.0  # 1 and 65 share an expert


@pytest.mark.parametrize("batch", [1, 2])
def test_each_decode_steps_verification_forward_is_observed(
        batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    model = RoutedBigram(bigram_table())
    eng = _engine(model, batch)
    seen: list[tuple[int, float]] = []
    monkeypatch.setattr(eng.planner, "observe_experts", lambda r, w: seen.append((r, w)))
    drafter = Peeking(model)
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    prompts = [list(b"abcabcabcab"), list(b"the cat sat on the mat; the cat")]
    log = model.native.log
    steps: list[tuple[list[Call], list[tuple[int, float]]]] = []  # each step's forwards, seen
    eng.add_request(prompts[0], params, drafter=drafter)
    late = prompts[1:] if batch > 1 else []
    n = 0
    while eng.has_unfinished():
        at, was = len(log), len(seen)
        if n == 3 and late:  # joins while the first decodes: a step of prompt and drafts
            eng.add_request(late.pop(), params, drafter=drafter)
        eng.step()
        steps.append((log[at:], seen[was:]))
        n += 1
    mixed = decoding = trapped = 0
    for calls, got in steps:
        verify = [c for c in calls if c.caller == "engine"]
        assert len(verify) == 1  # one forward a step, the prompt chunks' too
        v = verify[0]
        if v.prompt:  # a prompt chunk rode along: not observed
            assert got == []
            mixed += v.logits > 1  # a request's drafts too (its rows' logits)
            continue
        decoding += 1
        assert got == [(v.rows, float(v.woken))]
        trapped += any(c.caller == "drafter" and c.rows == v.rows and c.woken != v.woken
                       for c in calls)
    assert decoding > 5
    # The drafter's forward after the verification was of as many rows and woke other
    # experts: a reading after the step would have taken it.
    assert trapped > 0
    if batch > 1:
        assert mixed > 0
