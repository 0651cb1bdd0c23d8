"""One step's forward, verification and KV commit: the engine's ``Verifier``.

``NativeVerifier`` is what the step core (``step/core.py``) verifies through in the
engine: one call of ``Runner.run`` per step, which also carries the step's prompt chunks.

Every decoding request feeds its root (the last committed token) and its draft tree;
the plan's prompt chunks follow; all in ONE ragged forward with no padding of inputs or
KV cache (EMS-SD). Each request then keeps its own accepted path: the KV cache compacts
it and the slot advances by its own count. Greedy requests verify by each row's argmax
as the native forward returns it (``BatchMetadata.argmax``), reading no logits, unless a
penalty changes their argmax (``decoding/penalties.py``); the logits rows are sliced only for
sampling, penalties, grammars, logprobs, drafters that read them, and forwards without
argmax. A constrained greedy request reads a row's logits only where the row's argmax is
one its grammar forbids (``verify_greedy_masked_argmax``).

A ``Runner`` subclass may change the cost of a step, never its tokens, through two
hooks: ``decoding_inputs`` may append rows after a request's root and tree (rows that
no verified row sees), and ``after_step`` may grow slots by masked KV entries
(``KVCache.pad``, which every reader of the cache honours: ``SequenceInput.cache_valid``).
The engine installs one with ``Engine.use_runner``; EMS-SD's padded baselines, a
benchmark ablation, are such a subclass (``bench/suite/padded_layouts.py``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from recallspec.cost.expert_counts import WokenExperts
from recallspec.decoding.masks import Mask
from recallspec.decoding.penalties import Penalties
from recallspec.decoding.tree import DraftTree
from recallspec.decoding.verify import (
    verify_greedy,
    verify_greedy_argmax,
    verify_greedy_masked_argmax,
    verify_sampling,
)
from recallspec.engine.outputs import StepStats
from recallspec.engine.request import Request
from recallspec.engine.scheduler import PrefillChunk
from recallspec.kernels.linear import forward_threads
from recallspec.runtime.batch import SequenceInput, build_batch
from recallspec.runtime.kv_cache import KVCache
from recallspec.step.core import Verified

Failure = tuple[Request, Exception]


@dataclass(frozen=True)
class StepResult:
    # Decoding requests, in plan order. Logits: None where nothing read them (greedy
    # verification by the forward's argmax, for a drafter without needs_logits).
    verified: list[Verified[Request]]
    failed: list[Failure]  # decoding requests whose verification raised
    first_rows: list[tuple[Request, torch.Tensor]]  # prompt completed: its last row, [V]
    num_rows: int  # rows fed, a subclass's extra rows included


class Runner:
    def __init__(self, model: Any, cache: KVCache, max_len: int, threads: int) -> None:
        self.model = model
        self.cache = cache
        self.max_len = max_len
        self.threads = threads

    def decoding_inputs(
        self, decoding: Sequence[Request], trees: Sequence[tuple[list[int], list[int]]],
    ) -> list[SequenceInput]:
        """Each decoding request's rows: its root, then its tree (tokens, parents as
        lists). The verified rows are each input's first ``1 + len(tree)``; a subclass
        may append rows after them that none of those rows sees (leaves below the root)."""
        cache = self.cache
        inputs: list[SequenceInput] = []
        for req, (tree_toks, tree_parents) in zip(decoding, trees, strict=True):
            inputs.append(SequenceInput(
                req.slot, cache.length(req.slot), [req.generated[-1], *tree_toks],
                [-1, *[p + 1 for p in tree_parents]],
                # Masked entries (``KVCache.pad``) exist only where a subclass wrote them.
                cache_valid=cache.valid_prefix(req.slot),
                start_pos=cache.logical_length(req.slot),
            ))
        return inputs

    def after_step(self, verified: Sequence[Verified[Request]]) -> Sequence[Request]:
        """Called by the engine once the step's verified requests are committed; returns
        the requests whose slots it grew (the engine checks their room again). The
        engine's own runner does nothing here."""
        return ()

    def run(
        self, decoding: Sequence[Request], trees: Sequence[DraftTree],
        prefill: Sequence[PrefillChunk], stats: StepStats,
        masks: Sequence[Mask | None] | None = None,
    ) -> StepResult:
        """One forward of the decoding requests' roots and trees (``masks[i]``: request
        i's grammar masks, None when free; ``masks`` None: none constrained) and the
        prompt chunks; each decoding request's verdict, its accepted path committed."""
        if masks is None:
            masks = [None] * len(decoding)
        cache = self.cache
        as_lists = [(t.tokens.tolist(), t.parents.tolist()) for t in trees]  # fed and verified
        inputs = self.decoding_inputs(decoding, as_lists)
        n_rows = [len(i.tokens) for i in inputs]  # rows fed per decoding request
        for c in prefill:
            inputs.append(SequenceInput(c.request.slot, c.start, c.tokens,
                                        logits="last" if c.is_last else "none"))
        if not inputs:  # every decoding request's drafter failed, and no prompt rides along
            return StepResult([], [], [], 0)
        meta = build_batch(inputs)
        t_fwd = time.perf_counter()
        with forward_threads(meta.num_tokens, self.threads):
            logits = self.model(meta, cache)
        if decoding:
            stats.forward_s += time.perf_counter() - t_fwd
            stats.steps += 1
            stats.rows += meta.num_tokens
        verified: list[Verified[Request]] = []
        failed: list[Failure] = []
        # Each logits row's argmax, when the forward computed them (-1: it did not).
        argmax = meta.argmax_list() if decoding else []
        if argmax and argmax[0] < 0:
            argmax = []
        off = 0
        for b, (req, tree) in enumerate(zip(decoding, trees, strict=True)):
            first, end, off = off, off + 1 + len(tree), off + n_rows[b]  # extra rows after end
            stats.draft_nodes += len(tree)
            params = req.params
            mask = masks[b]
            try:
                pen = Penalties.of(params, req.prompt, req.generated)
                greedy_ids = argmax[first:end] if params.greedy and pen is None else []
                if mask is not None:
                    rows = logits[first:end]
                    verdict = (
                        verify_greedy_masked_argmax(*as_lists[b], greedy_ids, rows, mask)
                        if greedy_ids else
                        verify_greedy(tree, rows, pen, mask) if params.greedy else
                        verify_sampling(tree, rows, params, req.generator, pen, mask))
                elif greedy_ids:  # no tensor op unless the rows are read
                    verdict = verify_greedy_argmax(*as_lists[b], greedy_ids)
                    rows = (logits[first:end] if req.drafter.needs_logits
                            or params.logprobs is not None else None)
                else:
                    rows = logits[first:end]
                    verdict = (verify_greedy(tree, rows, pen) if params.greedy else
                               verify_sampling(tree, rows, params, req.generator, pen))
            except Exception as e:
                failed.append((req, e))
                continue
            keep = [0, *(n + 1 for n in verdict.accepted_nodes)]  # root + accepted path
            cache.commit(req.slot, meta.cache_lens[b], keep)
            verified.append(Verified(req, tree, verdict, rows))
        first_rows: list[tuple[Request, torch.Tensor]] = []
        for c in prefill:
            stats.prefill_rows += c.num_tokens
            cache.commit(c.request.slot, c.start, range(c.num_tokens))
            c.request.prefilled += c.num_tokens
            if c.is_last:
                first_rows.append((c.request, logits[off]))
                off += 1
        return StepResult(verified, failed, first_rows, meta.num_tokens)


class NativeVerifier:
    """The engine's ``Verifier`` for one step: ``Runner.run`` over the decoding
    requests and the step's prompt chunks; ``result`` keeps the rest of what it returns
    (the prompt chunks' last rows, the rows fed) and, given a mixture of experts'
    counter (``woken``), ``experts``: the distinct experts per layer its forward woke
    (None: not counted, or no forward of those rows ran)."""

    def __init__(self, runner: Runner, prefill: Sequence[PrefillChunk], stats: StepStats,
                 woken: WokenExperts | None = None) -> None:
        self.runner, self.prefill, self.stats, self.woken = runner, prefill, stats, woken
        self.result = StepResult([], [], [], 0)
        self.experts: float | None = None

    def verify(
        self, seqs: Sequence[Request], trees: Sequence[DraftTree],
        masks: Sequence[Mask | None],
    ) -> tuple[list[Verified[Request]], list[Failure]]:
        self.result = self.runner.run(seqs, trees, self.prefill, self.stats, masks)
        if self.woken is not None:
            # Read at once: the run's forward is the model's last call (verifying and
            # committing run none); a drafter's own forwards come before the step's
            # verification or after it (``tell_drafter``), never between.
            self.experts = self.woken.last(self.result.num_rows)
        return self.result.verified, self.result.failed
