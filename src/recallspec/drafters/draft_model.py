"""Model drafters: ``draft-model`` and ``sam+draft-model``.

An auxiliary causal LM drafts ``gamma`` tokens greedily, one forward per token, as a
chain. It is either

* a self-draft: the target's first ``layers`` layers + its final norm and head
  (early exit, ``model(meta, cache, num_layers=layers)``), or
* a separate model (``path=...``) whose tokenizer must match the target's
  (fingerprint check), run in full.

A self-draft bound to an engine keeps no cache: its layers are the target's first
layers, so the target's KV cache already holds their keys and values for every committed
token (``DrafterContext.kv_prefix``). Each proposal feeds the newest committed token and then
its own drafts right after the target slot's committed entries, in layers
``< layers`` only, without committing; the step's verification forward overwrites those
rows. No prompt prefill, no catch-up after steps it was not asked to draft: a proposal
of n tokens costs n forwards of one token per request.

Otherwise (a separate model, or a model passed in outside an engine) the drafter owns
its KV cache (``KVCache`` with one slot per concurrent request, ``layers`` layers
deep). Invariant per request: the slot holds ``text[:cached]`` for a prefix of the
committed text; tokens past ``cached`` are fed at the next proposal. Drafted tokens are
cached tentatively; after verification the slot is rolled back to the longest prefix
that the committed tokens confirm.

The drafter needs the model. Through the engine nothing is to be passed: the engine
calls ``bind(ctx)`` (a ``DrafterContext``), which supplies the target model (for the
self-draft), its tokenizer fingerprint (for the check), the batch size and the context
length. Outside an engine pass ``model=`` (a ``CausalLM``-like
object) explicitly::

    engine.generate(ids, params, drafter="draft-model", drafter_options={"layers": 8})
    engine.generate(ids, params, drafter="draft-model",
                    drafter_options={"path": "/models/draft-dir"})
    create_drafter("draft-model", model=engine.model, layers=8)

``sam+draft-model``: the automaton draft (as in ``sam``) when
``max(l_d, l_s - delta) >= tau``, else the draft model's chain.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from recallspec.decoding.tree import DraftTree
from recallspec.drafters.base import Drafter, DrafterContext
from recallspec.drafters.sam import MODEL, SamDrafter, SamOptions, sam_options
from recallspec.errors import DataError
from recallspec.kernels.linear import forward_threads
from recallspec.recall.automata import StaticIndex
from recallspec.runtime.batch import SequenceInput, build_batch
from recallspec.runtime.kv_cache import KVCache, KVCacheFullError, KVPrefix


@dataclass(frozen=True)
class DraftModelOptions:
    gamma: int = 4  # draft tokens per step
    layers: int | None = None  # self-draft depth; None = run the whole draft model
    path: str | None = None  # separate draft model (loaded at bind time)
    slots: int = 8  # concurrent requests (the engine's batch size when bound)
    max_len: int = 4096  # KV positions per request (the engine's when bound)

    def __post_init__(self) -> None:
        if self.gamma < 1:
            raise ValueError("gamma must be >= 1")
        if self.layers is not None and self.layers < 1:
            raise ValueError("layers must be >= 1")
        if self.slots < 1 or self.max_len < 2:
            raise ValueError("slots must be >= 1 and max_len >= 2")
        if self.path is not None and self.layers is not None:
            raise ValueError("give either a separate draft model (path) or a self-draft depth "
                             "(layers), not both")


@dataclass
class _Request:
    slot: int
    text: list[int]  # prompt + committed tokens
    cached: int = 0  # text[:cached] is in the slot
    drafted: list[int] = field(default_factory=list)  # cached tentatively after text[:cached]


class ModelDraft:
    """Greedy autoregressive drafting with a model and a private KV cache."""

    def __init__(self, options: DraftModelOptions, model: Any = None) -> None:
        self.options = options
        self.model = model
        self._cache: KVCache | None = None
        self._slots = options.slots
        self._max_len = options.max_len
        self._requests: dict[int, _Request] = {}
        # Self-draft bound to an engine: the target's cache of a running request.
        self._shared: Callable[[int], KVPrefix] | None = None

    def bind(self, ctx: DrafterContext) -> None:
        self._slots = max(self._slots, ctx.max_batch_size)
        self._max_len = ctx.max_len
        if self.options.path is not None:
            from recallspec.models import load_model

            model, tok = load_model(self.options.path,
                                    dtype=getattr(ctx.target, "dtype", torch.float32))
            if tok.fingerprint != ctx.tokenizer_fingerprint:
                raise DataError(
                    f"draft model {self.options.path} uses a different tokenizer than the "
                    "target (fingerprint mismatch); drafts would be in another vocabulary"
                )
            self.model = model
        elif self.model is None:
            self.model = ctx.target  # self-draft from the target
        if self.options.layers is not None and self.options.layers > _num_layers(self.model):
            raise ValueError(f"layers={self.options.layers} exceeds the model's depth")
        if self.options.layers is not None and self.model is ctx.target:
            self._shared = ctx.kv_prefix

    def _kv(self) -> KVCache:
        if self._cache is None:
            if self.model is None:
                raise ValueError(
                    "draft-model has no model: use it through an Engine or pass model=..."
                )
            if self.options.layers is None:
                self._cache = self.model.new_cache(self._slots, self._max_len)
            else:
                c = self.model.config
                self._cache = KVCache(
                    num_layers=self.options.layers, num_slots=self._slots,
                    max_len=self._max_len, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                    dtype=getattr(self.model, "dtype", torch.float32),
                )
        return self._cache

    @property
    def shares_target_cache(self) -> bool:
        """Whether this is a self-draft reading the bound engine's KV cache."""
        return self._shared is not None

    def start(self, rid: int, prompt: Sequence[int]) -> None:
        slot = -1  # no slot: a shared cache, or no drafts for this request
        if self._shared is None:
            # More concurrent requests than slots: this one gets no drafts.
            with contextlib.suppress(KVCacheFullError):
                slot = self._kv().allocate()
        self._requests[rid] = _Request(slot, [int(t) for t in prompt])

    def stop(self, rid: int) -> None:
        req = self._requests.pop(rid, None)
        if req is not None and req.slot >= 0 and self._cache is not None:
            self._cache.release(req.slot)

    def observe(self, rid: int, accepted: Sequence[int]) -> None:
        req = self._requests[rid]
        if req.slot < 0 or not accepted:  # (a shared cache is the engine's to commit)
            req.text.extend(int(t) for t in accepted)
            return
        # Keep the tentatively cached draft tokens the committed text confirms.
        keep = 0
        while keep < min(len(req.drafted), len(accepted)) and req.drafted[keep] == accepted[keep]:
            keep += 1
        # The newest committed token stays uncached: the next proposal needs its logits.
        keep = min(keep, len(accepted) - 1)
        base = len(req.text)
        req.text.extend(int(t) for t in accepted)
        if req.drafted:
            assert req.cached == base, "drafted tokens are cached right after the text"
            req.cached = base + keep
            self._kv().rollback(req.slot, req.cached)
            req.drafted = []

    def propose(self, rid: int, n: int) -> list[int]:
        """Up to ``n`` greedy draft tokens continuing the request's text."""
        return self.propose_many([rid], [n])[0]

    def propose_many(self, rids: Sequence[int], ns: Sequence[int]) -> list[list[int]]:
        """``propose`` for several requests at once, batched: draft position j of every
        request is computed in one ragged forward (the first one feeds each request's
        pending text, the later ones a single token each)."""
        if self._shared is not None:
            return self._propose_shared(self._shared, rids, ns)
        cache = self._kv()
        outs: list[list[int]] = [[] for _ in rids]
        todo: list[tuple[int, _Request, int, list[int]]] = []  # (index, request, n, feed)
        for i, (rid, n) in enumerate(zip(rids, ns, strict=True)):
            req = self._requests[rid]
            # Feeding the pending text and n - 1 drafts needs len(text) + n - 1 positions.
            n = min(n, self.options.gamma, self._max_len - len(req.text) + 1)
            if req.slot < 0 or n <= 0:
                continue
            pending = req.text[req.cached :]
            assert pending, "the last committed token is never cached before a proposal"
            todo.append((i, req, n, pending))
        for _, req, _, _ in todo:
            req.cached = len(req.text)
        while todo:
            starts = [cache.length(req.slot) for _, req, _, _ in todo]
            meta = build_batch([
                SequenceInput(req.slot, st, feed, logits="last")
                for (_, req, _, feed), st in zip(todo, starts, strict=True)
            ])
            logits = self._forward(meta, cache)  # [len(todo), vocab]
            nxt = []
            for row, ((i, req, n, feed), st) in enumerate(zip(todo, starts, strict=True)):
                cache.commit(req.slot, st, range(len(feed)))
                tok = int(torch.argmax(logits[row]))
                outs[i].append(tok)
                if len(outs[i]) < n:
                    nxt.append((i, req, n, [tok]))
                else:
                    req.drafted = outs[i][:-1]  # the last draft token was never fed
            todo = nxt
        return outs

    def _propose_shared(
        self, prefix_of: Callable[[int], KVPrefix], rids: Sequence[int], ns: Sequence[int]
    ) -> list[list[int]]:
        """``propose_many`` for a self-draft on the target's cache: draft position j of
        every request is one token fed at the slot's committed length + j."""
        outs: list[list[int]] = [[] for _ in rids]
        todo: list[tuple[int, KVPrefix, int, int]] = []  # (index, prefix, n, token to feed)
        for i, (rid, n) in enumerate(zip(rids, ns, strict=True)):
            text = self._requests[rid].text
            pre = prefix_of(rid)
            if pre.logical_length != len(text) - 1:
                raise RuntimeError(
                    f"request {rid}: the target caches {pre.logical_length} tokens, expected "
                    f"all but the newest of {len(text)} (drafter and engine out of step)"
                )
            # The newest token and n - 1 drafts are written at length .. length + n - 1.
            n = min(n, self.options.gamma, pre.cache.max_len - pre.length)
            if n > 0:
                todo.append((i, pre, n, text[-1]))
        j = 0
        while todo:
            meta = build_batch([
                SequenceInput(pre.slot, pre.length + j, [tok], logits="last",
                              cache_valid=_extend_valid(pre.valid, j),
                              start_pos=pre.logical_length + j)
                for _, pre, _, tok in todo
            ])
            logits = self._forward(meta, todo[0][1].cache)  # [len(todo), vocab]
            nxt = []
            for row, (i, pre, n, _) in enumerate(todo):
                tok = int(torch.argmax(logits[row]))
                outs[i].append(tok)
                if len(outs[i]) < n:
                    nxt.append((i, pre, n, tok))
            todo, j = nxt, j + 1
        return outs

    def _forward(self, meta: Any, cache: KVCache) -> torch.Tensor:
        assert self.model is not None
        with forward_threads(meta.num_tokens):  # a long pending prompt runs in MKL
            if self.options.layers is None:
                return self.model(meta, cache)
            return self.model(meta, cache, num_layers=self.options.layers)


def _extend_valid(valid: torch.Tensor | None, n: int) -> torch.Tensor | None:
    """A padded slot's valid mask followed by ``n`` real (uncommitted) rows."""
    if valid is None or n == 0:
        return valid
    return torch.cat([valid, torch.ones(n, dtype=torch.bool)])


def _num_layers(model: Any) -> int:
    return int(getattr(model.config, "num_layers", 0))


class DraftModelDrafter(Drafter):
    """``draft-model``: a chain of ``gamma`` greedy tokens from an auxiliary model."""

    name = "draft-model"
    needs_logits = False
    costly_proposals = True  # a draft-model forward per draft position

    def __init__(self, options: DraftModelOptions, model: Any = None) -> None:
        self.draft = ModelDraft(options, model)

    def bind(self, ctx: DrafterContext) -> None:
        self.draft.bind(ctx)

    def start(self, rid: int, prompt: Sequence[int]) -> None:
        self.draft.start(rid, prompt)

    def propose(self, rid: int, max_nodes: int) -> DraftTree:
        return DraftTree.chain(self.draft.propose(rid, max_nodes))

    def propose_batch(
        self, rids: Sequence[int], max_nodes: Sequence[int]
    ) -> list[DraftTree | Exception]:
        """All requests' drafts with one forward per draft position (a failure fails
        them all)."""
        return [DraftTree.chain(t) for t in self.draft.propose_many(rids, max_nodes)]

    def observe(
        self, rid: int, accepted: Sequence[int], tree: DraftTree, logits: torch.Tensor | None
    ) -> None:
        self.draft.observe(rid, accepted)

    def stop(self, rid: int) -> None:
        self.draft.stop(rid)


class SamDraftModelDrafter(SamDrafter):
    """``sam+draft-model``: automaton drafts for long matches, the draft model otherwise.

    The draft model's cache follows the committed text even on steps the automaton
    drafts (its pending tokens are fed at its next proposal).
    """

    name = "sam+draft-model"
    needs_logits = False
    auxiliary = MODEL
    costly_proposals = True  # a draft-model forward per draft position

    def __init__(self, options: SamOptions, draft: DraftModelOptions, *, tau: int = 5,
                 model: Any = None, static: StaticIndex | None = None) -> None:
        super().__init__(options, static)
        if tau < 0:
            raise ValueError("tau must be >= 0")
        self.tau = tau
        self.draft = ModelDraft(draft, model)

    def bind(self, ctx: DrafterContext) -> None:
        super().bind(ctx)
        self.draft.bind(ctx)

    def start(self, rid: int, prompt: Sequence[int]) -> None:
        super().start(rid, prompt)
        self.draft.start(rid, prompt)

    def propose(self, rid: int, max_nodes: int) -> DraftTree:
        return self._automaton_or(
            rid, max_nodes, lambda: DraftTree.chain(self.draft.propose(rid, max_nodes))
        )

    def observe(
        self, rid: int, accepted: Sequence[int], tree: DraftTree, logits: torch.Tensor | None
    ) -> None:
        super().observe(rid, accepted, tree, logits)
        self.draft.observe(rid, accepted)

    def stop(self, rid: int) -> None:
        super().stop(rid)
        self.draft.stop(rid)


def make_draft_model(
    *, model: Any = None, layers: int | None = None, path: str | os.PathLike[str] | None = None,
    gamma: int = 4, slots: int = 8, max_len: int = 4096,
) -> DraftModelDrafter:
    if model is None and path is None and layers is None:
        layers = 8  # through the engine with no options: an 8-layer self-draft
    opts = DraftModelOptions(gamma=gamma, layers=layers,
                             path=None if path is None else os.fspath(path),
                             slots=slots, max_len=max_len)
    return DraftModelDrafter(opts, model)


def make_sam_draft_model(
    *, model: Any = None, layers: int | None = None, path: str | os.PathLike[str] | None = None,
    gamma: int = 4, slots: int = 8, max_len: int = 4096,
    index: str | os.PathLike[str] | StaticIndex | None = None, max_tokens: int = 40,
    delta: int = 5, tau: int = 5, tree: bool = False, dynamic: bool = True,
    tokenizer_fingerprint: str | None = None,
) -> SamDraftModelDrafter:
    if model is None and path is None and layers is None:
        layers = 8
    sam_opts, static = sam_options(index, max_tokens=max_tokens, delta=delta, tree=tree,
                                dynamic=dynamic, tokenizer_fingerprint=tokenizer_fingerprint)
    draft = DraftModelOptions(gamma=gamma, layers=layers,
                              path=None if path is None else os.fspath(path),
                              slots=slots, max_len=max_len)
    return SamDraftModelDrafter(sam_opts, draft, tau=tau, model=model, static=static)
