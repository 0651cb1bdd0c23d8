"""Token Recycling: tree templates, the adjacency table, tree expansion, losslessness
(bigram test double; the real-model check is in test_drafters_sam.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from helpers import BigramModel, ByteTokenizer, sample_chain_counts, sampling_chain_case
from helpers.stats import chi2_pvalue

from recallspec.decoding.sampling import SamplingParams
from recallspec.decoding.tree import DraftTree
from recallspec.drafters import create_drafter
from recallspec.drafters.recycling import (
    TEMPLATES,
    TOPK,
    AdjacencyTable,
    RecyclingDrafter,
    TreeTemplate,
    get_template,
    path_value,
)
from recallspec.engine import Engine, EngineConfig, GenerationResult


def _paths(tpl: TreeTemplate) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    for p, r in zip(tpl.parents.tolist(), tpl.ranks.tolist(), strict=True):
        out.append((*(out[p] if p >= 0 else ()), r))
    return out


@pytest.mark.parametrize(("name", "nodes", "depth"), [("sam60", 60, 6), ("tr80", 80, 6)])
def test_template_shape(name: str, nodes: int, depth: int) -> None:
    tpl = get_template(name)
    assert len(tpl) == nodes and tpl.depth == depth
    par = tpl.parents
    assert np.all(par < np.arange(nodes)) and np.all(par >= -1)
    assert np.all((tpl.ranks >= 0) & (tpl.ranks < TOPK))
    paths = _paths(tpl)
    assert len(set(paths)) == nodes  # siblings have distinct ranks
    values = [path_value(p) for p in paths]
    assert values == sorted(values, reverse=True)  # best-first
    for d in range(1, depth + 1):  # by_depth partitions the nodes by depth
        assert [i for i, p in enumerate(paths) if len(p) == d] == tpl.by_depth[d - 1].tolist()
    # The greedy rule that chose the paths keeps each rank-0 chain: depth 1..6 of rank 0.
    assert all((0,) * d in set(paths) for d in range(1, depth + 1))


@pytest.mark.parametrize("name", ["sam60", "tr80"])
def test_template_prefix_is_best_subtree(name: str) -> None:
    """Every prefix [:m] is what growing a tree one best frontier node at a time (the
    optimum for path values that shrink along a path) picks from the template's paths."""
    paths = _paths(get_template(name))
    pool = set(paths)
    chosen: list[tuple[int, ...]] = []
    for _ in range(len(paths)):
        frontier = [p for p in pool - set(chosen) if len(p) == 1 or p[:-1] in chosen]
        chosen.append(max(frontier, key=lambda p: (path_value(p), -len(p))))
    for m in (1, 4, 8, 16, 30, len(paths)):
        assert [path_value(p) for p in chosen[:m]] == pytest.approx(
            [path_value(p) for p in paths[:m]])
    assert max(len(p) for p in paths[:16]) >= 4  # a 16-node budget is not a 2-level stub


def test_template_rejects_missing_prefix_and_bad_rank() -> None:
    with pytest.raises(ValueError, match="prefix"):
        TreeTemplate.from_paths([(0,), (1, 0, 0)])
    with pytest.raises(ValueError, match="ranks"):
        TreeTemplate.from_paths([(TOPK,)])
    with pytest.raises(ValueError, match="unknown template"):
        RecyclingDrafter(template="nope")
    assert set(TEMPLATES) == {"sam60", "tr80"}


def test_table_refresh_from_every_row() -> None:
    """After a verification, the row of every token in [root, *tree] is that row's top-k,
    for rejected nodes as much as for accepted ones."""
    d = RecyclingDrafter()
    v = 50
    g = torch.Generator().manual_seed(0)
    d.start(0, [3, 7])
    first = torch.randn(1, v, generator=g)
    d.observe(0, [11], DraftTree.empty(), first)
    assert d.table.rows is not None and d.table.rows.shape == (v, TOPK)
    assert d.table.rows[7].tolist() == torch.topk(first[0], TOPK).indices.tolist()
    tree = DraftTree.from_lists([20, 21, 22], [-1, -1, 0])
    logits = torch.randn(4, v, generator=g)
    d.observe(0, [20, 5], tree, logits)  # root 11, node 20 accepted, 21 and 22 rejected
    for row, tok in enumerate([11, 20, 21, 22]):
        assert d.table.rows[tok].tolist() == torch.topk(logits[row], TOPK).indices.tolist()
    assert np.all(d.table.rows[[0, 1, 2, 30]] == -1)  # never seen: unknown
    # The next proposal hangs below the last committed token (5, unknown yet).
    assert len(d.propose(0, 60)) == 0


def _reference_expand(rows: np.ndarray, root: int, tpl: TreeTemplate, max_nodes: int) -> DraftTree:
    """Per-node expansion: node kept iff its parent is kept and its table entry known."""
    tokens: list[int] = []
    parents: list[int] = []
    new_of: dict[int, int] = {}
    for i in range(min(len(tpl), max_nodes)):
        p = int(tpl.parents[i])
        if p >= 0 and p not in new_of:
            continue
        src = root if p < 0 else tokens[new_of[p]]
        t = int(rows[src, tpl.ranks[i]])
        if t < 0:
            continue
        new_of[i] = len(tokens)
        tokens.append(t)
        parents.append(-1 if p < 0 else new_of[p])
    return DraftTree.from_lists(tokens, parents)


@pytest.mark.parametrize("name", ["sam60", "tr80"])
def test_vectorised_expansion_matches_reference(name: str) -> None:
    tpl = get_template(name)
    rng = np.random.default_rng(0)
    v = 40
    for trial in range(30):
        table = AdjacencyTable()
        table.rows = np.stack([rng.permutation(v)[:TOPK] for _ in range(v)]).astype(np.int32)
        table.rows[rng.random(v) < trial / 40] = -1  # more and more unknown rows
        root = int(rng.integers(v))
        for max_nodes in (0, 1, 7, 26, 60, 100):
            got = table.expand(root, tpl, max_nodes)
            want = _reference_expand(table.rows, root, tpl, max_nodes)
            assert got.tokens.tolist() == want.tokens.tolist()
            assert got.parents.tolist() == want.parents.tolist()
            assert len(got) <= max_nodes
            for kids in got.children():  # siblings distinct
                assert len({int(got.tokens[k]) for k in kids}) == len(kids)


def test_full_table_gives_full_template() -> None:
    tpl = get_template("sam60")
    table = AdjacencyTable()
    v = 16
    table.rows = np.stack([(np.arange(TOPK) + i + 1) % v for i in range(v)]).astype(np.int32)
    tree = table.expand(0, tpl, 60)
    assert len(tree) == 60 and tree.depth() == 6
    assert tree.parents.tolist() == tpl.parents.tolist()
    assert tree.truncate(10).parents.tolist() == table.expand(0, tpl, 10).parents.tolist()


def make_engine(v: int = 256, seed: int = 0, **cfg: Any) -> Engine:
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(v, v, generator=g) * 3
    cfg.setdefault("mode", "fixed")  # named drafters at fixed sizes unless a test says
    return Engine(BigramModel(table), ByteTokenizer(), EngineConfig(**cfg))


PROMPTS = [b"abcabcabcab", b"hello hello hello", b"xyz", b"the cat sat on the mat; the cat"]


@pytest.mark.parametrize("template", ["sam60", "tr80"])
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_identical_to_ar_bigram(template: str, batch: int) -> None:
    eng = make_engine(max_draft_nodes=80, max_batch_size=batch)
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    prompts = [list(p) for p in PROMPTS]
    ar = eng.generate(prompts, params, drafter="none")
    sp = eng.generate(prompts, params, drafter="recycling", drafter_options={"template": template})
    assert isinstance(ar, list) and isinstance(sp, list)
    for a, s in zip(ar, sp, strict=True):
        assert s.token_ids == a.token_ids
        assert s.new_tokens == 1 + sum(s.accept_lengths)
    # A bigram model's table is exact once learnt: drafts are accepted.
    assert sum(sum(s.accept_lengths) for s in sp) > sum(s.steps for s in sp)


def test_table_stays_warm_across_requests() -> None:
    eng = make_engine(max_draft_nodes=60)
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    d = eng.drafter("recycling")
    assert isinstance(d, RecyclingDrafter)
    first = eng.generate(list(b"the cat"), params, drafter="recycling")
    assert d.table.rows is not None
    known = int((d.table.rows[:, 0] >= 0).sum())
    again = eng.generate(list(b"the cat"), params, drafter="recycling")
    assert isinstance(first, GenerationResult) and isinstance(again, GenerationResult)
    assert again.token_ids == first.token_ids
    assert again.steps < first.steps  # the second run drafts from the first one's table
    assert int((d.table.rows[:, 0] >= 0).sum()) >= known
    assert eng.drafter("recycling") is d


def test_sampling_distribution_recycling() -> None:
    """With temperature 1 the 3 generated tokens follow the bigram chain's exact
    distribution although recycling drafts trees (warm table, 60 nodes)."""
    table, prompt, keys, probs, _ = sampling_chain_case()
    eng = Engine(BigramModel(table), ByteTokenizer(),
                 EngineConfig(max_draft_nodes=60, mode="fixed"))
    n = 3000
    counts, drafted = sample_chain_counts(eng, prompt, keys, n, drafter="recycling")
    assert drafted > n // 2  # trees were really proposed and partly accepted
    assert chi2_pvalue(counts, probs, n) > 1e-3


def test_registry() -> None:
    d = create_drafter("recycling", template="tr80")
    assert isinstance(d, RecyclingDrafter) and d.needs_logits and len(d.template) == 80
