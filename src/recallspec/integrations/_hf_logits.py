"""transformers' logits processors and stopping criteria, applied per row and tree node.

``generate`` calls its processors once per step on the whole batch, every row with the
same length. Here rows advance at their own pace and a step scores a whole draft tree,
so a processor is called with the context each score row really has: the row's output
so far (left padding included, as ``generate`` keeps it) plus the path to the node.
Processors that keep per-batch-row state get that row's slice (``row_processors``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch

from recallspec.decoding.tree import DraftTree
from recallspec.integrations import _hf_tree as ht

if TYPE_CHECKING:
    from transformers import LogitsProcessorList, StoppingCriteriaList

# Processors whose batch layout cannot be reproduced one row at a time (classifier-free
# guidance doubles the batch; the others belong to audio models or keep hidden state).
_REFUSED = (
    "ClassifierFreeGuidanceLogitsProcessor", "UnbatchedClassifierFreeGuidanceLogitsProcessor",
    "SynthIDTextWatermarkLogitsProcessor", "WhisperTimeStampLogitsProcessor",
    "WhisperNoSpeechDetection", "AlternatingCodebooksLogitsProcessor",
    "BarkEosPrioritizerLogitsProcessor", "DiaClassifierFreeGuidanceLogitsProcessor",
    "DiaEOSChannelFilterLogitsProcessor", "DiaEOSDelayPatternLogitsProcessor",
)


def row_processors(processor: LogitsProcessorList | None, batch: int) -> list[Any]:
    """One processor list per batch row, each to be called with that row's contexts
    only: a repetition penalty's per-row prompt offset becomes the row's own, and a
    ``prefix_allowed_tokens_fn`` sees the row's batch id."""
    from transformers import LogitsProcessorList
    from transformers.generation.logits_process import (
        PrefixConstrainedLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
    )

    procs = list(processor or [])
    for p in procs:
        if type(p).__name__ in _REFUSED:
            raise NotImplementedError(
                f"recallspec custom_generate: {type(p).__name__} is not supported")
    out = []
    for r in range(batch):
        row = []
        for p in procs:
            offsets = getattr(p, "prompt_ignore_length", None)
            if isinstance(p, RepetitionPenaltyLogitsProcessor) and isinstance(
                    offsets, torch.Tensor):
                p = copy.copy(p)
                p.prompt_ignore_length = int(offsets[r])
            elif isinstance(p, PrefixConstrainedLogitsProcessor):
                p = copy.copy(p)
                p._prefix_allowed_tokens_fn = _with_batch_id(p._prefix_allowed_tokens_fn, r)
            row.append(p)
        out.append(LogitsProcessorList(row))
    return out


def _with_batch_id(fn: Callable[[int, torch.Tensor], Any], r: int) -> Callable[..., Any]:
    """``fn`` called with batch id r whatever batch id it is given."""
    return lambda _, sent: fn(r, sent)


def process(
    processor: LogitsProcessorList, prefix: torch.Tensor, tree: DraftTree, logits: torch.Tensor,
) -> torch.Tensor:
    """``processor`` applied to each tree row's logits with that row's own context
    (``prefix`` [1, T] + the path to the node), nodes of equal depth in one call."""
    if not processor:
        return logits
    d = ht.depths(tree)
    paths: list[list[int]] = [[]]
    for i, p in enumerate(tree.parents.tolist()):
        paths.append([*paths[p + 1], int(tree.tokens[i])])
    out = torch.empty_like(logits)
    for depth in sorted(set(d.tolist())):
        rows = [r for r in range(len(d)) if d[r] == depth]
        ext = torch.tensor([paths[r] for r in rows], dtype=prefix.dtype, device=prefix.device)
        ids = torch.cat([prefix.expand(len(rows), -1), ext.reshape(len(rows), depth)], 1)
        out[rows] = processor(cast(torch.LongTensor, ids), logits[rows])
    return out


class Stops:
    """``stopping_criteria`` applied after every committed token, as ``generate`` does.
    max_length and eos criteria are read once and checked on the host; any other
    criterion is called on the row's sequence so far."""

    def __init__(self, criteria: StoppingCriteriaList, max_length: int) -> None:
        from transformers.generation.stopping_criteria import (
            EosTokenCriteria,
            MaxLengthCriteria,
        )

        self.max_length = max_length
        self.eos: set[int] = set()
        self.others: list[Any] = []
        # generate pads finished rows only when some criterion is about eos (its test).
        self.pads = any(hasattr(c, "eos_token_id") for c in criteria)
        for c in criteria:
            if isinstance(c, MaxLengthCriteria):
                self.max_length = min(self.max_length, int(c.max_length))
            elif isinstance(c, EosTokenCriteria):
                self.eos.update(int(t) for t in c.eos_token_id.reshape(-1).tolist())
            else:
                self.others.append(c)

    def __call__(self, seq: torch.Tensor) -> bool:
        """seq: [1, T] the row's output so far (left padding included)."""
        if int(seq[0, -1]) in self.eos or seq.shape[1] >= self.max_length:
            return True
        return any(bool(c(seq, None).any()) for c in self.others)
