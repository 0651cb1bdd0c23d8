"""Replay policies beyond a fixed drafter: cost-aware sizing and an oracle.

``AdaptivePolicy`` runs the engine's own ``DraftPlanner`` (the same acceptance
statistics, engine-wide prior, probing and cost-curve objective as adaptive sizing)
through the engine's own step code (``step/core.py``); given the curve and
the step overhead it is deterministic, so its steps are the engine's up to timing
noise in the overhead the engine learns online (replay fixes it to the time model's).

``OraclePolicy`` is an upper bound for a set of drafters: each step it looks at the
tokens the step will commit, takes the proposal with the longest accepted path and
drafts exactly that path (or nothing, where even that does not pay). No real policy
can know the path; it shows how much the proposals are worth under perfect sizing.

``make_policy`` turns a method spec (``pld``, ``sam:max_tokens=32:mode=fixed``,
``oracle:drafters=pld+llma+sam``) into a factory of policies sharing one planner, as one
engine shares it across a run's questions. A drafter is sized as its spec says, else as
``cfg.sizing_default`` (what an unlabeled method meant where the answers were recorded:
cost-aware, or fixed in answers recorded before that was the default).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from recallspec.bench.common.method import method_spec
from recallspec.bench.replay.exact import FixedPolicy, Policy, ReplayConfig, accepted_nodes
from recallspec.cost.curve import CostCurve
from recallspec.decoding.tree import DraftTree, limit_depth
from recallspec.drafters.base import Drafter
from recallspec.drafters.registry import create_drafter
from recallspec.drafters.spec import DrafterSpec
from recallspec.errors import DataError
from recallspec.params import MAX_DRAFT_NODES
from recallspec.step.planner import DraftPlanner

ORACLE = "oracle"
ORACLE_DEFAULT = "pld+llma+sam"


class AdaptivePolicy(Policy):
    """Adaptive sizing: the engine's planner sizes the drafter's proposals."""

    def __init__(self, name: str, drafter: Drafter, planner: DraftPlanner) -> None:
        super().__init__(name, drafter, "adaptive", planner)


class OracleDrafter(Drafter):
    """Proposes exactly the longest accepted path any of ``drafters`` proposes, when
    ``(1 + n) / cost(1 + n)`` beats one token per ``cost(1)`` (see the module doc);
    ``OraclePolicy.foresee`` tells it the tokens each step will commit."""

    name = ORACLE

    def __init__(self, drafters: Sequence[Drafter], cost: Callable[[int, int], float]) -> None:
        self.drafters = list(drafters)
        self.needs_logits = any(d.needs_logits for d in self.drafters)
        self.cost = cost  # (rows, context) -> seconds
        self._ctx: dict[int, int] = {}
        self.future: Sequence[int] = ()
        self.final_any: frozenset[int] = frozenset()
        self.depth = 0

    def start(self, rid: int, prompt: Sequence[int]) -> None:
        self._ctx[rid] = len(prompt) - 1  # its first observe counts the prefill's token
        for d in self.drafters:
            d.start(rid, list(prompt))

    def propose(self, rid: int, max_nodes: int) -> DraftTree:
        best: list[int] = []
        for d in self.drafters:
            tree = limit_depth(d.propose(rid, max_nodes).truncate(max_nodes), self.depth)
            path = accepted_nodes(tree, self.future, self.final_any)
            if len(path) > len(best):
                best = [int(tree.tokens[i]) for i in path]
        ctx = self._ctx[rid]
        n = len(best)
        if n and (1 + n) / self.cost(1 + n, ctx) > 1 / self.cost(1, ctx):
            return DraftTree.chain(best)
        return DraftTree.empty()

    def observe(
        self, rid: int, accepted: Sequence[int], tree: DraftTree, logits: torch.Tensor | None,
    ) -> None:
        """Each drafter learns as if it had drafted nothing (it did not draft this tree);
        one that learns from logits gets the committed rows replay knows."""
        self._ctx[rid] += len(accepted)
        for d in self.drafters:
            if d.needs_logits and logits is not None:
                d.observe(rid, list(accepted), tree, logits)
            else:
                d.observe(rid, list(accepted), DraftTree.empty(), None)

    def stop(self, rid: int) -> None:
        self._ctx.pop(rid, None)
        for d in self.drafters:
            d.stop(rid)


class OraclePolicy(Policy):
    """The oracle's drafts, verified as proposed (the oracle sizes them itself)."""

    def __init__(self, name: str, drafters: Sequence[Drafter],
                 cost: Callable[[int, int], float]) -> None:
        self.oracle = OracleDrafter(drafters, cost)
        super().__init__(name, self.oracle, "fixed", DraftPlanner(MAX_DRAFT_NODES))

    def foresee(self, future: Sequence[int], final_any: frozenset[int], depth: int) -> None:
        self.oracle.future, self.oracle.final_any, self.oracle.depth = future, final_any, depth


@dataclass(frozen=True)
class PolicySpec:
    """A parsed method spec; ``build()`` gives one policy for a whole replayed run."""

    method: str  # as written
    build: Callable[[], Policy]
    approximate: bool  # a drafter learns from verification logits, which replay lacks


def oracle_drafters(method: str, spec: DrafterSpec) -> list[str]:
    """The drafter names of an oracle's spec (``drafters=a+b``, default ORACLE_DEFAULT);
    DataError for any other option."""
    opts = spec.kwargs
    names = str(opts.pop("drafters", ORACLE_DEFAULT)).split("+")
    if opts:
        raise DataError(f"{method}: the oracle takes only drafters=a+b+...")
    return names


def probe_drafters(method: str, spec: DrafterSpec) -> list[Drafter]:
    """Instances of the drafters ``method`` (parsed as ``spec``) builds, an oracle's each,
    to read their flags (``needs_logits``, ``costly_proposals``); a bad option raises here.
    (Building a drafter opens no index or datastore: they open at its first request.)"""
    if spec.name == ORACLE:
        return [create_drafter(n) for n in oracle_drafters(method, spec)]
    return [create_drafter(spec.name, **spec.kwargs)]


def make_policy(
    method: str, cfg: ReplayConfig, curve: CostCurve, step_overhead: float = 0.0,
    options: dict[str, object] | None = None,
) -> PolicySpec:
    """``name[:key=value...]``, sized cost-aware with the engine's planner over ``curve``
    (plus ``step_overhead`` seconds a step, as the engine learns it) where the spec says
    ``mode=adaptive`` or states no sizing and ``cfg.sizing_default`` is adaptive, else
    fixed; ``ar`` is no drafter; ``oracle:drafters=a+b``. ``options`` are added to the
    drafter's (e.g. a corpus index's fingerprint)."""
    spec = method_spec(method, cfg.sizing_default).with_options(options)
    name, opts = spec.name, spec.kwargs
    needs_logits = any(d.needs_logits for d in probe_drafters(method, spec))
    if name == ORACLE:
        names = oracle_drafters(method, spec)

        def oracle() -> Policy:
            return OraclePolicy(method, [create_drafter(n) for n in names],
                                lambda rows, ctx: curve(rows, 1, ctx) + step_overhead)

        return PolicySpec(method, oracle, needs_logits)

    if spec.sizing == "adaptive":  # (stated by method_spec; "none", i.e. ar, states fixed)
        def adaptive() -> Policy:
            planner = DraftPlanner(cfg.max_draft_nodes, lambda: curve)
            planner.step_overhead = step_overhead
            return AdaptivePolicy(method, create_drafter(name, **opts), planner)

        return PolicySpec(method, adaptive, needs_logits)

    def fixed() -> Policy:
        return FixedPolicy(create_drafter(name, **opts), method)

    return PolicySpec(method, fixed, needs_logits)
