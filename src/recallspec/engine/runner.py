"""One step's forward, verification and KV commit: the engine's ``Verifier``.

``NativeVerifier`` is what the step core (``step/core.py``) verifies through in the
engine: one call of ``Runner.run`` per step, which also carries the step's prompt chunks.

Every decoding request feeds its root (the last committed token) and its draft tree;
the plan's prompt chunks follow; all in ONE ragged forward with no padding of inputs or
KV cache. Each request then keeps its own accepted path: the KV cache compacts it and
the slot advances by its own count. Greedy requests verify by each row's argmax as the
native forward returns it (``BatchMetadata.argmax``), reading no logits; the logits rows
are sliced only for sampling, for drafters that read them, and for forwards without it.

The padded batch modes (EMS-SD's baselines, chosen per request) differ only in cost:
``pad_inputs`` requests are padded to the longest draft among them with leaves below
the root (no real row attends to them); ``pad_kv`` requests' slots all advance by the
largest count committed among them (``pad_kv``), the extra entries masked as padding.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from recallspec.engine.outputs import StepStats
from recallspec.engine.request import Request
from recallspec.engine.scheduler import PrefillChunk
from recallspec.runtime.batch import SequenceInput, build_batch
from recallspec.runtime.kv_cache import KVCache
from recallspec.runtime.linear import forward_threads
from recallspec.spec.tree import DraftTree
from recallspec.spec.verify import verify_greedy, verify_greedy_argmax, verify_sampling
from recallspec.step.core import Verified

Failure = tuple[Request, Exception]


@dataclass(frozen=True)
class StepResult:
    # Decoding requests, in plan order. Logits: None where nothing read them (greedy
    # verification by the forward's argmax, for a drafter without needs_logits).
    verified: list[Verified[Request]]
    failed: list[Failure]  # decoding requests whose verification raised
    first_rows: list[tuple[Request, torch.Tensor]]  # prompt completed: its last row, [V]
    num_rows: int  # rows fed, padding included


class Runner:
    def __init__(self, model: Any, cache: KVCache, max_len: int, threads: int) -> None:
        self.model = model
        self.cache = cache
        self.max_len = max_len
        self.threads = threads

    def run(
        self, decoding: Sequence[Request], trees: Sequence[DraftTree],
        prefill: Sequence[PrefillChunk], stats: StepStats,
    ) -> StepResult:
        cache = self.cache
        inputs: list[SequenceInput] = []
        pad_to = max((len(t) for r, t in zip(decoding, trees, strict=True) if r.mode.pad_inputs),
                     default=0)
        n_rows: list[int] = []  # rows fed per decoding request, padding included
        as_lists = [(t.tokens.tolist(), t.parents.tolist()) for t in trees]  # fed and verified
        for req, (tree_toks, tree_parents) in zip(decoding, as_lists, strict=True):
            start = cache.length(req.slot)
            toks = [req.generated[-1], *tree_toks]
            parents = [-1, *[p + 1 for p in tree_parents]]
            if req.mode.pad_inputs:  # padding rows: leaves below the root
                pad = max(min(pad_to - len(tree_toks), self.max_len - start - len(toks)), 0)
                toks += [req.generated[-1]] * pad
                parents += [0] * pad
                stats.padding_rows += pad
            n_rows.append(len(toks))
            inputs.append(SequenceInput(
                req.slot, start, toks, parents, cache_valid=cache.valid_prefix(req.slot),
                start_pos=cache.logical_length(req.slot),
            ))
        for c in prefill:
            inputs.append(SequenceInput(c.request.slot, c.start, c.tokens,
                                        logits="last" if c.is_last else "none"))
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
            first, end, off = off, off + 1 + len(tree), off + n_rows[b]  # padding after end
            stats.draft_nodes += len(tree)
            greedy_ids = argmax[first:end] if req.params.greedy else []
            try:
                if greedy_ids:  # no tensor op unless the drafter reads the rows
                    verdict = verify_greedy_argmax(*as_lists[b], greedy_ids)
                    rows = logits[first:end] if req.drafter.needs_logits else None
                else:
                    rows = logits[first:end]
                    verdict = (verify_greedy(tree, rows) if req.params.greedy
                               else verify_sampling(tree, rows, req.params, req.generator))
            except Exception as e:
                failed.append((req, e))
                continue
            keep = [0, *(n + 1 for n in verdict.accepted_nodes)]
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

    def pad_kv(self, verified: Sequence[Verified[Request]], stats: StepStats) -> list[Request]:
        """Advance every ``pad_kv`` request's slot to the largest count committed among
        them (the root + its accepted nodes); returns the requests padded."""
        padded = [(v.seq, 1 + len(v.verdict.accepted_nodes)) for v in verified
                  if v.seq.mode.pad_kv]
        most = max((n_kv for _, n_kv in padded), default=0)
        out = []
        for req, n_kv in padded:
            n = max(min(most - n_kv, self.max_len - self.cache.length(req.slot) - 1), 0)
            if n:
                self.cache.pad(req.slot, n)
                stats.kv_padding += n
                out.append(req)
        return out


class NativeVerifier:
    """The engine's ``Verifier`` for one step: ``Runner.run`` over the decoding
    requests and the step's prompt chunks; ``result`` keeps the rest of what it returns
    (the prompt chunks' last rows, the rows fed)."""

    def __init__(self, runner: Runner, prefill: Sequence[PrefillChunk], stats: StepStats,
                 ) -> None:
        self.runner, self.prefill, self.stats = runner, prefill, stats
        self.result = StepResult([], [], [], 0)

    def verify(
        self, seqs: Sequence[Request], trees: Sequence[DraftTree]
    ) -> tuple[list[Verified[Request]], list[Failure]]:
        self.result = self.runner.run(seqs, trees, self.prefill, self.stats)
        return self.result.verified, self.result.failed
