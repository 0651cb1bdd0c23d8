"""Cost-aware draft sizing: how many draft nodes each sequence should verify this step.

Model. Drafting k nodes for sequence i is expected to commit ``1 + E_i(k)`` tokens,
where ``E_i(k) = sum_{j<k} r_i[j]`` and ``r_i[j]`` is the estimated probability that
node j of the drafter's proposal (in its own best-first order) is accepted. A forward
over T rows of B sequences costs ``cost(T, B)`` seconds (the calibrated curve).
Each step maximises the batch's expected committed tokens per second,

    (B + sum_i E_i(k_i)) / cost(base_rows + sum_i k_i, B),

over 0 <= k_i <= available_i. For a fixed total the best choice takes the largest
marginal gains; gains are made non-increasing along each proposal (a running minimum,
so a node is never chosen without its predecessors), hence sorting all candidate nodes
by gain and scanning every prefix finds the optimum, whatever the shape of the cost
curve (MKL's slow 2-3-row matmuls included). Ties go to fewer rows.

Online estimate. ``AcceptanceStats`` keeps, per node index, exponentially decayed counts
of "reached" (drafted while its parent was the root or accepted) and "accepted", so it
estimates each node's acceptance *given its parent's*; a node's rate is the product
along its path. Counts are conditioned on the outcome of the request's previous
verification (first node rejected / accepted part way / accepted to a leaf): retrieval
drafts are bimodal (inside a copied span nearly everything is accepted, after a miss
little is), and an unconditioned average under-drafts in spans.

Draft context. A drafter may also say *what kind* of draft it is about to make
(optional ``contexts`` / ``context(rid)``, ``drafters/base.py``): for the SAM drafters
the draft's source (dynamic / static automaton, auxiliary) and a bucket of its match
length, since a 20-token match predicts its continuation far better than a 2-token one.
Counts are kept per (context, outcome) pair, the row ``key = context * N_STATES +
state``; a drafter without contexts has one.

Exploration. An index that is never drafted would keep whatever estimate it had when
drafting stopped, and a low one would never be revised. So each index is shrunk toward
the pooled rate of all deeper indices of the same state (one pseudo-observation), and a
request's estimate is shrunk toward the engine-wide one of the same drafter
(``prior_weight`` pseudo-observations): a new request starts from what the drafter
achieved so far and adapts quickly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

# A request's sizing policy ("adaptive" | "fixed") and its default are defined once, in
# the import-free ``params.py`` (a drafter spec parses without numpy); re-exported here,
# where the sizing is implemented.
from recallspec.params import DEFAULT_SIZING as DEFAULT_SIZING
from recallspec.params import SIZINGS as SIZINGS
from recallspec.params import Sizing as Sizing


def draft_room(max_len: int, cached: int, max_draft_nodes: int) -> int:
    """Draft nodes a sequence may verify this step: its KV slot of ``max_len`` positions
    holds ``cached`` tokens and must also take the step's root row; at most
    ``max_draft_nodes`` (``params.MAX_DRAFT_NODES`` by default), never negative. The
    engine's step and the benchmarks' replay both size rooms with this."""
    return max(min(max_len - cached - 1, max_draft_nodes), 0)

# Outcome of a request's previous verification: the state acceptance is conditioned on.
MISS, PARTIAL, FULL = 0, 1, 2
N_STATES = 3


@dataclass
class AcceptanceStats:
    """Decayed per-row, per-node-index counts of reached and accepted draft nodes, one
    row per (draft context, previous outcome) pair.

    The counts change only through ``update``, which bumps the row's version:
    ``key_rate_list`` keeps each row's conditional rates until its own or the prior's
    row changes (the planner asks for the same few rows step after step)."""

    max_nodes: int
    decay: float = 0.95  # weight of the past per update (~20-step memory per row)
    contexts: int = 1  # draft contexts the drafter distinguishes
    state: int = PARTIAL  # the previous verification's outcome (new requests: PARTIAL)
    context: int = 0  # the context of the draft being sized (set before each step)
    reached: npt.NDArray[np.float64] = field(init=False)  # [contexts * N_STATES, max_nodes]
    accepted: npt.NDArray[np.float64] = field(init=False)  # [contexts * N_STATES, max_nodes]
    # [contexts * N_STATES]: updates of each row so far (what the memo below is keyed by)
    _versions: list[int] = field(init=False, repr=False, compare=False)
    # row -> (its version, the prior, the prior row's version, key_rates(prior) as a list)
    _rates: dict[int, tuple[int, AcceptanceStats | None, int, list[float]]] = field(
        init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.contexts < 1:
            raise ValueError("contexts must be >= 1")
        self.reached = np.zeros((self.contexts * N_STATES, self.max_nodes))
        self.accepted = np.zeros((self.contexts * N_STATES, self.max_nodes))
        self._versions = [0] * (self.contexts * N_STATES)
        self._rates = {}

    @property
    def key(self) -> int:
        """The row of the current (context, state) pair."""
        if not 0 <= self.context < self.contexts:
            raise ValueError(f"draft context {self.context} outside [0, {self.contexts})")
        return self.context * N_STATES + self.state

    def update(
        self, parents: Sequence[int] | npt.NDArray[np.int64], accepted_nodes: Sequence[int],
        *, key: int | None = None,
    ) -> None:
        """Record one verification of a draft tree (``parents``, -1 = root) of which
        ``accepted_nodes`` were accepted (a path from the root).

        ``key``: the row the draft was made in; by default this request's own ``key``,
        whose state then moves to the outcome (a shared prior passes the request's key
        and keeps no state of its own). A step without a draft changes nothing."""
        par = parents.tolist() if isinstance(parents, np.ndarray) else [int(p) for p in parents]
        if not par:
            return
        s = self.key if key is None else key
        acc = set(accepted_nodes)
        self._versions[s] += 1
        reached, accepted = self.reached[s], self.accepted[s]  # views of the row
        reached *= self.decay
        accepted *= self.decay
        for j, p in enumerate(par[: self.max_nodes]):
            if p < 0 or p in acc:
                reached[j] = float(reached[j]) + 1.0  # Python floats: numpy scalars cost more
                if j in acc:
                    accepted[j] = float(accepted[j]) + 1.0
        if key is None:
            last = max(acc, default=-1)
            leaf = last >= 0 and last not in par  # no drafted child below the path's end
            self.state = MISS if last < 0 else FULL if leaf else PARTIAL

    def conditional_rates(
        self, prior: npt.NDArray[np.float64] | None = None, prior_weight: float = 4.0,
        default: float = 0.5, rows: Sequence[int] | None = None,
    ) -> npt.NDArray[np.float64]:
        """[rows, max_nodes] estimated P(node j accepted | its parent accepted), rows as
        ``key`` (``rows``: only those rows, in that order; a step needs one).

        Without ``prior``, index 0 shrinks toward ``default`` and deeper indices toward
        the pooled rate of all deeper indices of the row (itself shrunk toward
        ``default``; one pseudo-observation each).
        ``prior`` (the engine-wide stats' ``conditional_rates()``, the same rows) replaces
        that target and counts as ``prior_weight`` observations."""
        acc, reach = self.accepted, self.reached
        if rows is not None:
            acc, reach = acc[list(rows)], reach[list(rows)]
        if prior is None:
            deep_num = acc[:, 1:].sum(axis=1)
            deep_den = reach[:, 1:].sum(axis=1)
            pooled = (deep_num + default) / (deep_den + 1.0)  # never exactly 0: explore
            target = np.empty_like(reach)
            target[:, 0] = default
            target[:, 1:] = pooled[:, None]
            weight = 1.0
        else:
            target, weight = prior, prior_weight
        r = (acc + weight * target) / (reach + weight)
        return np.clip(r, 0.0, 1.0)

    def key_rates(self, prior: AcceptanceStats | None = None, prior_weight: float = 4.0,
                  default: float = 0.5) -> npt.NDArray[np.float64]:
        """[max_nodes] ``conditional_rates(prior.conditional_rates())[key]``: the current
        row alone (what a step needs; the whole matrix cost more than the rest of the
        planner), shrunk toward ``prior``'s same row when given."""
        k = self.key
        if prior is None:
            return _row_rates(self.accepted[k], self.reached[k], None, 1.0, default)
        target = _row_rates(prior.accepted[k], prior.reached[k], None, 1.0, default)
        return _row_rates(self.accepted[k], self.reached[k], target, prior_weight, default)

    def node_rates(
        self, parents: npt.NDArray[np.int64], conditional: npt.NDArray[np.float64],
    ) -> npt.NDArray[np.float64]:
        """[len(parents)] estimated acceptance probability of each node of a draft tree in
        the current row (``key``): the product of conditional rates along its path.
        ``conditional``: all rows (``conditional_rates()``) or the key's row alone."""
        c = conditional if conditional.ndim == 1 else conditional[self.key]
        par = parents.tolist()[: self.max_nodes]
        if par == list(range(-1, len(par) - 1)):  # a chain: running products
            return np.asarray(np.cumprod(c[: len(par)]), np.float64)
        r = np.zeros(len(parents))
        for j, p in enumerate(par):
            r[j] = c[j] * (1.0 if p < 0 else r[p])
        return r

    def key_rate_list(self, prior: AcceptanceStats | None = None) -> list[float]:
        """``key_rates(prior)`` as a list, memoised per row (see the class docstring);
        the caller must not change it."""
        k = self.key
        prior_version = -1 if prior is None else prior._versions[k]
        memo = self._rates.get(k)
        if (memo is not None and memo[0] == self._versions[k] and memo[1] is prior
                and memo[2] == prior_version):
            return memo[3]
        c = self.key_rates(prior).tolist()
        self._rates[k] = (self._versions[k], prior, prior_version, c)
        return c

    def key_node_rates(
        self, parents: Sequence[int], prior: AcceptanceStats | None = None,
    ) -> list[float]:
        """``node_rates(parents, key_rates(prior))`` as a list, equal bit for bit (the
        same IEEE products in the same order; a chain's running product is numpy's
        ``cumprod``), without numpy's per-call cost on a few nodes: the planner
        evaluates every candidate draft with it each step."""
        c = self.key_rate_list(prior)
        n = min(len(parents), self.max_nodes)
        r = [0.0] * len(parents)
        for j in range(n):
            p = parents[j]
            r[j] = c[j] if p < 0 else c[j] * r[p]
        if len(parents) > n and list(parents[:n]) == list(range(-1, n - 1)):
            del r[n:]  # as node_rates: a chain longer than max_nodes gets max_nodes rates
        return r


def running_min(xs: Sequence[float] | npt.NDArray[np.float64]) -> list[float]:
    """``np.minimum.accumulate(xs)`` as a list of floats (exact: min picks an element;
    a NaN propagates, as numpy's)."""
    out: list[float] = []
    m = float("inf")
    for x in xs:
        x = float(x)
        if not x >= m and m == m:  # x < m, or x is NaN (m == m: m is not NaN yet)
            m = x
        out.append(m)
    return out


def _row_rates(
    acc: npt.NDArray[np.float64], reach: npt.NDArray[np.float64],
    target: npt.NDArray[np.float64] | None, weight: float, default: float,
) -> npt.NDArray[np.float64]:
    """One row of ``conditional_rates`` (same shrinkage), without the matrix overhead."""
    # acc <= reach and 0 <= target <= 1, so the rate is in [0, 1] up to rounding.
    if target is not None:
        return np.minimum((acc + weight * target) / (reach + weight), 1.0)
    # The target is ``default`` at index 0, else the pooled rate: the same IEEE operations
    # as on a filled target array, index 0 in Python (fewer numpy calls on 16 values).
    pooled = (float(np.add.reduce(acc[1:])) + default) / (float(np.add.reduce(reach[1:])) + 1.0)
    r = (acc + weight * pooled) / (reach + weight)
    r[0] = (float(acc[0]) + weight * default) / (float(reach[0]) + weight)
    return np.minimum(r, 1.0, out=r)


def choose_draft_sizes(
    gains: Sequence[Sequence[float] | npt.NDArray[np.float64]],
    cost: Callable[[int, int], float],
    *,
    base_rows: int,
    base_tokens: float | None = None,
    node_cost: float = 0.0,
    proposal_cost: float = 0.0,
) -> list[int]:
    """Draft nodes per sequence that maximise expected committed tokens per second.

    ``gains[i][j]``: expected accepted tokens from node j of sequence i's proposal
    (its length is what the drafter offers). ``base_rows``: rows the forward has anyway
    (one root per sequence, plus any prefill rows). ``base_tokens``: tokens committed
    without drafts (default: one per sequence). ``cost(rows, seqs)``: seconds.
    ``node_cost``: seconds to propose each drafted node (drafters that run a model per
    draft position; 0 when the proposal is already made). ``proposal_cost``: seconds to
    propose at all, paid once by each sequence that drafts (drafters whose lookup is
    slow; 0 when the proposal is already made).
    """
    nseq = len(gains)
    if nseq == 0:
        return []
    tokens0 = float(nseq if base_tokens is None else base_tokens)
    if nseq == 1:
        # One sequence: its running minimum is already in the order the sort below gives
        # (gain descending, ties by node), unless it holds a NaN (unordered).
        run = running_min(gains[0])
        if not run or run[-1] == run[-1]:
            return [_best_prefix(run, [0] * len(run), cost, base_rows, 1, tokens0, node_cost,
                                 proposal_cost)]
    cand: list[tuple[float, int, int]] = []  # (-gain, seq, node)
    for i, g in enumerate(gains):
        cand.extend((-x, i, j) for j, x in enumerate(running_min(g)))
    cand.sort()
    best_n = _best_prefix([-neg for neg, _, _ in cand], [i for _, i, _ in cand], cost,
                          base_rows, nseq, tokens0, node_cost, proposal_cost)
    sizes = [0] * nseq
    for _, i, _ in cand[:best_n]:
        sizes[i] += 1
    return sizes


def _best_prefix(
    ordered: Sequence[float], seqs: Sequence[int], cost: Callable[[int, int], float],
    base_rows: int, nseq: int, tokens0: float, node_cost: float, proposal_cost: float,
) -> int:
    """How many of the best-first node gains ``ordered`` (of sequences ``seqs``) to
    draft (``choose_draft_sizes``; ties go to fewer rows)."""
    best_val = tokens0 / cost(base_rows, nseq)
    best_n = 0
    tokens = tokens0
    proposing: set[int] = set()
    for n, (gain, seq) in enumerate(zip(ordered, seqs, strict=True), start=1):
        if gain <= 0.0:
            break
        tokens += gain
        proposing.add(seq)
        val = tokens / (cost(base_rows + n, nseq) + n * node_cost
                        + len(proposing) * proposal_cost)
        if val > best_val * (1 + 1e-9):
            best_val, best_n = val, n
    return best_n
