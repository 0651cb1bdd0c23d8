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

Online estimate. ``AcceptanceStats`` keeps, per node index, an exponentially decayed
count of "drafted" and "accepted". A sequence's rates blend its own counts with the
engine-wide counts of the same drafter (a prior worth ``prior_weight`` observations),
so a new request starts from what the drafter achieved so far and adapts quickly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt


@dataclass
class AcceptanceStats:
    """Decayed per-node-index counts of drafted and accepted draft nodes."""

    max_nodes: int
    decay: float = 0.95  # weight of the past per update (~20-step memory)
    drafted: npt.NDArray[np.float64] = field(init=False)  # [max_nodes]
    accepted: npt.NDArray[np.float64] = field(init=False)  # [max_nodes]

    def __post_init__(self) -> None:
        self.drafted = np.zeros(self.max_nodes)
        self.accepted = np.zeros(self.max_nodes)

    def update(self, n_drafted: int, accepted_nodes: Sequence[int]) -> None:
        """Record one verification: nodes 0..n_drafted-1 were drafted, these accepted."""
        if n_drafted <= 0:
            return
        n = min(n_drafted, self.max_nodes)
        self.drafted *= self.decay
        self.accepted *= self.decay
        self.drafted[:n] += 1.0
        acc = [a for a in accepted_nodes if a < n]
        if acc:
            self.accepted[np.asarray(acc, dtype=np.int64)] += 1.0

    def rates(
        self, prior: npt.NDArray[np.float64] | None = None, prior_weight: float = 4.0,
        default: float = 0.5,
    ) -> npt.NDArray[np.float64]:
        """[max_nodes] estimated acceptance probability of each node index; ``prior``
        (another stats' ``rates()``) counts as ``prior_weight`` observations."""
        num = self.accepted.copy()
        den = self.drafted.copy()
        if prior is not None:
            num += prior_weight * prior
            den += prior_weight
        with np.errstate(invalid="ignore", divide="ignore"):
            r = np.where(den > 0, num / np.maximum(den, 1e-12), default)
        return np.clip(r, 0.0, 1.0)


def choose_draft_sizes(
    gains: Sequence[npt.NDArray[np.float64]],
    cost: Callable[[int, int], float],
    *,
    base_rows: int,
    base_tokens: float | None = None,
) -> list[int]:
    """Draft nodes per sequence that maximise expected committed tokens per second.

    ``gains[i][j]``: expected accepted tokens from node j of sequence i's proposal
    (its length is what the drafter offers). ``base_rows``: rows the forward has anyway
    (one root per sequence, plus any prefill rows). ``base_tokens``: tokens committed
    without drafts (default: one per sequence). ``cost(rows, seqs)``: seconds.
    """
    nseq = len(gains)
    if nseq == 0:
        return []
    tokens0 = float(nseq if base_tokens is None else base_tokens)
    cand: list[tuple[float, int, int]] = []  # (-gain, seq, node)
    for i, g in enumerate(gains):
        run = np.minimum.accumulate(np.asarray(g, dtype=np.float64)) if len(g) else g
        cand.extend((-float(x), i, j) for j, x in enumerate(run))
    cand.sort()
    best_val = tokens0 / cost(base_rows, nseq)
    best_n = 0
    tokens = tokens0
    for n, (neg, _, _) in enumerate(cand, start=1):
        if -neg <= 0.0:
            break
        tokens += -neg
        val = tokens / cost(base_rows + n, nseq)
        if val > best_val * (1 + 1e-9):
            best_val, best_n = val, n
    sizes = [0] * nseq
    for _, i, _ in cand[:best_n]:
        sizes[i] += 1
    return sizes
