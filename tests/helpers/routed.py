"""Bigram test doubles posing as a mixture of experts run by the native forward: each row
chooses one expert, its token's id mod ``experts``, in every layer a call runs, and the
model's ``native`` keeps the last call's counts as ``NativeModel.last_experts`` does
(whatever called it). What a forward woke is thus known from its tokens alone: the
tests compute it independently of the counters."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from helpers import BigramModel
from helpers.calibration import Cost, TimedBigram

from recallspec.runtime.batch import BatchMetadata
from recallspec.runtime.kv_cache import KVCache

EXPERTS, LAYERS = 64, 2
EXPERT_BYTES = 100  # one expert's matrices in one layer
EMBED_BYTES = HEAD_BYTES = 1000


def woken(tokens: list[int], experts: int = EXPERTS) -> int:
    """Distinct experts per layer rows of these tokens choose."""
    return len({t % experts for t in tokens})


@dataclass(frozen=True)
class Call:
    rows: int
    woken: int  # distinct experts per layer
    layers: int  # layers it ran (fewer: a self-draft's)
    caller: str  # ``Routing.caller`` while it ran
    logits: int  # rows whose logits it computed
    prompt: bool  # some rows are a prompt chunk's (their logits not all asked for)


class Routing:
    """A fake mixture's native forward counters: ``last_experts`` is the last call's
    (expert_runs, expert_rows); ``log`` every call's ``Call``; ``caller`` names who
    calls (a test's drafter sets it around its own forwards)."""

    def __init__(self, experts: int, layers: int) -> None:
        self.experts, self.layers = experts, layers
        self.last = (0, 0)
        self.log: list[Call] = []
        self.caller = "engine"

    def last_experts(self) -> tuple[int, int]:
        return self.last

    def route(self, meta: BatchMetadata, num_layers: int | None) -> None:
        n = self.layers if num_layers is None else num_layers
        ids = meta.input_ids.tolist()
        w = woken(ids, self.experts)
        self.last = (w * n, len(ids) * n)
        logits = len(meta.logits_indices)
        self.log.append(Call(len(ids), w, n, self.caller, logits, logits < len(ids)))


def _as_mixture(model: Any, experts: int, layers: int) -> None:
    """A mixture's config, the shapes of its weights (``expert_shape`` reads their
    bytes: one expert of one layer is EXPERT_BYTES) and its counters."""
    c = model.config
    model.config = SimpleNamespace(
        vocab_size=c.vocab_size, max_position=c.max_position, num_layers=layers,
        hidden_size=c.hidden_size, moe=True, num_experts=experts, experts_per_token=1)
    w = SimpleNamespace(nbytes=EXPERT_BYTES // 2)
    model.layers = [SimpleNamespace(expert_gate_up=(w,) * experts, expert_down=(w,) * experts,
                                    expert_gate_up_b=(), expert_down_b=())
                    for _ in range(layers)]
    model.embed_w = SimpleNamespace(nbytes=EMBED_BYTES)
    model.lm_head_w = SimpleNamespace(nbytes=HEAD_BYTES)
    resident = EMBED_BYTES + HEAD_BYTES + layers * experts * EXPERT_BYTES
    model.weight_bytes = lambda: resident
    model.native = Routing(experts, layers)


class RoutedBigram(BigramModel):
    """``BigramModel`` as a mixture of ``experts`` experts (one a row) in ``layers``
    layers; ``num_layers``: a self-draft's first layers (its logits as the whole
    model's)."""

    native: Routing

    def __init__(self, table: torch.Tensor, experts: int = EXPERTS, layers: int = LAYERS,
                 max_position: int = 512) -> None:
        super().__init__(table, max_position=max_position)
        _as_mixture(self, experts, layers)

    def __call__(self, meta: BatchMetadata, cache: KVCache, *,
                 num_layers: int | None = None) -> torch.Tensor:
        self.native.route(meta, num_layers)
        return super().__call__(meta, cache)


class RoutedTimedBigram(TimedBigram):
    """``TimedBigram`` (forwards on a fake clock) as ``RoutedBigram``'s mixture."""

    native: Routing

    def __init__(self, cost: Cost, clock: list[float], experts: int = EXPERTS,
                 layers: int = LAYERS) -> None:
        super().__init__(cost, clock)
        _as_mixture(self, experts, layers)

    def __call__(self, meta: BatchMetadata, cache: KVCache) -> torch.Tensor:
        self.native.route(meta, None)
        return super().__call__(meta, cache)
