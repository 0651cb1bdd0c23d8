"""Replay policies beyond a fixed drafter: cost-aware sizing and an oracle.

``AdaptivePolicy`` runs the engine's own ``DraftPlanner`` (the same acceptance
statistics, engine-wide prior, probing and cost-curve objective as adaptive sizing)
on a ``Request`` that the replay keeps in step with the AR answer; given the curve and
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

from recallspec.bench.methods import method_spec
from recallspec.bench.replay import (
    FixedPolicy,
    Known,
    Policy,
    ReplayConfig,
    accepted_nodes,
    drafter_view,
)
from recallspec.drafters.base import Drafter, create_drafter
from recallspec.engine.drafting import DraftPlanner
from recallspec.engine.request import Request, RequestStatus
from recallspec.errors import DataError
from recallspec.runtime.cost_curve import CostCurve
from recallspec.runtime.modes import EMS
from recallspec.spec.sampling import SamplingParams
from recallspec.spec.tree import DraftTree, limit_depth

ORACLE = "oracle"
ORACLE_DEFAULT = "pld+llma+sam"


class AdaptivePolicy:
    """Adaptive sizing: the engine's planner sizes the drafter's proposals."""

    def __init__(self, name: str, drafter: Drafter, planner: DraftPlanner,
                 max_new_tokens: int) -> None:
        self.name = name
        self.drafter = drafter
        self.planner = planner
        self.max_new_tokens = max_new_tokens
        self._reqs: dict[int, Request] = {}

    def start(self, rid: int, prompt: Sequence[int], first: int, known: Known | None = None,
              ) -> None:
        req = Request(rid, list(prompt), SamplingParams(max_new_tokens=self.max_new_tokens),
                      self.drafter, EMS, None, sizing="adaptive")
        req.status = RequestStatus.DECODING
        req.prefilled = len(req.prompt)
        self._reqs[rid] = req
        self.drafter.start(rid, list(prompt))
        req.generated.append(first)
        self.drafter.observe(rid, [first], *drafter_view(self.drafter, DraftTree.empty(), known))

    def draft(
        self, rid: int, room: int, want: int, future: Sequence[int], final_any: frozenset[int]
    ) -> DraftTree:
        trees, failed = self.planner.plan([self._reqs[rid]], [room])
        if failed:
            raise failed[0][1]
        return trees[0]

    def observe(
        self, rid: int, taken: Sequence[int], tree: DraftTree, accepted: Sequence[int],
        known: Known | None = None,
    ) -> None:
        req = self._reqs[rid]
        self.planner.observe(req, tree, accepted)  # the engine's order: sizing stats first
        req.generated.extend(taken)
        self.drafter.observe(rid, list(taken), *drafter_view(self.drafter, tree, known))

    def stop(self, rid: int) -> None:
        self._reqs.pop(rid, None)
        self.drafter.stop(rid)


class OraclePolicy:
    """Drafts exactly the longest accepted path any of ``drafters`` proposes, when
    ``(1 + n) / cost(1 + n)`` beats one token per ``cost(1)`` (see the module doc)."""

    def __init__(self, name: str, drafters: Sequence[Drafter],
                 cost: Callable[[int, int], float]) -> None:
        self.name = name
        self.drafters = list(drafters)
        self.cost = cost  # (rows, context) -> seconds
        self._ctx: dict[int, int] = {}

    def start(self, rid: int, prompt: Sequence[int], first: int, known: Known | None = None,
              ) -> None:
        self._ctx[rid] = len(prompt)
        for d in self.drafters:
            d.start(rid, list(prompt))
            d.observe(rid, [first], *drafter_view(d, DraftTree.empty(), known))

    def draft(
        self, rid: int, room: int, want: int, future: Sequence[int], final_any: frozenset[int]
    ) -> DraftTree:
        best: list[int] = []
        for d in self.drafters:
            tree = limit_depth(d.propose(rid, room).truncate(room), want)
            path = accepted_nodes(tree, future, final_any)
            if len(path) > len(best):
                best = [int(tree.tokens[i]) for i in path]
        ctx = self._ctx[rid]
        n = len(best)
        if n and (1 + n) / self.cost(1 + n, ctx) > 1 / self.cost(1, ctx):
            return DraftTree.chain(best)
        return DraftTree.empty()

    def observe(
        self, rid: int, taken: Sequence[int], tree: DraftTree, accepted: Sequence[int],
        known: Known | None = None,
    ) -> None:
        self._ctx[rid] += len(taken)
        for d in self.drafters:
            d.observe(rid, list(taken), *drafter_view(d, DraftTree.empty(), known))

    def stop(self, rid: int) -> None:
        self._ctx.pop(rid, None)
        for d in self.drafters:
            d.stop(rid)


@dataclass(frozen=True)
class PolicySpec:
    """A parsed method spec; ``build()`` gives one policy for a whole replayed run."""

    method: str  # as written
    build: Callable[[], Policy]
    approximate: bool  # a drafter learns from verification logits, which replay lacks


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
    if name == ORACLE:
        names = str(opts.pop("drafters", ORACLE_DEFAULT)).split("+")
        if opts:
            raise DataError(f"{method}: the oracle takes only drafters=a+b+...")
        probe = [create_drafter(n) for n in names]

        def oracle() -> Policy:
            return OraclePolicy(method, [create_drafter(n) for n in names],
                                lambda rows, ctx: curve(rows, 1, ctx) + step_overhead)

        return PolicySpec(method, oracle, any(d.needs_logits for d in probe))
    probe_d = create_drafter(name, **opts)

    if spec.sizing == "adaptive":  # (stated by method_spec; "none", i.e. ar, states fixed)
        def adaptive() -> Policy:
            planner = DraftPlanner(cfg.max_draft_nodes, lambda: curve)
            planner.step_overhead = step_overhead
            return AdaptivePolicy(method, create_drafter(name, **opts), planner,
                                  cfg.max_new_tokens)

        return PolicySpec(method, adaptive, probe_d.needs_logits)

    def fixed() -> Policy:
        return FixedPolicy(create_drafter(name, **opts), method)

    return PolicySpec(method, fixed, probe_d.needs_logits)
