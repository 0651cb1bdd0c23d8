"""The step core and the planner under a grammar, on a toy constraint (no grammar
engine): cut nodes never reach the verifier, forced nodes follow the drafter's, the
masks stay aligned with the nodes when adaptive sizing drops forced nodes, the drafter's
statistics learn from its own tree as sized, and the forced rate from forced nodes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recallspec.cost.curve import CostCurve
from recallspec.decoding.masks import Constrained, allowed, words
from recallspec.decoding.tree import DraftTree
from recallspec.decoding.verify import Verdict
from recallspec.drafters import Drafter
from recallspec.params import Sizing
from recallspec.step.core import Verified, speculative_step
from recallspec.step.planner import FORCED_PRIOR, DraftPlanner
from recallspec.step.sequence import Constraint, DraftState

V = 40


def row(tokens: Sequence[int]) -> np.ndarray:
    m = np.zeros(words(V), np.int32)
    for t in tokens:
        m.view(np.uint32)[t >> 5] |= np.uint32(1 << (t & 31))
    return m


class Even:
    """Allows even tokens only; after a token t >= 30 the grammar forces 2, 4, 6 (a
    chain of ``forced`` tokens), and those are allowed alone. A toy ``Constraint``."""

    def __init__(self, forced: int = 3) -> None:
        self.forced = forced
        self.committed: list[int] = []

    def _mask(self, path: Sequence[int]) -> tuple[np.ndarray, list[int]]:
        last = ([*self.committed, *path] or [0])[-1]
        if last >= 30:
            chain = [2, 4, 6][: self.forced]
            return row(chain[:1]), chain
        if last in (2, 4) and path and len(path) >= 1:
            nxt = {2: 4, 4: 6}[last]
            return row([nxt]), [nxt]
        return row(range(0, V, 2)), []

    def constrain(self, tree: DraftTree, room: int, depth_limit: int) -> Constrained:
        toks, par = tree.tokens.tolist(), tree.parents.tolist()
        root, root_chain = self._mask([])
        if room <= 0 or depth_limit <= 0:
            return Constrained(DraftTree.empty(), root[None], 0, 0)
        keep: list[int] = []
        paths: dict[int, list[int]] = {-1: []}
        cut = 0
        for i, (t, p) in enumerate(zip(toks, par, strict=True)):
            if len(keep) >= room:
                continue
            if p not in paths or not allowed(self._mask(paths[p])[0], t):
                cut += 1  # forbidden, or below a forbidden node
                continue
            paths[i] = [*paths[p], t]
            keep.append(i)
        new = {old: j for j, old in enumerate(keep)}
        out_t = [toks[i] for i in keep]
        out_p = [-1 if par[i] < 0 else new[par[i]] for i in keep]
        masks = [root] + [self._mask(paths[i])[0] for i in keep]
        if not keep:  # the forced chain below the root
            for j, t in enumerate(root_chain[:room]):
                out_t.append(t)
                out_p.append(j - 1)
                masks.append(self._mask(root_chain[: j + 1])[0])
        return Constrained(DraftTree.from_lists(out_t, out_p), np.stack(masks), len(keep), cut,
                           tuple(keep))

    def advance(self, tokens: list[int]) -> None:
        self.committed += tokens


class Fixed(Drafter):
    name = "fixed-tree"

    def __init__(self, tree: DraftTree) -> None:
        self.tree = tree
        self.observed: list[list[int]] = []

    def start(self, rid: int, prompt: Sequence[int]) -> None: ...

    def propose(self, rid: int, max_nodes: int) -> DraftTree:
        return self.tree.truncate(max_nodes)

    def observe(self, rid: int, tokens: list[int], *a: Any) -> None:
        self.observed.append(tokens)

    def stop(self, rid: int) -> None: ...


@dataclass
class Seq:
    drafter: Drafter
    constraint: Constraint | None
    sizing: Sizing = "fixed"
    rid: int = 0
    draft: DraftState = field(default_factory=DraftState)
    depth_limit: int = 100
    cached_length: int = 50


class AcceptAll:
    """Accepts the first child at every node it reaches (checking each verified node is
    one its parent's mask allows), the bonus token 0."""

    def __init__(self) -> None:
        self.seen: list[tuple[DraftTree, np.ndarray | None]] = []

    def verify(self, seqs: Sequence[Seq], trees: Sequence[DraftTree],
               masks: Sequence[np.ndarray | None]) -> tuple[list[Verified[Seq]], list[Any]]:
        out = []
        for s, t, m in zip(seqs, trees, masks, strict=True):
            self.seen.append((t, m))
            assert m is None or len(m) == len(t) + 1
            kids = t.children()
            node, path = -1, []
            while kids[node + 1]:
                c = kids[node + 1][0]
                assert m is None or allowed(m[node + 1], int(t.tokens[c]))
                path.append(c)
                node = c
            out.append(Verified(s, t, Verdict(tuple(path), (*(int(t.tokens[i]) for i in path), 0))))
        return out, []


def test_cut_nodes_are_never_verified_and_the_drafter_sees_its_tree() -> None:
    # Root children 2 (allowed), 3 (forbidden: its subtree 3 -> 4 goes too), 4 below 2.
    d = Fixed(DraftTree.from_lists([2, 3, 4, 8], [-1, -1, 0, 1]))
    c = Even()
    seq = Seq(d, c)
    v = AcceptAll()
    out = speculative_step(DraftPlanner(8), [seq], [8], v, lambda s, t: t)
    tree, masks = v.seen[0]
    assert tree.tokens.tolist() == [2, 4] and tree.parents.tolist() == [-1, 0]
    assert masks is not None and len(masks) == 3
    com = out.committed[0]
    assert com.cut == 2 and com.drafted == 2 and com.forced_accepted == 0
    assert c.committed == []  # the caller's commit advances the grammar, not the core
    assert d.observed == [[2, 4, 0]]


def test_forced_chain_below_the_root_and_adaptive_truncation_keeps_masks_aligned() -> None:
    c = Even()
    c.committed = [31]  # forces 2, 4, 6
    d = Fixed(DraftTree.from_lists([5], [-1]))  # forbidden: cut, the root gets the chain
    planner = DraftPlanner(8, lambda: CostCurve((1, 2, 4), (1.0, 1.0, 1.0), 0.0))
    seq = Seq(d, c, sizing="adaptive")
    trees, failed = planner.plan([seq], [8])
    assert not failed
    got, bad = planner.constrain([seq], trees, [8])
    assert not bad and got[0] is not None
    assert got[0].tree.tokens.tolist() == [2, 4, 6] and got[0].drafted == 0
    # Rows free of cost: every forced node pays. Rows dear: none does; and the
    # truncated tree keeps one mask per remaining node.
    dear = DraftPlanner(8, lambda: CostCurve((1, 2, 4), (1.0, 3.0, 9.0), 0.0))
    seq2 = Seq(d, Even(), sizing="adaptive")
    seq2.constraint.committed = [31]  # type: ignore[union-attr]
    trees2, _ = dear.plan([seq2], [8])
    got2, _ = dear.constrain([seq2], trees2, [8])
    assert got2[0] is not None and len(got2[0].tree) == 0 and len(got2[0].masks) == 1
    trunc = got[0].truncate(2)
    assert trunc.tree.tokens.tolist() == [2, 4] and len(trunc.masks) == 3
    assert np.array_equal(trunc.masks, got[0].masks[:3])


def test_forced_rate_learns_from_reached_forced_nodes() -> None:
    planner = DraftPlanner(8)
    assert planner.forced_rate == FORCED_PRIOR
    c = Constrained(DraftTree.from_lists([2, 4, 6], [-1, 0, 1]), np.stack([row([2])] * 4),
                    0, 0)
    for _ in range(40):
        planner.observe_forced(c, (0, 1, 2))  # all three accepted
    high = planner.forced_rate
    for _ in range(40):
        planner.observe_forced(c, ())  # the first rejected; the others never reached
    assert high > 0.95 and planner.forced_rate < high
    assert planner._forced_seen < 40 * 3 + 40 + 1  # unreached nodes are not counted


def test_plain_decoding_drafts_nothing_under_a_grammar() -> None:
    from recallspec.drafters.lookup import NoDrafter

    c = Even()
    c.committed = [31]
    v = AcceptAll()
    speculative_step(DraftPlanner(8), [Seq(NoDrafter(), c)], [8], v, lambda s, t: t)
    assert len(v.seen[0][0]) == 0 and len(v.seen[0][1]) == 1  # the root's mask only
