"""SAM-Decoding drafters (sam, sam+recycling), model drafters (draft-model,
sam+draft-model) and Token Recycling: lossless on the bigram double and on the real
model, source selection, static-index handling, draft-model KV-cache sync."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import BigramModel, ByteTokenizer, sample_chain_counts, sampling_chain_case
from helpers.engine import FP, PROMPTS, bigram_table, make_fingerprinted_engine
from helpers.stats import chi2_pvalue

from recallspec.bench.suite.padded_layouts import padded_layout
from recallspec.cost.sizing import N_STATES
from recallspec.decoding.sampling import SamplingParams
from recallspec.decoding.tree import DraftTree
from recallspec.drafters import create_drafter
from recallspec.drafters.draft_model import DraftModelDrafter, SamDraftModelDrafter
from recallspec.drafters.recycling import RecyclingDrafter
from recallspec.drafters.sam import (
    DYNAMIC,
    N_BUCKETS,
    NONE,
    RECYCLING,
    SOURCES,
    STATIC,
    SamDrafter,
    length_bucket,
)
from recallspec.engine import Engine, EngineConfig, GenerationResult
from recallspec.errors import IndexFileError
from recallspec.recall.automata import StaticIndex


def noisy_draft_model() -> BigramModel:
    """A separate draft model that agrees with the target only part of the time."""
    g = torch.Generator().manual_seed(1)
    return BigramModel(bigram_table() + torch.randn(256, 256, generator=g) * 2)


def bigram_cases() -> list[tuple[str, dict[str, Any]]]:
    return [
        ("sam", {}),
        ("sam", {"max_tokens": 3, "delta": 0}),
        ("sam+recycling", {}),
        ("sam+recycling", {"tau": 1, "template": "tr80"}),
        ("draft-model", {"model": noisy_draft_model()}),
        ("draft-model", {"model": noisy_draft_model(), "gamma": 7}),
        ("sam+draft-model", {"model": noisy_draft_model(), "tau": 2}),
    ]


@pytest.mark.parametrize(("drafter", "options"), bigram_cases())
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_identical_to_ar_bigram(drafter: str, options: dict[str, Any], batch: int) -> None:
    eng = make_fingerprinted_engine(max_batch_size=batch)
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (40, 17, 33, 5)]
    prompts = [list(p) for p in PROMPTS]
    ar = eng.generate(prompts, params, drafter="none")
    sp = eng.generate(prompts, params, drafter=drafter, drafter_options=options)
    again = eng.generate(prompts, params, drafter=drafter, drafter_options=options)  # warm
    assert isinstance(ar, list) and isinstance(sp, list) and isinstance(again, list)
    for a, s, s2 in zip(ar, sp, again, strict=True):
        assert s.token_ids == a.token_ids and s2.token_ids == a.token_ids
        assert s.new_tokens == 1 + sum(s.accept_lengths)
    assert sum(s.steps for s in sp) < sum(a.steps for a in ar)  # drafts were accepted
    assert eng.cache.free_slots == batch


def test_draft_model_perfect_drafter_accepts_everything() -> None:
    """With the target itself as the draft model every chain of gamma is accepted."""
    table = bigram_table()
    eng = Engine(BigramModel(table), ByteTokenizer(),
                 EngineConfig(max_draft_nodes=16, mode="fixed"))
    r = eng.generate(list(b"hello"), SamplingParams(max_new_tokens=41, ignore_eos=True),
                     drafter="draft-model", drafter_options={"model": BigramModel(table)})
    assert isinstance(r, GenerationResult)
    assert r.accept_lengths == [5] * 8


def test_draft_model_kv_cache_follows_committed_text() -> None:
    """The drafter's slot holds a prefix of prompt + committed text after every step
    (BigramModel writes token ids as keys), and slots are returned at stop."""
    draft = noisy_draft_model()
    d = create_drafter("draft-model", model=draft, slots=2, max_len=128)
    assert isinstance(d, DraftModelDrafter)
    eng = make_fingerprinted_engine()
    seen: list[tuple[list[int], list[int]]] = []
    orig = d.observe

    def spy(rid: int, accepted: Any, tree: DraftTree, logits: Any) -> None:
        orig(rid, accepted, tree, logits)
        req = d.draft._requests[rid]
        cache = d.draft._cache
        assert cache is not None
        n = cache.length(req.slot)
        seen.append((cache.k[0, req.slot, 0, :n, 0].long().tolist(), list(req.text)))

    d.observe = spy  # type: ignore[method-assign]
    eng.generate(list(b"hello hello"), SamplingParams(max_new_tokens=30, ignore_eos=True),
                 drafter=d)
    assert len(seen) > 3
    for cached, text in seen:
        assert cached == text[: len(cached)] and len(cached) < len(text)
    assert d.draft._cache is not None and d.draft._cache.free_slots == 2


def test_sam_sources_and_delta_rule(tmp_path: Path) -> None:
    corpus = [list(b"the quick brown fox jumps over the lazy dog"), list(b"lorem ipsum dolor")]
    path = tmp_path / "c.idx"
    StaticIndex.build(corpus, 256, FP, path)
    d = create_drafter("sam", index=str(path), tokenizer_fingerprint=FP, delta=2)
    assert isinstance(d, SamDrafter)
    d.start(0, list(b"xx the quick brown"))  # l_s = 12 (" the quick brown"... within the doc)
    tree = d.propose(0, 40)
    step = d.last_step(0)
    assert step.source == STATIC and step.static_length > step.dynamic_length + 2
    assert bytes(tree.tokens.tolist()).startswith(b" fox jumps")
    d.start(1, list(b"abcdefgh abcdefgh"))  # own repetition, no corpus match
    tree = d.propose(1, 40)
    assert d.last_source(1) == DYNAMIC and d.last_step(1).dynamic_length == 8
    d.start(2, list(b"zq"))
    assert len(d.propose(2, 40)) == 0 and d.last_source(2) == NONE
    d.observe(2, list(b" fox jumps"), DraftTree.empty(), None)  # l_s 10 > l_d 0 + 2
    assert d.last_step(2).source == NONE  # statistics describe proposals only
    assert bytes(d.propose(2, 5).tokens.tolist()) == b" over"
    assert d.last_source(2) == STATIC
    assert d.source_counts[STATIC] == 2 and d.source_counts[DYNAMIC] == 1
    t = create_drafter("sam", index=str(path), tokenizer_fingerprint=FP, tree=True, delta=0)
    t.start(0, list(b"the "))
    tree = t.propose(0, 10)
    assert len(tree) == 10 and not tree.is_chain  # "the quick" and "the lazy"
    # Ablation: without the dynamic automaton the request's own repetition is not used.
    nd = create_drafter("sam", index=str(path), tokenizer_fingerprint=FP, dynamic=False)
    nd.start(0, list(b"abcdefgh abcdefgh"))
    assert len(nd.propose(0, 40)) == 0 and nd.last_step(0).dynamic_length == 0


def test_sam_recycling_switches_on_tau() -> None:
    d = create_drafter("sam+recycling", tau=4)
    assert d.needs_logits
    d.start(0, list(b"abc"))
    v = 256
    logits = torch.zeros(1, v)
    logits[0, ord("d")] = 5.0
    d.observe(0, list(b"d"), DraftTree.empty(), logits)  # table['c'] learnt; text "abcd"
    assert isinstance(d, SamDrafter)
    d.propose(0, 60)
    assert d.last_source(0) == NONE  # table row of 'd' unknown yet: an empty tree
    d.start(1, list(b"abcdefg xyz abcdef"))  # l_d = 6 >= tau
    assert bytes(d.propose(1, 60).tokens.tolist()).startswith(b"g xyz")
    assert d.last_source(1) == DYNAMIC
    d.start(2, list(b"qqc"))  # l_d = 1 < tau: recycling from 'c' -> 'd'
    tree = d.propose(2, 60)
    assert d.last_source(2) == RECYCLING and tree.tokens[0] == ord("d")
    # max_tokens caps the recycling tree as it caps automaton chains.
    capped = create_drafter("sam+recycling", tau=4, max_tokens=3)
    capped.start(0, list(b"abc"))
    capped.observe(0, list(b"d"), DraftTree.empty(), logits)  # allocates the table
    table = capped.recycling.table  # type: ignore[attr-defined]
    assert table.rows is not None
    table.rows[:] = (np.arange(v)[:, None] + np.arange(1, 9)) % v  # every row known
    capped.start(3, list(b"qqc"))
    assert len(capped.propose(3, 60)) == 3 and capped.last_source(3) == RECYCLING


@pytest.mark.parametrize("name", ["sam", "sam+recycling", "sam+draft-model"])
def test_context_names_the_next_proposals_source(tmp_path: Path, name: str) -> None:
    """``context(rid)``, read before ``propose``, names the source the proposal then uses
    (when it drafts anything: an empty automaton draft falls back, an empty auxiliary
    draft is recorded as none) and the match length's bucket."""
    rng = np.random.default_rng(1)
    corpus = [rng.integers(97, 101, 60).tolist() for _ in range(4)]
    path = tmp_path / "c.idx"
    StaticIndex.build(corpus, 256, FP, path)
    opts: dict[str, Any] = {"index": str(path), "tokenizer_fingerprint": FP, "delta": 2}
    if name != "sam":
        opts["tau"] = 3
    if name == "sam+draft-model":
        opts["model"] = noisy_draft_model()
    d = create_drafter(name, **opts)
    assert isinstance(d, SamDrafter) and d.contexts == len(SOURCES) * N_BUCKETS
    text = corpus[0][:20] + rng.integers(97, 101, 80).tolist()  # corpus text, then noise
    d.start(0, text[:3])
    seen = set()
    for i in range(3, len(text)):
        ctx = d.context(0)
        tree = d.propose(0, 8)
        step = d.last_step(0)
        if len(tree):
            assert SOURCES[ctx // N_BUCKETS] == step.source
            used = {STATIC: step.static_length, DYNAMIC: step.dynamic_length}.get(
                step.source, max(step.static_length, step.dynamic_length))
            assert ctx % N_BUCKETS == length_bucket(used)
            seen.add(step.source)
        d.observe(0, [text[i]], DraftTree.empty(), torch.zeros(1, 256))
    assert STATIC in seen and DYNAMIC in seen
    assert [length_bucket(n) for n in (0, 1, 2, 3, 4, 8, 15, 16, 31, 32, 999)] == [
        0, 1, 2, 2, 3, 4, 4, 5, 5, 6, 6]


def test_static_index_fingerprint_checked(tmp_path: Path) -> None:
    path = tmp_path / "c.idx"
    StaticIndex.build([list(b"some text")], 256, "other-tokenizer", path)
    eng = make_fingerprinted_engine()
    with pytest.raises(IndexFileError, match="different tokenizer"):
        eng.generate(list(b"some"), SamplingParams(max_new_tokens=3), drafter="sam",
                     drafter_options={"index": str(path)})
    d = create_drafter("sam", index=str(path))
    with pytest.raises(ValueError, match="fingerprint"):
        d.start(0, [1, 2])


def test_sam_with_static_index_lossless_bigram(tmp_path: Path) -> None:
    eng = make_fingerprinted_engine(max_batch_size=2)
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    prompts = [list(p) for p in PROMPTS]
    ar = eng.generate(prompts, params, drafter="none")
    assert isinstance(ar, list)
    path = tmp_path / "gen.idx"
    # The corpus holds the answers themselves, so static drafts fire and are accepted.
    StaticIndex.build([p + a.token_ids for p, a in zip(prompts[:2], ar[:2], strict=True)], 256,
                      FP, path)
    cases: list[tuple[str, dict[str, Any]]] = [
        ("sam", {"index": str(path)}),
        ("sam", {"index": str(path), "tree": True}),
        ("sam+recycling", {"index": str(path)}),
    ]
    for name, opts in cases:
        sp = eng.generate(prompts, params, drafter=name, drafter_options=opts)
        assert isinstance(sp, list)
        assert [s.token_ids for s in sp] == [a.token_ids for a in ar], (name, opts)
        d = eng.drafter(name, **opts)
        assert isinstance(d, SamDrafter) and d.source_counts[STATIC] > 0
        assert sp[0].steps < 10


def test_sampling_distribution_sam_draft_model() -> None:
    """Temperature 1: three generated tokens follow the exact bigram chain distribution
    with chain drafts from an imperfect draft model and from the automaton."""
    table, prompt, keys, probs, g = sampling_chain_case()
    draft = BigramModel(table + torch.randn(4, 4, generator=g))
    eng = Engine(BigramModel(table), ByteTokenizer(), EngineConfig(mode="fixed"))
    n = 3000
    counts, _ = sample_chain_counts(eng, prompt, keys, n, drafter="sam+draft-model",
                                    drafter_options={"model": draft, "tau": 6})
    d = eng.drafter("sam+draft-model", model=draft, tau=6)
    assert isinstance(d, SamDraftModelDrafter)
    assert d.source_counts["model"] > 0 and d.source_counts[DYNAMIC] > 0
    assert chi2_pvalue(counts, probs, n) > 1e-3


@pytest.mark.parametrize(("name", "opts", "mode"), [
    ("sam", {}, "fixed"),
    ("sam+recycling", {"tau": 6}, "fixed"),
    ("sam+recycling", {"tau": 6}, "adaptive"),
])
def test_sampling_distribution_sam_and_recycling(name: str, opts: dict[str, Any],
                                                 mode: str) -> None:
    """Temperature 1: three generated tokens follow the exact bigram chain distribution
    with automaton chains and recycling trees, fixed-size and cost-aware (a flat cost
    curve, so the adaptive mode really drafts)."""
    from recallspec.cost.curve import CostCurve

    table, prompt, keys, probs, _ = sampling_chain_case()
    eng = Engine(BigramModel(table), ByteTokenizer(), EngineConfig(max_draft_nodes=16))
    eng.use_cost_curve(CostCurve((1, 64), (1.0, 1.0), 0.0))
    n = 3000
    counts, drafted = sample_chain_counts(eng, prompt, keys, n, drafter=name,
                                          drafter_options=opts, mode=mode)
    assert drafted > n // 4  # drafts were proposed and partly accepted
    assert chi2_pvalue(counts, probs, n) > 1e-3


def test_registered_names_and_defaults() -> None:
    from recallspec.drafters import available_drafters

    names = set(available_drafters())
    assert {"recycling", "sam", "sam+recycling", "draft-model", "sam+draft-model"} <= names
    d = create_drafter("draft-model")
    assert isinstance(d, DraftModelDrafter) and d.draft.options.layers == 8
    assert d.draft.options.gamma == 4
    s = create_drafter("sam")
    assert isinstance(s, SamDrafter) and s.options.max_tokens == 40 and s.options.delta == 5
    r = create_drafter("sam+recycling")
    assert isinstance(r.recycling, RecyclingDrafter) and r.tau == 5  # type: ignore[attr-defined]


# ---- the real model ------------------------------------------------------------------
# Kept small for a shared CPU: every drafter runs all 20 prompts on the session engine
# (draft trees capped at its 16 nodes), and the costly settings (60-node trees, a model
# drafting token by token) run on the shortest prompts.
NEW_TOKENS = 16
Real = tuple[Any, list[list[int]], list[Any]]


@pytest.fixture(scope="module")
def real(engine: Any, spec_bench_prompts: list[str]) -> Real:
    """The session engine, the 20 prompts shortest first, and their greedy AR output."""
    prompts = sorted((engine.encode_prompt(p, chat=True) for p in spec_bench_prompts), key=len)
    ar = engine.generate(prompts, SamplingParams(max_new_tokens=NEW_TOKENS), drafter="none")
    assert isinstance(ar, list) and all(a.new_tokens > 0 for a in ar)
    return engine, prompts, ar


def _check(real: Real, drafter: str, options: dict[str, Any], n_prompts: int = 20,
           eng: Any = None, mode: str = "fixed") -> list[GenerationResult]:
    base, prompts, ar = real
    eng = eng or base
    got = eng.generate(prompts[:n_prompts], SamplingParams(max_new_tokens=NEW_TOKENS),
                       drafter=drafter, drafter_options=options, mode=mode)
    assert isinstance(got, list)
    bad = [i for i, (g, a) in enumerate(zip(got, ar, strict=False)) if g.token_ids != a.token_ids]
    assert not bad, f"{drafter} {options}: prompts {bad} differ from AR"
    return got


@pytest.mark.parametrize("drafter", ["recycling", "sam", "sam+recycling"])
def test_real_lossless_20_prompts(real: Real, drafter: str) -> None:
    got = _check(real, drafter, {})
    if drafter == "recycling":
        assert sum(sum(g.accept_lengths) - g.steps for g in got) > 0  # drafts accepted


def test_real_cost_aware_sam_recycling(real: Real) -> None:
    """Cost-aware sizing with per-context statistics (source x match length) on the real
    model: identical to AR, and the statistics really were kept per context."""
    eng = real[0]
    _check(real, "sam+recycling", {}, mode="adaptive")
    d = eng.drafter("sam+recycling")
    prior = eng.planner.priors[d.name]
    assert prior.contexts == d.contexts
    used = {row // N_STATES for row in np.flatnonzero(prior.reached.sum(axis=1))}
    assert len(used) >= 2  # recycling trees and automaton chains were counted apart


def test_real_full_size_trees(real: Real) -> None:
    """The 60- and 80-node templates, uncapped, on the 6 shortest prompts."""
    base = real[0]
    eng = Engine(base.model, base.tokenizer,
                 EngineConfig(max_batch_size=6, max_draft_nodes=80, max_len=256))
    _check(real, "recycling", {}, n_prompts=6, eng=eng)
    _check(real, "recycling", {"template": "tr80"}, n_prompts=6, eng=eng)
    _check(real, "sam+recycling", {}, n_prompts=6, eng=eng)


def test_real_sam_static_index(real: Real, tmp_path: Path) -> None:
    """A small corpus: alpaca-style texts plus the AR answers to some prompts, so that
    static drafts fire on those."""
    eng, _, ar = real
    texts = [
        "Give three tips for staying healthy.\n1. Eat a balanced diet and make sure to "
        "include plenty of fruits and vegetables.",
        "The capital of France is Paris. Paris is known for the Eiffel Tower.",
    ]
    docs = [eng.tokenizer.encode(t) for t in texts] + [a.token_ids for a in ar[:6:2]]
    path = tmp_path / "small.idx"
    StaticIndex.build(docs, int(eng.model.config.vocab_size), eng.tokenizer.fingerprint, path)
    got = _check(real, "sam", {"index": str(path)}, n_prompts=6)
    d = eng.drafter("sam", index=str(path))
    assert isinstance(d, SamDrafter) and d.source_counts[STATIC] > 0
    assert sum(g.steps for g in got[::2]) < sum(a.steps for a in ar[:6:2])
    _check(real, "sam+recycling", {"index": str(path), "tree": True}, n_prompts=6)


def test_real_draft_model_self_draft(real: Real) -> None:
    _check(real, "draft-model", {"layers": 8}, n_prompts=6)
    _check(real, "sam+draft-model", {"layers": 8}, n_prompts=6)


def test_real_self_draft_reads_the_target_cache(real: Real) -> None:
    """Through an engine the self-draft keeps no cache of its own: it feeds its tokens
    right after the target slot's committed entries (the same first layers computed
    them). Its drafts then match a self-draft that prefills a private cache from the
    same text; wrong positions or a stale slot would make them differ."""
    base, _, _ = real
    eng = Engine(base.model, base.tokenizer, EngineConfig(max_batch_size=3, max_len=512))
    d = eng.drafter("draft-model", layers=8)
    assert isinstance(d, DraftModelDrafter) and d.draft.shares_target_cache
    seen: list[tuple[list[int], list[int]]] = []
    orig = d.propose_batch

    def spy(rids: Any, max_nodes: Any) -> list[DraftTree]:
        out = orig(rids, max_nodes)
        seen.extend((list(d.draft._requests[r].text), t.tokens.tolist())
                    for r, t in zip(rids, out, strict=True))
        return out

    d.propose_batch = spy  # type: ignore[method-assign]
    for layout in ("ems", "vanilla"):  # vanilla: padded slots (holes in the prefix)
        with padded_layout(eng, layout) as pad:
            got = eng.generate(real[1][:3], SamplingParams(max_new_tokens=NEW_TOKENS),
                               drafter=d, mode="fixed")
        assert [g.token_ids for g in got] == [a.token_ids for a in real[2][:3]]
        assert (pad.kv_entries > 0) is (layout == "vanilla")
    assert d.draft._cache is None and len(seen) > 20
    ref = create_drafter("draft-model", model=base.model, layers=8, slots=1, max_len=512)
    assert isinstance(ref, DraftModelDrafter) and not ref.draft.shares_target_cache
    same = 0
    for k, (text, drafts) in enumerate(seen):
        ref.start(k, text)
        same += ref.propose(k, len(drafts)).tokens.tolist() == drafts
        ref.stop(k)
    assert same >= 0.9 * len(seen), f"{same} of {len(seen)} drafts match"


def test_real_full_depth_self_draft_is_accepted(real: Real) -> None:
    """Drafting with all layers reproduces the target: (nearly) every chain is accepted,
    which holds only if the drafter reads the target's cache at the right positions."""
    base = real[0]
    eng = Engine(base.model, base.tokenizer, EngineConfig(max_batch_size=2, max_len=256))
    got = _check(real, "draft-model", {"layers": int(base.model.config.num_layers)}, n_prompts=2,
                 eng=eng)
    steps = [n for g in got for n in g.accept_lengths[:-1]]  # the last step may be cut
    assert sum(n == 5 for n in steps) >= 0.8 * len(steps)
