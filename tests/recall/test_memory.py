"""Response memory (issue 21): lossless greedy and sampling with memory on, repeated
requests drafting from it, tenant isolation at the drafter, the per-request and engine
off switches, the token budget and the add path that never waits for a build, the capped
warm-up of new segments' cursors, snapshots."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pytest
from helpers import BigramModel, ByteTokenizer, sample_chain_counts, sampling_chain_case
from helpers.real_model import TEST_DTYPE
from helpers.stats import chi2_pvalue

from recallspec.decoding.sampling import SamplingParams
from recallspec.drafters.portfolio import PortfolioDrafter
from recallspec.drafters.registry import create_drafter
from recallspec.drafters.sam import MEMORY, N_BUCKETS, SOURCES, SamDrafter
from recallspec.engine import Engine, EngineConfig, GenerationResult
from recallspec.errors import IndexFileError
from recallspec.recall.automata.cursor import MatchCursor
from recallspec.recall.automata.static import StaticIndex
from recallspec.recall.memory.response_memory import ResponseMemory
from recallspec.recall.memory.snapshot import load_snapshot
from recallspec.recall.request_cursors import WARM_TOKENS, RecallCursors
from recallspec.recall.view import RecallSource, ScratchDir

NEW_TOKENS = 32
Real = tuple[Any, list[list[int]], list[GenerationResult]]


@pytest.fixture(scope="module")
def real(engine: Any, spec_bench_prompts: list[str]) -> Real:
    """The session engine, its 6 shortest prompts, and their greedy AR outputs."""
    prompts = sorted((engine.encode_prompt(p, chat=True) for p in spec_bench_prompts),
                     key=len)[:6]
    ar = engine.generate(prompts, SamplingParams(max_new_tokens=NEW_TOKENS), drafter="none")
    assert isinstance(ar, list) and all(a.new_tokens > 0 for a in ar)
    return engine, prompts, ar


def memory_engine(base: Any, batch: int, **cfg: Any) -> Engine:
    cfg.setdefault("memory_tokens", 20000)
    cfg.setdefault("mode", "fixed")  # named drafters at fixed sizes unless a test says
    return Engine(base.model, base.tokenizer, EngineConfig(
        max_batch_size=batch, max_len=512, dtype=TEST_DTYPE, **cfg))


def run(eng: Engine, prompts: list[list[int]], drafter: str, **kw: Any) -> list[GenerationResult]:
    got = eng.generate(prompts, SamplingParams(max_new_tokens=NEW_TOKENS), drafter=drafter, **kw)
    assert isinstance(got, list)
    assert eng.memory is None or eng.memory.flush(10)  # what they fed is built
    return got


def same(got: list[GenerationResult], ar: list[GenerationResult]) -> bool:
    return [g.token_ids for g in got] == [a.token_ids for a in ar]


# ---- lossless, and the memory really drafts -----------------------------------------
@pytest.mark.parametrize(("drafter", "opts", "batch", "prompts_too"), [
    ("sam", {}, 1, True),
    ("sam+recycling", {}, 3, True),
    ("sam+recycling", {}, 1, False),
    ("sam", {}, 4, False),
    ("sam", {"tree": True}, 2, True),  # memory drafts as frequency trees
])
def test_greedy_identical_with_memory(real: Real, drafter: str, opts: dict[str, Any],
                                      batch: int, prompts_too: bool) -> None:
    """Two rounds of the same prompts: both equal AR; the second drafts from the first
    round's outputs (fewer steps). A third round with ``memory=False`` neither drafts
    from nor feeds the memory."""
    base, prompts, ar = real
    eng = memory_engine(base, batch, memory_prompts=prompts_too)
    first = run(eng, prompts, drafter, drafter_options=opts)
    d = eng.drafter(drafter, **opts)
    assert isinstance(d, SamDrafter)
    before = d.source_counts[MEMORY]
    second = run(eng, prompts, drafter, drafter_options=opts)
    assert same(first, ar) and same(second, ar)
    assert d.source_counts[MEMORY] > before
    assert sum(s.steps for s in second) < sum(f.steps for f in first)
    held = eng.memory_stats()["tokens"]
    drafted = d.source_counts[MEMORY]
    off = run(eng, prompts, drafter, memory=False, drafter_options=opts)
    assert same(off, ar)
    assert d.source_counts[MEMORY] == drafted and eng.memory_stats()["tokens"] == held


def test_engine_without_memory_holds_none(real: Real) -> None:
    base, prompts, ar = real
    eng = memory_engine(base, 2, memory_tokens=0)
    assert eng.memory is None and not eng.memory_stats()["enabled"]
    assert same(run(eng, prompts[:2], "sam"), ar[:2])
    assert same(run(eng, prompts[:2], "sam"), ar[:2])
    assert eng.drafter("sam").source_counts[MEMORY] == 0  # type: ignore[attr-defined]


# ---- tenants --------------------------------------------------------------------------
def test_tenant_b_never_drafts_from_tenant_a(real: Real) -> None:
    """After tenant A's output is in memory, tenant B's identical request never drafts
    from memory, and no request of another tenant is ever shown A's segments (B's own
    memory, once it has some, is shown to B); A's next request does draft from it."""
    base, prompts, ar = real
    eng = memory_engine(base, 1, memory_prompts=True)
    d = eng.drafter("sam")
    assert isinstance(d, SamDrafter) and eng.memory is not None
    seen: list[tuple[str, Any]] = []
    recall = d._recall

    def spy(rid: int) -> Any:
        view = recall(rid)
        seen.append((eng.scheduler.running[rid].tenant, view))
        return view

    d._recall = spy
    assert same(run(eng, prompts[:1], "sam", tenant="A"), ar[:1])
    a_segments = set(eng.memory.view("A"))
    assert a_segments
    count = d.source_counts[MEMORY]
    for tenant in ("B", None):  # None: the anonymous partition, another tenant too
        assert same(run(eng, prompts[:1], "sam", tenant=tenant), ar[:1])
        assert d.source_counts[MEMORY] == count  # A's identical output was not used
    assert same(run(eng, prompts[:1], "sam", tenant="B"), ar[:1])  # now from B's own
    assert d.source_counts[MEMORY] > count
    shown = {s for t, view in seen if t != "A" for group in view for s in group}
    assert shown and not shown & a_segments
    assert all(s.name.startswith("memory:B#") for s in shown)
    count = d.source_counts[MEMORY]
    again = run(eng, prompts[:1], "sam", tenant="A")  # the positive control
    assert same(again, ar[:1]) and d.source_counts[MEMORY] > count
    assert set(eng.memory_stats()["tenants"]) == {"A", "B", ""}


def test_aborted_and_failed_requests_are_not_remembered() -> None:
    eng = Engine(BigramModel(_table()), ByteTokenizer(),
                 EngineConfig(memory_tokens=1000, memory_prompt_tail=0,  # outputs only
                              mode="fixed"))
    rid = eng.add_request(list(b"hello hello"), SamplingParams(max_new_tokens=50,
                                                               ignore_eos=True), drafter="sam")
    for _ in range(3):
        eng.step()
    eng.abort(rid)
    assert eng.memory is not None and eng.memory.flush(5)
    assert eng.memory_stats()["tokens"] == 0
    eng.generate(list(b"hello hello"), SamplingParams(max_new_tokens=20, ignore_eos=True),
                 drafter="sam", tenant="t")
    assert eng.memory.flush(5) and eng.memory_stats()["tenants"]["t"]["tokens"] == 20


def _table() -> Any:
    import torch

    return torch.randn(256, 256, generator=torch.Generator().manual_seed(0)) * 3


# ---- sampling ---------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "opts"), [
    ("sam", {"delta": 0}),
    ("sam+recycling", {"delta": 0, "tau": 6}),
])
def test_sampling_distribution_with_memory(name: str, opts: dict[str, Any]) -> None:
    """Temperature 1, the bigram chain case: every sample's prompt and output feed the
    memory, later samples draft from earlier ones (the whole prompt matches there, longer
    than its own earlier occurrence), and three generated tokens still follow the exact
    distribution."""
    table, prompt, keys, probs, _ = sampling_chain_case()
    eng = Engine(BigramModel(table), ByteTokenizer(),
                 EngineConfig(max_draft_nodes=16, memory_tokens=4000, memory_prompts=True,
                              mode="fixed"))
    n = 2000
    counts, drafted = sample_chain_counts(eng, prompt, keys, n, drafter=name,
                                          drafter_options=opts)
    d = eng.drafter(name, **opts)
    assert isinstance(d, SamDrafter)
    assert d.source_counts[MEMORY] > n // 2 and drafted > 0
    assert chi2_pvalue(counts, probs, n) > 1e-3


def test_portfolio_tree_offers_every_continuation_the_memory_holds() -> None:
    """``portfolio:tree=true`` drafts a memory match as the memory's frequency tree: where
    the tenant's earlier text continued the matched context two ways, the draft offers
    both (under sampling each adds its probability of acceptance); without the option one
    continuation. The request's own text has no earlier match (``l_d`` = 0)."""
    eng = Engine(BigramModel(_table()), ByteTokenizer(),
                 EngineConfig(memory_tokens=4000, memory_prompts=True))
    eng.generate(list(b"xy the cat. xy the cow."), SamplingParams(max_new_tokens=1),
                 drafter="none", tenant="t")
    assert eng.memory is not None and eng.memory.flush(5)
    view = (eng.memory.view("t"),)
    firsts = {}
    for tree in (False, True):
        d = create_drafter("portfolio", tree=tree)
        assert isinstance(d, PortfolioDrafter)
        d._recall = lambda rid: view
        d.start(0, list(b"zz the c"))
        (context, draft), = d.candidates(0, 16)  # no own match: no ``latest`` chain
        assert context // N_BUCKETS == SOURCES.index(MEMORY)
        roots = draft.tokens[draft.parents < 0].tolist()
        firsts[tree] = sorted(bytes([t]) for t in roots)
    assert firsts == {False: [b"a"], True: [b"a", b"o"]}


# ---- the budget and the add path ---------------------------------------------------------
class _GatedScratch(ScratchDir):
    """Builds a segment only once ``go`` is set (``building``: a build waits on it), and
    records the threads it builds on: the memory's background builds wait on the test.
    A gate that is never opened opens itself after GATE_S and fails that build, so a
    memory whose ``add`` waited for a build fails the test instead of hanging it."""

    GATE_S = 30.0

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.building = threading.Event()
        self.threads: set[int] = set()

    def build(self, tokens: npt.NDArray[np.uint32], offsets: npt.NDArray[np.int64],
              vocab_size: int, fingerprint: str,
              metadata: dict[str, Any] | None = None) -> StaticIndex:
        self.threads.add(threading.get_ident())
        self.building.set()
        if not self.go.wait(self.GATE_S):
            self.go.set()
            raise AssertionError("the test never let the build go on")
        return super().build(tokens, offsets, vocab_size, fingerprint, metadata)


def test_budget_holds_and_add_never_waits_for_a_build() -> None:
    """Feed ~12x the budget in documents of random length, in bursts of 10, while reading
    the published view. A burst's first document starts a build that cannot finish until
    the test opens the gate (``_GatedScratch``); the other nine are added while it waits,
    so each of those adds returns with its document queued (the stats say so: queued or
    dropped as the queue's bound says, nothing built or published meanwhile) - an add
    that waited for a build would never return. Then the gate opens and the worker builds
    (on its own thread, never the caller's), so both the queue bound and the ring
    eviction act: the automata never hold more than the budget, queued text stays within
    the budget too, and every token is accounted for."""
    budget, vocab = 2000, 1000
    scratch = _GatedScratch()
    mem = ResponseMemory(budget, vocab, "fp", segments=4, scratch=scratch)
    rng = np.random.default_rng(0)
    peak, fed = 0, 0

    def new_doc() -> npt.NDArray[np.uint32]:
        return rng.integers(0, vocab, int(rng.integers(20, 400)), dtype=np.uint32)

    for _ in range(12):
        scratch.go.clear()
        scratch.building.clear()
        before, published = mem.stats(), mem.view("t")
        doc = new_doc()
        mem.add("t", doc)
        fed += len(doc)
        assert scratch.building.wait(60)  # the worker took it and waits in the build
        queued = 0
        for _ in range(9):
            doc = new_doc()
            mem.add("t", doc)  # returns although a build is in flight
            fed += len(doc)
            queued += len(doc)
            st = mem.stats()
            assert len(doc) <= st["queued_tokens"] <= budget  # this document waits its turn
            # Queued text only leaves the queue when dropped for its bound.
            assert st["queued_tokens"] + st["dropped_tokens"] - before["dropped_tokens"] == queued
            assert st["builds"] == before["builds"] and st["errors"] == 0
            assert mem.view("t") == published and not mem.flush(0)
        scratch.go.set()
        assert mem.flush(30)
        assert mem.stats()["builds"] > before["builds"]
        peak = max(peak, sum(s.tokens for s in mem.view("t")))
    st = mem.stats()
    assert scratch.threads and threading.get_ident() not in scratch.threads
    assert fed > 10 * budget
    assert st["tokens"] <= budget and peak <= budget
    assert st["tokens"] > budget - mem.segment_tokens  # eviction drops no more than needed
    assert st["segments"] <= 4 + 1 and st["evictions"] > 0
    assert st["tokens"] + st["dropped_tokens"] + st["evicted_tokens"] == fed
    assert st["builds"] > 0 and st["build_s_max"] > 0 and st["errors"] == 0
    # The newest text is what is kept (the last document, maybe split at a boundary).
    kept = np.concatenate(mem.documents()["t"])
    assert kept.shape[0] == st["tokens"] and kept[-len(doc):].tolist() == doc.tolist()
    mem.close()


class _CountingIndex:
    """A segment's index whose cursors record every batch of tokens they are fed."""

    def __init__(self, index: StaticIndex, fed: list[list[int]]) -> None:
        self.index, self.fed = index, fed

    def cursor(self) -> MatchCursor:
        return _CountingCursor(self.index, self.fed)


class _CountingCursor(MatchCursor):
    def __init__(self, index: StaticIndex, fed: list[list[int]]) -> None:
        super().__init__(index)
        self.fed = fed

    def advance(self, tokens: Any) -> int:
        self.fed.append(np.atleast_1d(np.asarray(tokens)).tolist())
        return super().advance(tokens)


def test_new_segments_are_picked_up_by_a_capped_warm_up() -> None:
    """A running request (2000 tokens of text) meets 4 or 5 new segments at once: each
    new cursor is warmed up by one call on the text's last WARM_TOKENS tokens - work
    capped however long the text - and matches as far as that lets it (the text's last
    300 tokens occur in every segment); a refresh with unchanged groups reads no text and
    makes no cursor."""
    vocab = 1000
    rng = np.random.default_rng(1)
    mem = ResponseMemory(50_000, vocab, "fp", segments=4)
    text = rng.integers(0, vocab, 2000, dtype=np.uint32)
    for i in range(5):
        mem.add("t", np.concatenate([text[-300:], rng.integers(0, vocab, 12_000 + i,
                                                                dtype=np.uint32)]))
    assert mem.flush(30)
    fed: list[list[int]] = []
    segments = tuple(RecallSource(s.kind, s.name, cast(StaticIndex, _CountingIndex(s.index, fed)))
                     for s in mem.view("t"))
    view = (segments, ())
    assert len(view[0]) >= 4  # (the fifth document evicted the oldest segment)
    reads: list[int] = []

    def request_text() -> npt.NDArray[np.uint32]:
        reads.append(len(text))
        return text

    rc = RecallCursors()
    rc.refresh(view, request_text)
    assert reads == [len(text)]  # read once for all the new sources
    assert fed == [text[-WARM_TOKENS:].tolist()] * len(segments)  # capped warm-up, each
    assert [s for s, _ in rc.cursors] == list(segments)
    assert rc.best is not None and rc.best_length == WARM_TOKENS
    cursors = list(rc.cursors)
    rc.refresh((view[0], ()), request_text)  # same groups: nothing rebuilt
    assert rc.cursors == cursors
    assert reads == [len(text)] and len(fed) == len(segments)  # no text read, no token fed
    mem.close()


def test_tenants_beyond_the_limit_are_forgotten_oldest_first() -> None:
    mem = ResponseMemory(100, 50, "fp", max_tenants=2)
    for t in ("a", "b", "a", "c"):  # "b" is now the least recently fed
        mem.add(t, [1, 2, 3])
    assert mem.flush(10)
    assert set(mem.stats()["tenants"]) == {"a", "c"} and mem.view("b") == ()
    assert mem.stats()["tenants_dropped"] == 1
    mem.close()


def test_a_document_over_the_budget_keeps_its_end() -> None:
    mem = ResponseMemory(100, 500, "fp", segments=4)
    mem.add("t", list(range(350)))
    assert mem.flush(10)
    docs = mem.documents()["t"]
    assert np.concatenate(docs).tolist() == list(range(250, 350))
    assert sum(s.tokens for s in mem.view("t")) == 100
    mem.close()


# ---- snapshots ----------------------------------------------------------------------------
def test_snapshot_round_trip_and_refusals(tmp_path: Path) -> None:
    cfg: dict[str, Any] = {"memory_tokens": 1000, "memory_prompts": True, "mode": "fixed"}
    eng = Engine(BigramModel(_table()), _FP(), EngineConfig(**cfg))
    for tenant, text in (("A", b"hello hello"), ("B", b"the cat sat")):
        eng.generate(list(text), SamplingParams(max_new_tokens=20, ignore_eos=True),
                     drafter="sam", tenant=tenant)
    assert eng.memory is not None and eng.memory.flush(5)
    path = tmp_path / "mem.snap"
    assert eng.save_memory(path) == path.stat().st_size
    again = Engine(BigramModel(_table()), _FP(),
                   EngineConfig(memory_snapshot=str(path), **cfg))
    assert again.memory is not None and again.memory.flush(5)
    want, got = eng.memory.documents(), again.memory.documents()
    assert set(got) == {"A", "B"}
    assert {t: [d.tolist() for d in ds] for t, ds in got.items()} == {
        t: [d.tolist() for d in ds] for t, ds in want.items()}
    with pytest.raises(IndexFileError, match="different tokenizer"):
        load_snapshot(path, "another-tokenizer", 256)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(IndexFileError, match="checksum"):
        Engine(BigramModel(_table()), _FP(), EngineConfig(memory_snapshot=str(path), **cfg))
    path.write_bytes(b"RSMEMORY\x05")
    with pytest.raises(IndexFileError):
        load_snapshot(path, "fp", 256)
    # A missing snapshot is a first run: the engine starts empty.
    fresh = Engine(BigramModel(_table()), _FP(),
                   EngineConfig(memory_snapshot=str(tmp_path / "none.snap"), **cfg))
    assert fresh.memory_stats()["tokens"] == 0


class _FP(ByteTokenizer):
    fingerprint = "fp"


def test_recall_source_identity() -> None:
    """A drafter keeps one cursor per source object: sources hash by identity."""
    mem = ResponseMemory(100, 50, "fp")
    mem.add("t", [1, 2, 3])
    mem.add("u", [1, 2, 3])
    assert mem.flush(10)
    (a,), (b,) = mem.view("t"), mem.view("u")
    assert isinstance(a, RecallSource) and a is not b and a != b and len({a, b}) == 2
    mem.close()
