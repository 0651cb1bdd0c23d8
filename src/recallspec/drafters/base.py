"""The drafter interface and its registry.

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

Optional: ``bind(ctx)`` with a ``DrafterContext``: called once when an engine creates
the drafter, before any request, with the narrow things a drafter may need from it
(drafters never see the engine itself).
Optional: ``propose_batch(rids, max_nodes_list)`` returns the drafts of several
requests at once; the engine calls it instead of ``propose`` when a drafter has it
(the draft model uses it to run one batched forward per draft position).
Optional: ``costly_proposals = True`` says a proposal's cost grows with max_nodes (a
model forward per draft position); adaptive sizing then sizes each request's
draft before proposing, and asks for nothing where drafting does not pay.
Optional: ``contexts`` (an int) and ``context(rid)`` (in ``[0, contexts)``): the kind
of draft the next ``propose`` for rid will make (say, its source and match-length
bucket); adaptive sizing keeps acceptance statistics per context. ``context`` must not
change the drafter's state and must be valid right after ``start`` and each ``observe``.

Invariant: after start and each observe, the drafter's view of request rid is
exactly prompt + all committed tokens, the same text the engine holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from recallspec.errors import UnknownNameError
from recallspec.recall.view import RecallView
from recallspec.runtime.kv_cache import KVPrefix
from recallspec.spec.tree import DraftTree


def no_recall(rid: int) -> RecallView:
    """The recall view of an engine without response memory or live corpora."""
    return ()


@dataclass(frozen=True)
class DrafterContext:
    """What a drafter may know of the engine that runs it (``bind``)."""

    target: Any  # the target model (a self-draft runs its first layers; dtype, depth)
    tokenizer_fingerprint: str | None  # a datastore's or index's tokenizer must match it
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


@runtime_checkable
class Drafter(Protocol):
    name: str
    needs_logits: bool  # observe() wants the verification logits of every tree node

    def start(self, rid: int, prompt: Sequence[int]) -> None: ...

    def propose(self, rid: int, max_nodes: int) -> DraftTree: ...

    def observe(
        self,
        rid: int,
        accepted: Sequence[int],
        tree: DraftTree,
        logits: torch.Tensor | None,  # [len(tree) + 1, vocab]: root row first, then nodes
    ) -> None: ...

    def stop(self, rid: int) -> None: ...


def has_costly_proposals(d: Drafter) -> bool:
    """Whether a drafter's proposals cost a model forward per draft position (its
    optional ``costly_proposals`` attribute; absent means cheap)."""
    return bool(getattr(d, "costly_proposals", False))


def draft_contexts(d: Drafter) -> int:
    """How many draft contexts a drafter distinguishes (1 without ``context``)."""
    n = getattr(d, "contexts", 1)
    return int(n) if callable(getattr(d, "context", None)) else 1


def draft_context(d: Drafter, rid: int) -> int:
    """The context of rid's next draft (0 for a drafter without contexts)."""
    fn = getattr(d, "context", None)
    return int(fn(rid)) if callable(fn) else 0


DrafterFactory = Callable[..., Drafter]
_REGISTRY: dict[str, DrafterFactory] = {}


def register_drafter(name: str) -> Callable[[DrafterFactory], DrafterFactory]:
    """Class decorator: make a drafter constructible by name (``create_drafter``)."""

    def deco(factory: DrafterFactory) -> DrafterFactory:
        if name in _REGISTRY:
            raise ValueError(f"drafter {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory

    return deco


def available_drafters() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def create_drafter(name: str, **options: Any) -> Drafter:
    """Instantiate a registered drafter. Options are the drafter's constructor arguments."""
    _load_builtin()
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise UnknownNameError(
            f"unknown drafter {name!r}; available: {', '.join(sorted(_REGISTRY))}"
        ) from None
    try:
        return factory(**options)
    except TypeError as e:
        raise UnknownNameError(f"bad options for drafter {name!r}: {e}") from None


def _load_builtin() -> None:
    # Importing the modules runs their @register_drafter decorators.
    import recallspec.drafters.draft_model
    import recallspec.drafters.lookup
    import recallspec.drafters.portfolio
    import recallspec.drafters.recycling
    import recallspec.drafters.retrieval
    import recallspec.drafters.sam  # noqa: F401
