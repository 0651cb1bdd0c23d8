"""Each decoding sequence's draft tree for a step: proposal and sizing.

The planner works on any ``StepSequence`` (an engine request, a transformers row, a
replayed answer; "request" below). Every request drafts with its own drafter, so one
step may mix drafters; requests sharing a drafter propose together
(``Drafter.propose_batch``). A tree is cut to the room left in the request's slot (and
``max_draft_nodes``) and to no more depth than the tokens still wanted
(``StepSequence.depth_limit``). With adaptive sizing (``StepSequence.sizing``) each
request's draft size, zero included, maximises the batch's expected tokens per second
from the cost curve and online acceptance statistics (``cost/sizing.py``): cheap
drafters are sized after proposing (the actual tree); drafters whose proposals cost a
model forward per draft position (``costly_proposals``) before it (a prospective
chain), so they are asked for nothing where drafting does not pay; so are drafters
whose proposals are slow (``SLOW_PROPOSAL_FRACTION``), pricing the proposal's time
once per request that drafts. A step that mixes
kinds places fixed-size drafts first, then sizes each presized drafter's requests, then
all cheap adaptive ones together, each counting the rows already placed; a step of one
kind is sized as one batch.

Grammars (``StepSequence.constraint``): after the drafts are sized, ``constrain`` cuts
the nodes a request's grammar forbids and appends the tokens it forces, then an adaptive
request keeps the prefix of those forced nodes that maximises the step's expected tokens
per second: a forced node's gain is its parent's times the rate at which forced tokens
have been accepted (``forced_rate``, learned from every verified one: the model may
tokenize forced bytes differently from the grammar's canonical choice). Plain decoding
(drafter "none") drafts nothing, forced tokens included.

Mixtures of experts (``experts``: the model's ``ExpertShape``): a forward's price
depends on the distinct experts its rows wake, so the measured curve is re-priced at the
routing the model's own verified forwards show (``observe_experts``; ``cost/experts.py``)
and drafts are sized on that price: where draft rows wake many fresh experts each, fewer
rows (or none) pay. A dense model's planner prices with the measured curve as it is.

Probing: an adaptive request that stopped drafting drafts 1 node every
``probe_wait[drafter]`` idle steps; each rejected probe doubles that drafter's wait (up
to PROBE_MAX, for all requests: a new request would otherwise pay, e.g., a draft
model's prompt prefill for a useless first probe), an accepted one resets it.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from recallspec.cost.curve import CostCurve
from recallspec.cost.experts import ExpertPricing, ExpertShape, RoutingEstimate
from recallspec.cost.sizing import AcceptanceStats, choose_draft_sizes, running_min
from recallspec.decoding.masks import Constrained
from recallspec.decoding.tree import DraftTree, limit_depth
from recallspec.drafters.base import Drafter
from recallspec.drafters.spec import NO_DRAFTER
from recallspec.errors import DataError
from recallspec.step.pricing import best_rate, price
from recallspec.step.sequence import StepSequence

PROBE_EVERY = 8
PROBE_MAX = 128
CONTEXT_STEP = 32  # cached tokens per step of the cost tables' context
OVERHEAD_WINDOW = 31  # decode steps the step overhead is the median of
# A drafter whose proposals take more than this fraction of a 1-row forward is sized
# before it proposes, on a prospective chain that pays for the proposal too (as drafters
# running a model per position are), so a request whose drafts do not pay is not asked to
# propose (probes aside). Why this low: `rest` over an Alpaca store, when its lookup was
# numpy (a large share of a forward), ran slower than plain decoding proposing every step
# for few accepted drafts; with lookups in the C core, `crest` (SQLite) and `rest` still
# took a few percent of a step, and under a 5% bar they proposed every step for few
# accepted drafts, again slower than plain decoding. SAM proposals cost well below it.
SLOW_PROPOSAL_FRACTION = 0.02
RESIZE_IDLE_EVERY = 4  # idle steps between re-sizings of a slow proposer's request
# Forced tokens' acceptance before any was verified, and the weight (in verified forced
# tokens) of that prior: a grammar's forced bytes are taken in its canonical tokenization,
# which greedy models nearly always choose too.
FORCED_PRIOR, FORCED_PRIOR_WEIGHT = 0.9, 8.0
FORCED_DECAY = 0.999  # per verified forced token: the rate follows the running workload

S = TypeVar("S", bound=StepSequence)
# A request's draft tree and, where ``_choose`` already priced it, its per-node gains
# (``AcceptanceStats.key_node_rates``, running minimum) in the context it was chosen in.
Proposal = tuple[int, DraftTree, list[float] | None]


class DraftPlanner:
    def __init__(
        self, max_draft_nodes: int, curve: Callable[[], CostCurve] | None = None,
        experts: ExpertShape | None = None,
    ) -> None:
        """``experts``: a mixture of experts' shape (its curve is priced at the routing
        its forwards show: ``observe_experts``); None: a dense model."""
        self.max_draft_nodes = max_draft_nodes
        # The cost curve, measured on first use; None: fixed sizing only (no cost model,
        # e.g. a transformers model).
        self._get_curve = curve
        self._experts = None if experts is None else ExpertPricing(experts)
        self._measured: CostCurve | None = None  # the curve ``_get_curve`` gave last
        self.priors: dict[str, AcceptanceStats] = {}  # per drafter: the engine-wide stats
        # A decode step's time outside its forward (drafting, verification, bookkeeping)
        # in the curve's seconds (``note_step``): the median of the last OVERHEAD_WINDOW
        # steps' (a mean let one stalled step - a page fault, another process - swing it
        # by an order of magnitude, and a large overhead makes rows look cheap: the planner then
        # over-drafted). It dilutes the cost of rows.
        self.step_overhead = 0.0
        self._extras: deque[float] = deque(maxlen=OVERHEAD_WINDOW)
        self.position_cost: dict[str, float] = {}  # costly drafters: seconds per position
        self.propose_cost: dict[str, float] = {}  # other drafters: seconds per proposal
        # Seconds the last ``plan`` spent in presized proposals (priced per position or
        # per proposal, so not part of the step overhead).
        self.presized_s = 0.0
        self.probe_wait: dict[str, int] = {}  # per drafter: idle steps before a probe
        self._cost_tables: dict[tuple[int, ...], list[float]] = {}
        self._priced_by: CostCurve | None = None  # the curve the tables are of
        # Forced tokens verified (their parent reached) and accepted, decayed.
        self._forced_seen = 0.0
        self._forced_taken = 0.0

    @property
    def forced_rate(self) -> float:
        """The estimated probability that a forced token is accepted once its parent is."""
        return ((self._forced_taken + FORCED_PRIOR_WEIGHT * FORCED_PRIOR)
                / (self._forced_seen + FORCED_PRIOR_WEIGHT))

    def _curve(self) -> CostCurve:
        if self._get_curve is None:
            raise DataError("adaptive draft sizing needs a cost curve, and this "
                                   "loop has none: use fixed sizing")
        measured = self._get_curve()
        if measured is not self._measured:
            # Another curve (a measured one replacing the prior of a background
            # measurement): the step overhead measured afresh in its seconds (the old
            # one's were another scale).
            self._measured = measured
            self._extras.clear()
            self.step_overhead = 0.0
        # A mixture of experts: at the routing its forwards showed (a dense model: as is).
        curve = measured if self._experts is None else self._experts.curve(measured)
        if curve is not self._priced_by:  # (another curve, or re-priced: its own tables)
            self._priced_by = curve
            self._cost_tables.clear()
        return curve

    @property
    def routing(self) -> RoutingEstimate | None:
        """A mixture of experts' routing estimate (None: dense, or no counted curve yet)."""
        return None if self._experts is None else self._experts.routing

    def observe_experts(self, rows: int, woken: float) -> None:
        """A verified forward of ``rows`` rows woke ``woken`` distinct experts per layer
        (a mixture of experts; ignored by a dense model's planner)."""
        if self._experts is not None:
            self._experts.observe(rows, woken)

    def _stats(self, req: StepSequence) -> AcceptanceStats:
        """The request's acceptance statistics (rows as its drafter's engine-wide prior)."""
        if req.draft.stats is None:
            req.draft.stats = AcceptanceStats(self.max_draft_nodes,
                                              contexts=self.prior(req.drafter).contexts)
        return req.draft.stats

    def prior(self, d: Drafter) -> AcceptanceStats:
        """Engine-wide acceptance statistics of a drafter (the prior of new requests)."""
        if d.name not in self.priors:
            self.priors[d.name] = AcceptanceStats(
                self.max_draft_nodes, decay=0.99, contexts=d.contexts)
        return self.priors[d.name]

    # ---- proposing ---------------------------------------------------------------
    def plan(
        self, decoding: Sequence[S], rooms: Sequence[int]
    ) -> tuple[list[DraftTree], list[tuple[S, Exception]]]:
        """Each request's tree (``rooms[i]``: nodes its slot has room for) and the
        requests whose drafter raised (their tree is empty; they must not be fed)."""
        trees: list[DraftTree | None] = [None] * len(decoding)
        failed: list[tuple[S, Exception]] = []
        self.presized_s = 0.0
        fixed: list[int] = []
        presize: list[int] = []
        post: list[int] = []
        for i, r in enumerate(decoding):
            adaptive = r.sizing == "adaptive"
            kind = post if adaptive else fixed
            if adaptive and (r.drafter.costly_proposals or self._slow(r.drafter)):
                kind = presize
            kind.append(i)
        placed = 0  # draft rows already placed by other groups
        for d, idx in _by_drafter(decoding, fixed):
            for i, tree in self._propose(d, decoding, idx, [rooms[i] for i in idx], failed):
                trees[i] = tree
                placed += len(tree)
        for d, idx in _by_drafter(decoding, presize):
            reqs = [decoding[i] for i in idx]
            chains = [np.arange(-1, rooms[i] - 1, dtype=np.int64) for i in idx]
            if d.costly_proposals:  # a forward of its own per draft position
                per_node = self.position_cost.get(d.name, 0.0) / len(idx)
                sizes = self._sizes(reqs, chains, len(decoding) + placed, node_cost=per_node)
            else:  # a slow lookup per request
                keep = [n for n, r in enumerate(reqs) if not self._stays_idle(r)]
                idx, reqs, chains = ([idx[n] for n in keep], [reqs[n] for n in keep],
                                     [chains[n] for n in keep])
                sizes = self._sizes(reqs, chains, len(decoding) + placed,
                                    proposal_cost=self.propose_cost[d.name]) if reqs else []
                idx = [i for i, k in zip(idx, sizes, strict=True) if k]
                sizes = [k for k in sizes if k]
            t0 = time.perf_counter()
            got = self._propose(d, decoding, idx, sizes, failed) if idx else []
            elapsed = time.perf_counter() - t0
            self.presized_s += elapsed
            positions = max((t.depth() for _, t in got), default=0)
            if d.costly_proposals and positions:
                old = self.position_cost.get(d.name, 0.0)
                self.position_cost[d.name] = 0.8 * old + 0.2 * elapsed / positions
            elif not d.costly_proposals and idx:
                self._note_propose_cost(d, elapsed / len(idx))
            for i, tree in got:
                trees[i] = tree
                placed += len(tree)
        proposed: list[Proposal] = []
        for d, idx in _by_drafter(decoding, post):
            if d.offers_candidates:
                proposed += self._choose(d, decoding, idx, rooms, failed)
                continue
            t0 = time.perf_counter()
            got = self._propose(d, decoding, idx, [rooms[i] for i in idx], failed)
            self._note_propose_cost(d, (time.perf_counter() - t0) / len(idx))
            proposed += [(i, tree, None) for i, tree in got]
        if proposed:
            reqs = [decoding[i] for i, _, _ in proposed]
            sizes = self._sizes(reqs, [t.parents for _, t, _ in proposed], len(decoding) + placed,
                                known=[g for _, _, g in proposed])
            for (i, tree, _), k in zip(proposed, sizes, strict=True):
                trees[i] = tree.truncate(k)
        return [DraftTree.empty() if t is None else t for t in trees], failed  # None: failed

    def _propose(
        self, d: Drafter, decoding: Sequence[S], idx: list[int], sizes: list[int],
        failed: list[tuple[S, Exception]],
    ) -> list[tuple[int, DraftTree]]:
        """(index, tree cut to its size and wanted depth) for each request of ``idx``
        whose proposal succeeded; the others go to ``failed``."""
        reqs = [decoding[i] for i in idx]
        try:
            got = d.propose_batch([r.rid for r in reqs], sizes)
        except Exception as e:  # one batched call: its requests fail together
            failed.extend((r, e) for r in reqs)
            return []
        out = []
        for i, r, k, tree in zip(idx, reqs, sizes, got, strict=True):
            if isinstance(tree, Exception):  # (the default propose_batch: this one only)
                failed.append((r, tree))
            else:
                out.append((i, limit_depth(tree.truncate(k), r.depth_limit)))
        return out

    def _slow(self, d: Drafter) -> bool:
        """Whether the drafter's proposals (as measured) take more than
        SLOW_PROPOSAL_FRACTION of a 1-row forward: it is then sized before proposing."""
        cost = self.propose_cost.get(d.name, 0.0)
        return (cost > 0.0 and not d.offers_candidates
                and cost > SLOW_PROPOSAL_FRACTION * self._curve()(1))

    def _stays_idle(self, req: StepSequence) -> bool:
        """Whether a request of a slow proposer that drafted nothing lately skips this
        step's sizing, drafting nothing again (counted as idle): re-sized every
        RESIZE_IDLE_EVERY idle steps and when a probe is due. Its statistics change only
        when it drafts, so its size would stay 0 but for the slow drift of the cost and
        overhead; sizing it costs a visible share of a small model's step."""
        ds = req.draft
        wait = self.probe_wait.get(req.drafter.name, PROBE_EVERY)
        if not ds.idle_steps or ds.idle_steps % RESIZE_IDLE_EVERY == 0 or (
                ds.idle_steps + 1 >= wait):
            return False
        ds.idle_steps += 1
        ds.probing = False
        return True

    def _note_propose_cost(self, d: Drafter, per_request: float) -> None:
        old = self.propose_cost.get(d.name, per_request)
        self.propose_cost[d.name] = 0.8 * old + 0.2 * per_request

    def _choose(
        self, d: Drafter, decoding: Sequence[S], idx: list[int], rooms: Sequence[int],
        failed: list[tuple[S, Exception]],
    ) -> list[Proposal]:
        """(index, tree, gains) for requests whose drafter offers ``candidates``: each
        request's candidate whose best size promises the most tokens per second, judged
        by the request's statistics in that candidate's context, which is left set
        (``_sizes`` then sizes it in the batch with these gains). Ties go to the
        drafter's first candidate."""
        out: list[Proposal] = []
        curve = self._curve()
        overhead = self.step_overhead
        for i in idx:
            req = decoding[i]
            try:
                cands = list(d.candidates(req.rid, rooms[i]))
            except Exception as e:
                failed.append((req, e))
                continue
            want = req.depth_limit
            st, prior = self._stats(req), self.prior(req.drafter)
            costs = self._cost_table(curve, 1, rooms[i], 1, cached_context([req]))
            best: tuple[float, int, DraftTree, list[float]] | None = None
            for ctx, tree in cands:
                tree = limit_depth(tree.truncate(rooms[i]), want)
                if not len(tree):
                    continue
                st.context = ctx
                parents = tree.parents.tolist()
                if len(parents) <= st.max_nodes:
                    gains, value = price(parents, st.key_rate_list(prior), costs, overhead)
                else:  # not from a planner-cut tree; node_rates' rule for the extra nodes
                    gains = running_min(st.key_node_rates(parents, prior))
                    value = best_rate(gains, costs, overhead)
                if best is None or value > best[0]:
                    best = (value, ctx, tree, gains)
            if best is None:
                # No draft: its context is never read (``AcceptanceStats.update`` ignores
                # an empty tree, and the next step sets one before sizing).
                out.append((i, DraftTree.empty(), []))
            else:
                st.context = best[1]
                out.append((i, best[2], best[3]))
        return out

    # ---- grammars -----------------------------------------------------------------
    def constrain(
        self, seqs: Sequence[S], trees: Sequence[DraftTree], rooms: Sequence[int],
    ) -> tuple[list[Constrained | None], list[tuple[S, Exception]]]:
        """Each constrained sequence's tree under its grammar (None: unconstrained), its
        forced nodes priced for adaptive sizing (the module docstring); and the sequences
        whose grammar raised (they must not be fed)."""
        out: list[Constrained | None] = []
        failed: list[tuple[S, Exception]] = []
        rows = len(seqs) + sum(len(t) for t in trees)  # the step's rows so far
        for s, tree, room in zip(seqs, trees, rooms, strict=True):
            if s.constraint is None:
                out.append(None)
                continue
            try:
                c = s.constraint.constrain(tree, room if s.drafter.name != NO_DRAFTER else 0,
                                           s.depth_limit)
                base = rows + c.drafted - len(tree)  # without what the grammar cut
                if c.forced and s.sizing == "adaptive" and self._get_curve is not None:
                    c = c.truncate(c.drafted + self._forced_size(s, c, base, seqs))
            except Exception as e:  # this request's grammar or pricing: it alone fails
                failed.append((s, e))
                out.append(None)
                rows -= 1 + len(tree)
                continue
            rows = base + c.forced
            out.append(c)
        return out, failed

    def _forced_size(self, s: StepSequence, c: Constrained, rows: int,
                     seqs: Sequence[StepSequence]) -> int:
        """How many of ``c``'s forced nodes to verify: the prefix maximising the step's
        expected tokens per second, the step holding ``rows`` rows without them. The
        other sequences' expected tokens count as one each (a lower bound, which makes
        the forced nodes' share of the step's tokens, and so their value, no smaller)."""
        par = c.tree.parents.tolist()
        gains = self._stats(s).key_node_rates(par[: c.drafted], self.prior(s.drafter)) \
            if c.drafted else []
        gains += [0.0] * c.forced
        rate = self.forced_rate
        for j in range(c.drafted, len(par)):
            p = par[j]
            gains[j] = rate * (1.0 if p < 0 else gains[p])
        table = self._cost_table(self._curve(), rows, c.forced, len(seqs), cached_context(seqs))
        extra = self.step_overhead
        tokens = len(seqs) + sum(gains[: c.drafted])
        best, best_m = tokens / (table[0] + extra), 0
        for m in range(1, c.forced + 1):
            tokens += gains[c.drafted + m - 1]
            value = tokens / (table[m] + extra)
            if value > best:
                best, best_m = value, m
        return best_m

    def observe_forced(self, c: Constrained, accepted_nodes: Sequence[int]) -> None:
        """Learn ``forced_rate`` from a verified tree: its forced nodes whose parent was
        reached (the root, or an accepted node), and which of them were accepted."""
        if not c.forced:
            return
        taken = set(accepted_nodes)
        par = c.tree.parents.tolist()
        for j in range(c.drafted, len(par)):
            if par[j] < 0 or par[j] in taken:
                self._forced_seen = self._forced_seen * FORCED_DECAY + 1.0
                self._forced_taken = self._forced_taken * FORCED_DECAY + (j in taken)

    # ---- adaptive sizing ---------------------------------------------------------
    def _sizes(
        self, reqs: Sequence[StepSequence], parents: Sequence[npt.NDArray[np.int64]],
        base_rows: int, node_cost: float = 0.0, proposal_cost: float = 0.0,
        known: Sequence[list[float] | None] | None = None,
    ) -> list[int]:
        """How many nodes of each request's (actual or prospective) draft tree
        ``parents`` to verify, maximising the batch's expected tokens per second.
        ``known[i]``: request i's gains as ``_choose`` computed them (its context set),
        else None."""
        curve = self._curve()
        gains: list[Sequence[float]] = []
        for n, (req, par) in enumerate(zip(reqs, parents, strict=True)):
            g = None if known is None else known[n]
            if g is None:
                st = self._stats(req)
                st.context = req.drafter.context(req.rid)
                # Only the request's current row is needed: computing every row of every
                # context (a hundred for the SAM drafters) each step cost more than the rest.
                g = st.key_node_rates(par.tolist(), self.prior(req.drafter))
            gains.append(g)
        # Rows cost more the longer the text they attend to: price them at the batch's
        # mean cached length (a 2,000-token context doubles a step's cost). Every row
        # count the scan may try is priced at once (per-call interpolation was a third
        # of the planner's time).
        # Rows priced in whole multiples of max_draft_nodes (entries are elementwise, so a
        # longer table has the same prefix): one table serves the step's every tree size,
        # and for one request it is the one ``_choose`` used.
        step = max(self.max_draft_nodes, 1)
        extra_rows = -(-sum(len(g) for g in gains) // step) * step
        table = self._cost_table(curve, base_rows, extra_rows, len(reqs), cached_context(reqs))
        extra = self.step_overhead
        sizes = choose_draft_sizes(
            gains, lambda n_rows, seqs: table[n_rows - base_rows] + extra,
            base_rows=base_rows, node_cost=node_cost, proposal_cost=proposal_cost,
        )
        for i, (req, par) in enumerate(zip(reqs, parents, strict=True)):
            # Probe now and then: a request that stopped drafting would otherwise never
            # learn that its drafts became good again.
            ds = req.draft
            ds.probing = False
            if sizes[i] == 0 and len(par):
                ds.idle_steps += 1
                if ds.idle_steps >= self.probe_wait.get(req.drafter.name, PROBE_EVERY):
                    sizes[i], ds.probing = 1, True
            if sizes[i]:
                ds.idle_steps = 0
        return sizes

    def _cost_table(
        self, curve: CostCurve, base_rows: int, extra_rows: int, seqs: int, context: int,
    ) -> list[float]:
        """Seconds of a forward of base_rows + [0, extra_rows] rows of ``seqs`` sequences
        at ``context`` cached tokens, kept per context rounded to CONTEXT_STEP tokens (a
        step's cost changes little over that many; numpy on small arrays is not free).
        A list (read one by one: numpy scalars cost more); callers must not change it."""
        ctx = context // CONTEXT_STEP * CONTEXT_STEP
        key = (base_rows, extra_rows, seqs, ctx)  # (of ``_priced_by``: ``_curve`` clears them)
        table = self._cost_tables.get(key)
        if table is None:
            if len(self._cost_tables) >= 4096:
                self._cost_tables.clear()
            rows = np.arange(base_rows, base_rows + extra_rows + 1, dtype=np.float64)
            table = self._cost_tables[key] = curve.costs(rows, seqs, ctx).tolist()
        return table

    # ---- learning from the step ----------------------------------------------------
    def observe(
        self, req: StepSequence, tree: DraftTree, accepted_nodes: Sequence[int]
    ) -> None:
        """After verification: update the request's and its drafter's statistics."""
        st = req.draft.stats
        if st is None:
            return
        key = st.key  # the row this draft was sized in
        name = req.drafter.name
        if req.draft.probing and len(tree):
            wait = self.probe_wait.get(name, PROBE_EVERY)
            self.probe_wait[name] = PROBE_EVERY if accepted_nodes else min(2 * wait, PROBE_MAX)
        st.update(tree.parents, accepted_nodes)
        self.prior(req.drafter).update(tree.parents, accepted_nodes, key=key)

    def note_step(
        self, decoding: Sequence[StepSequence], rows: int, elapsed: float, t_drafted: float,
        curve: CostCurve | None, t_forward: float,
    ) -> None:
        """A decode-only step took ``elapsed`` seconds for ``rows`` rows, ``t_forward`` of
        them in the forward: update the overhead beyond the curve (adaptive steps only).

        The overhead is the time outside the forward, in the curve's seconds (times
        curve / t_forward, within [0.5, 2]): the forward's own time follows the
        machine's speed (a shared VM drifts within minutes), which scales every
        price alike and so leaves the best draft size unchanged, while counting it as
        overhead made rows look cheap whenever the machine ran slower than when it was
        calibrated."""
        adaptive = [r for r in decoding if r.sizing == "adaptive"]
        if not adaptive or curve is None:
            return
        if curve is self._measured and self._priced_by is not None:
            curve = self._priced_by  # (as the step's drafts were priced)
        priced = curve(rows, len(decoding), cached_context(decoding))
        if t_forward > 0.0:
            # (Bounded: a curve more than 2x off is not drift but another machine's, or
            # a test's; the time outside the forward then counts about as measured.)
            extra = (elapsed - t_forward) * min(max(priced / t_forward, 0.5), 2.0)
        else:  # no forward time measured: everything beyond the curve counts
            extra = elapsed - priced
        if any(r.drafter.costly_proposals for r in adaptive):
            extra -= t_drafted  # priced per draft position instead
        else:
            extra -= self.presized_s  # slow proposals: priced per proposal instead
        self._extras.append(extra)
        self.step_overhead = max(statistics.median(self._extras), 0.0)


def cached_context(reqs: Sequence[StepSequence]) -> int:
    """Mean tokens cached per request before this step."""
    if not reqs:
        return 0
    return sum(r.cached_length for r in reqs) // len(reqs)


def _by_drafter(
    decoding: Sequence[StepSequence], idx: list[int]
) -> list[tuple[Drafter, list[int]]]:
    """``idx`` grouped by drafter instance, groups in order of first appearance."""
    if not idx:
        return []
    groups: dict[int, tuple[Drafter, list[int]]] = {}
    for i in idx:
        d = decoding[i].drafter
        groups.setdefault(id(d), (d, []))[1].append(i)
    return list(groups.values())
