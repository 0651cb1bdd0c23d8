"""``portfolio``: several recalled drafts each step; cost-aware sizing drafts the best.

Each step the drafter offers candidates (``candidates(rid, max_nodes)``, which the
adaptive planner reads, ``step/planner.py``), each with its own draft context (its
kind and the bucket of the request's longest match ``l_d``), so the planner learns each
kind's acceptance separately and drafts the one promising the most tokens per second:

* ``sam`` - the SAM automaton's chain, as ``sam`` drafts it: the continuation of the
  longest suffix match, from its *earliest* occurrence in the request's text (or from the
  corpus index / response memory when their match is clearly longer);
* ``latest`` - the continuation of the *most recent* earlier occurrence of the text's
  last ``min(l_d, ngram)`` tokens (prompt lookup's rule): text that repeats tends to
  repeat its latest form (a list being continued, a loop in generated text). The two
  chains are right on different steps: on Spec-Bench (SmolLM2) an oracle drafting the
  right one of them beats either alone (``docs/policy_analysis.md``);
* ``recycling`` (with ``recycling=true``) - the Token Recycling tree, which learns from
  every verification's logits (a top-k over the vocabulary per verified row: on a small
  model on a CPU that costs about what its drafts save).

Both chains are offered even where they agree (see ``candidates``).
With fixed sizing ``propose`` drafts the first candidate: the automaton's chain,
else the latest occurrence's, else recycling's tree.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from recallspec.decoding.tree import DraftTree
from recallspec.drafters.lookup import LookupDrafter
from recallspec.drafters.recycling import TOPK, RecyclingDrafter
from recallspec.drafters.sam import (
    N_BUCKETS,
    SOURCES,
    SamDrafter,
    SamOptions,
    length_bucket,
    sam_options,
)
from recallspec.recall.automata import StaticIndex

# Candidate kinds beyond SAM's sources; their contexts follow SAM's.
LATEST, RECYCLED = "latest", "recycled"
KINDS = (LATEST, RECYCLED)


class PortfolioDrafter(SamDrafter):
    """See the module docstring."""

    name = "portfolio"
    contexts = (len(SOURCES) + len(KINDS)) * N_BUCKETS
    offers_candidates = True

    def __init__(
        self, options: SamOptions, *, ngram: int = 4, recycling: bool = False,
        template: str = "sam60", k: int = TOPK, static: StaticIndex | None = None,
    ) -> None:
        super().__init__(options, static)
        if ngram < 1:
            raise ValueError("ngram must be >= 1")
        self.latest = LookupDrafter(max_ngram=ngram, min_ngram=1,
                                    max_tokens=options.max_tokens, name=LATEST)
        self.recycling = RecyclingDrafter(template=template, k=k) if recycling else None
        self.needs_logits = recycling  # only recycling learns from verification logits

    def start(self, rid: int, prompt: Sequence[int]) -> None:
        super().start(rid, prompt)
        self.latest.start(rid, prompt)
        if self.recycling is not None:
            self.recycling.start(rid, prompt)

    def observe(
        self, rid: int, accepted: Sequence[int], tree: DraftTree, logits: torch.Tensor | None
    ) -> None:
        super().observe(rid, accepted, tree, logits)
        self.latest.observe(rid, accepted, tree, None)
        if self.recycling is not None:
            self.recycling.observe(rid, accepted, tree, logits)

    def stop(self, rid: int) -> None:
        super().stop(rid)
        self.latest.stop(rid)
        if self.recycling is not None:
            self.recycling.stop(rid)

    def _kind_context(self, kind: str, length: int) -> int:
        return (len(SOURCES) + KINDS.index(kind)) * N_BUCKETS + length_bucket(length)

    def candidates(self, rid: int, max_nodes: int) -> list[tuple[int, DraftTree]]:
        """(draft context, tree) per kind that has a draft. Both chains are offered even
        where they agree: each kind's statistics then cover all its steps, and the
        planner drafts the agreed tokens as far as the more confident kind supports
        (dropping the duplicate, or giving agreement a context of its own, replayed
        slower on Spec-Bench: ``docs/policy_analysis.md``)."""
        st = self._states[rid]
        out: list[tuple[int, DraftTree]] = []
        n = min(max_nodes, self.options.max_tokens)
        sam, source, length = self._automaton_draft(st, max_nodes)
        if len(sam):
            out.append((SOURCES.index(source) * N_BUCKETS + length_bucket(length), sam))
        l_d = self._dynamic_length(st)
        if l_d > 0:  # no earlier occurrence of even the last token: nothing to look up
            latest = self.latest.propose(rid, n)
            if len(latest):
                out.append((self._kind_context(LATEST, l_d), latest))
        if self.recycling is not None:
            rec = self.recycling.propose(rid, n)
            if len(rec):
                out.append((self._kind_context(RECYCLED, l_d), rec))
        return out

    def propose(self, rid: int, max_nodes: int) -> DraftTree:
        got = self.candidates(rid, max_nodes)
        return got[0][1] if got else DraftTree.empty()

    def context(self, rid: int) -> int:
        """The context of ``propose``'s draft (its first candidate's)."""
        got = self.candidates(rid, self.options.max_tokens)
        return got[0][0] if got else super().context(rid)


def make_portfolio(
    *, index: str | os.PathLike[str] | StaticIndex | None = None, max_tokens: int = 40,
    delta: int = 5, memory_delta: int = 0, tree: bool = False, ngram: int = 4,
    recycling: bool = False, template: str = "sam60", k: int = TOPK, dynamic: bool = True,
    tokenizer_fingerprint: str | None = None,
) -> PortfolioDrafter:
    opts, static = sam_options(index, max_tokens=max_tokens, delta=delta,
                            memory_delta=memory_delta, tree=tree, dynamic=dynamic,
                            tokenizer_fingerprint=tokenizer_fingerprint)
    return PortfolioDrafter(opts, ngram=ngram, recycling=recycling, template=template, k=k,
                            static=static)
