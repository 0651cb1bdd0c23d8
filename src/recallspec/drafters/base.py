"""The drafter interface: the base class every drafter subclasses (names: ``registry``).

A drafter proposes a draft tree for each active request every step. Lifecycle of a
request, all calls keyed by a request id the engine chooses:

  start(rid, prompt)            once, with the prompt's token ids
  propose(rid, max_nodes)       each step: a DraftTree of at most max_nodes nodes
                                continuing the committed text (empty = no draft)
  observe(rid, accepted, ...)   after verification: the newly committed tokens
                                (accepted draft tokens followed by the bonus token),
                                plus the tree and, if ``needs_logits``, the
                                verification logits of the root and every node
  stop(rid)                     once, when the request ends (free its state)

Every drafter subclasses ``Drafter``, which gives each optional hook a default (the
step core reads them directly, never by probing attributes):
- ``bind(ctx)`` with a ``DrafterContext``: called once when an engine creates the
  drafter, before any request, with the narrow things a drafter may need from it
  (drafters never see the engine itself). Default: nothing.
- ``propose_batch(rids, max_nodes_list)``: the drafts of several requests at once. The
  default proposes one by one and returns, in place of a draft, the exception a
  ``propose`` raised (that request alone fails); an override (the draft model: one
  batched forward per draft position) raises to fail them all.
- ``costly_proposals`` (False): a proposal's cost grows with max_nodes (a model forward
  per draft position); adaptive sizing then sizes each request's draft before
  proposing, and asks for nothing where drafting does not pay.
- ``contexts`` (1) and ``context(rid)`` (0, in ``[0, contexts)``): the kind of draft the
  next ``propose`` for rid will make (say, its source and match-length bucket); adaptive
  sizing keeps acceptance statistics per context. ``context`` must not change the
  drafter's state and must be valid right after ``start`` and each ``observe``.
- ``offers_candidates`` (False) and ``candidates(rid, max_nodes)``: several drafts,
  each with its context, of which adaptive sizing verifies the one worth most (the
  portfolio).

Invariant: after start and each observe, the drafter's view of request rid is
exactly prompt + all committed tokens, the same text the engine holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from recallspec.decoding.tree import DraftTree
from recallspec.errors import DataError
from recallspec.recall.view import RecallView
from recallspec.runtime.kv_cache import KVPrefix


def no_recall(rid: int) -> RecallView:
    """The recall view of an engine without response memory or live corpora."""
    return ()


@dataclass(frozen=True)
class DrafterContext:
    """What a drafter may know of the engine that runs it (``bind``)."""

    target: Any  # the target model (a self-draft runs its first layers; dtype, depth)
    # The engine tokenizer's fingerprint, computed on first use (hashing a large
    # vocabulary is a visible share of a start, and plain decoding never needs it).
    fingerprint: Callable[[], str | None]
    vocab_size: int  # ... and so must its vocabulary size
    max_batch_size: int  # concurrent requests: a draft model's slot count
    max_len: int  # KV positions per request: a draft model's cache length
    # Running request rid's committed KV entries in the target's cache (read-only: a
    # self-draft feeds rows past them without committing; verification overwrites them).
    kv_prefix: Callable[[int], KVPrefix]
    # Running request rid's recall sources (``recall/view.py``): its tenant's response
    # memory and the ready live corpora, as immutable groups swapped whole when they
    # change. Cheap (a few lookups): the SAM drafters call it after every commit.
    recall: Callable[[int], RecallView] = no_recall

    @property
    def tokenizer_fingerprint(self) -> str | None:
        """A datastore's or index's tokenizer must match it (``fingerprint()``)."""
        return self.fingerprint()


class Drafter:
    """Base class of every drafter (see the module docstring)."""

    name: str = ""
    needs_logits: bool = False  # observe() wants the verification logits of every node
    costly_proposals: bool = False
    contexts: int = 1
    offers_candidates: bool = False

    def bind(self, ctx: DrafterContext) -> None:
        """Called once by an engine that creates this drafter, before any request."""

    def start(self, rid: int, prompt: Sequence[int]) -> None:
        raise NotImplementedError

    def propose(self, rid: int, max_nodes: int) -> DraftTree:
        raise NotImplementedError

    def propose_batch(
        self, rids: Sequence[int], max_nodes: Sequence[int]
    ) -> list[DraftTree | Exception]:
        """Each request's draft; the default proposes one by one (module docstring)."""
        out: list[DraftTree | Exception] = []
        for rid, k in zip(rids, max_nodes, strict=True):
            try:
                out.append(self.propose(rid, k))
            except Exception as e:
                out.append(e)
        return out

    def observe(
        self,
        rid: int,
        accepted: Sequence[int],
        tree: DraftTree,
        logits: torch.Tensor | None,  # [len(tree) + 1, vocab]: root row first, then nodes
    ) -> None:
        raise NotImplementedError

    def stop(self, rid: int) -> None:
        raise NotImplementedError

    def context(self, rid: int) -> int:
        """The context of rid's next draft (in ``[0, contexts)``)."""
        return 0

    def candidates(self, rid: int, max_nodes: int) -> list[tuple[int, DraftTree]]:
        """(context, draft) pairs to choose from (only with ``offers_candidates``)."""
        raise NotImplementedError


def checked_instance(d: object) -> Drafter:
    """A drafter instance given by a caller, checked to be one (the step core reads the
    base class's hooks)."""
    if not isinstance(d, Drafter):
        raise DataError(f"a drafter instance must subclass recallspec.drafters.Drafter; "
                        f"got {type(d).__name__}")
    return d
