"""EMS-SD's padded batch layouts: the paper's baselines, kept as a benchmark ablation.

The engine decodes one way: ragged inputs (each request feeds its own root and draft
rows) and an unpadded KV cache (each slot advances by its own accepted count). That is
EMS-SD, the layout named ``ems`` here. The paper compares it with padded layouts:

* ``vanilla``: every request's rows are padded to the batch's longest draft, and every
  slot advances by the batch's largest accepted count; the entries a request did not
  accept are masked KV entries that later attention skips.
* ``unpad-kv``: padded inputs, unpadded KV cache (half-way ablation).
* ``unpad-input``: ragged inputs, padded KV cache (the other half-way ablation).

A layout holds for every request of a run: ``padded_layout(engine, name)`` installs a
``PaddedRunner`` (``Engine.use_runner``) for a ``with`` block and gives the engine its
runner back after it. Padding changes the cost of a step, never its tokens: padding rows
are leaves below the root (no real row attends to them) and padding KV entries are
masked (``KVCache.pad``, honoured by every reader of the cache and by the native
forward), so every layout commits exactly the tokens of ``ems``. The runner counts its
padding (``PaddingCounts``); ``Engine.stats`` knows nothing of it (its ``rows`` include
the padding rows fed).

``benchmarks/experiments/exp_batch.py`` runs the comparison (EMS-SD's Table 2; results in
``docs/batch/``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from recallspec.engine import Engine
from recallspec.engine.request import Request
from recallspec.engine.runner import Runner
from recallspec.errors import UnknownNameError
from recallspec.runtime.batch import SequenceInput
from recallspec.runtime.kv_cache import KVCache
from recallspec.step.core import Verified


@dataclass(frozen=True)
class Layout:
    name: str
    pad_inputs: bool = False  # pad each request's rows to the batch's longest draft
    pad_kv: bool = False  # advance every KV slot by the batch's largest accepted count

    @property
    def pads(self) -> bool:
        return self.pad_inputs or self.pad_kv


LAYOUTS: dict[str, Layout] = {
    lay.name: lay
    for lay in (
        Layout("ems"),  # the engine's own: nothing padded
        Layout("vanilla", pad_inputs=True, pad_kv=True),
        Layout("unpad-kv", pad_inputs=True),
        Layout("unpad-input", pad_kv=True),
    )
}


def layout(name: str | Layout) -> Layout:
    """A layout by name (``UnknownNameError`` for another)."""
    if isinstance(name, Layout):
        return name
    try:
        return LAYOUTS[name]
    except KeyError:
        raise UnknownNameError(
            f"unknown batch layout {name!r}; available: {', '.join(LAYOUTS)}") from None


@dataclass
class PaddingCounts:
    """What a padded run added, counted by its runner."""

    rows: int = 0  # padding input rows fed (pad_inputs)
    kv_entries: int = 0  # masked KV entries written (pad_kv)

    def ratio(self, new_tokens: int) -> float:
        """Padding rows per committed token (EMS-SD's padding ratio)."""
        return self.rows / new_tokens if new_tokens else 0.0


class PaddedRunner(Runner):
    """The engine's ``Runner`` with one layout's padding, for every request it runs."""

    def __init__(self, model: Any, cache: KVCache, max_len: int, threads: int,
                 layout: Layout) -> None:
        super().__init__(model, cache, max_len, threads)
        self.layout = layout
        self.counts = PaddingCounts()

    @classmethod
    def over(cls, engine: Engine, name: str | Layout) -> PaddedRunner:
        """A runner of ``engine``'s model over its KV cache, with layout ``name``."""
        return cls(engine.model, engine.cache, engine.max_len, engine.threads, layout(name))

    def decoding_inputs(
        self, decoding: Sequence[Request], trees: Sequence[tuple[list[int], list[int]]],
    ) -> list[SequenceInput]:
        """Pad inputs: every request's rows to the batch's longest draft, with copies of
        its root hanging below the root (leaves no verified row sees)."""
        inputs = super().decoding_inputs(decoding, trees)
        if not self.layout.pad_inputs:
            return inputs
        pad_to = max((len(toks) for toks, _ in trees), default=0)
        out = []
        for inp, (toks, _) in zip(inputs, trees, strict=True):
            n = len(inp.tokens)
            pad = max(min(pad_to - len(toks), self.max_len - inp.cache_len - n), 0)
            if pad:
                assert inp.parents is not None  # (a root and its tree: never a bare chain)
                inp = replace(inp, tokens=[*inp.tokens, *[inp.tokens[0]] * pad],
                              parents=[*inp.parents, *[0] * pad])
                self.counts.rows += pad
            out.append(inp)
        return out

    def after_step(self, verified: Sequence[Verified[Request]]) -> Sequence[Request]:
        """Pad KV: every verified request's slot up to the largest count committed in
        the step (the root + its accepted nodes), the extra entries masked."""
        if not self.layout.pad_kv:
            return ()
        kept = [(v.seq, 1 + len(v.verdict.accepted_nodes)) for v in verified]
        most = max((n_kv for _, n_kv in kept), default=0)
        grown = []
        for req, n_kv in kept:
            n = max(min(most - n_kv, self.max_len - self.cache.length(req.slot) - 1), 0)
            if n:
                self.cache.pad(req.slot, n)
                self.counts.kv_entries += n
                grown.append(req)
        return grown


@contextmanager
def padded_layout(engine: Engine, name: str | Layout) -> Iterator[PaddingCounts]:
    """Run ``engine`` with layout ``name`` inside the block (the engine idle at both
    ends); yields the run's padding counts. ``ems`` installs nothing: the engine's own
    runner is EMS-SD."""
    lay = layout(name)
    if not lay.pads:
        yield PaddingCounts()
        return
    runner = PaddedRunner.over(engine, lay)
    before = engine.runner
    engine.use_runner(runner)
    try:
        yield runner.counts
    finally:
        engine.use_runner(before)
