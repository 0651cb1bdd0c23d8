"""Repetition penalties: the logits a token is taken from, given the text before it.

What each penalty counts (the one definition; ``SamplingParams`` holds the values):

* ``presence_penalty`` and ``frequency_penalty`` (OpenAI's): over the tokens generated so
  far, never the prompt (as OpenAI documents them), a token that occurred ``c > 0``
  times has ``c * frequency_penalty + presence_penalty`` subtracted from its logit.
* ``repeat_penalty`` (llama.cpp's ``penalty_repeat``): every distinct token among the
  last ``repeat_last_n`` tokens of prompt + generated text (llama.cpp's server feeds the
  prompt to its sampler, so its window reaches into the prompt too; -1: the whole text,
  0: off) has a positive logit divided by it and a non-positive one multiplied by it, so
  a penalty above 1 always makes the token less likely.

The repeat penalty is applied first, then presence and frequency (the order of
llama.cpp's penalties sampler and of vLLM). Temperature, top-k and top-p come after, on
the penalised logits; greedy decoding takes the penalised argmax.

Lossless speculation: a draft tree's row is penalised with the history that row has
under plain decoding, the committed tokens plus the draft tokens on the path to it
(``Penalties.apply(row, path)``), so a draft token at depth d is judged against the
distribution given the tokens before it. Each penalised logit is a function of its raw
value, its count in the whole history and whether it is in the window only, never of how
the history splits into committed tokens and draft path: the penalised row is the same
bits as plain decoding's, and speculative decoding stays token-identical (greedy) or
exactly distributed (sampling).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from recallspec.decoding.sampling import SamplingParams


@dataclass(frozen=True)
class Penalties:
    """One sequence's penalty context at the start of a step: what its committed text
    holds. Build it with ``of``; ``apply`` penalises one row given the draft path to it."""

    params: SamplingParams
    counts: Mapping[int, int]  # generated token -> occurrences ({} without presence/frequency)
    recent: tuple[int, ...]  # the repeat window's tokens before the step (() when off)

    @staticmethod
    def of(
        params: SamplingParams, prompt: Sequence[int], generated: Sequence[int]
    ) -> Penalties | None:
        """The context of a sequence that committed ``generated`` after ``prompt``; None
        when no penalty is on (the logits are used as they are)."""
        if not params.penalized:
            return None
        recent: tuple[int, ...] = ()
        n = params.repeat_last_n
        if _repeats(params):  # the last n of prompt + generated (n < 0: all of them)
            tail = generated if n < 0 else generated[-n:]
            head = prompt if n < 0 else prompt[max(len(prompt) - (n - len(tail)), 0):]
            recent = (*head, *tail)
        counts: Mapping[int, int] = (
            Counter(generated) if params.presence_penalty or params.frequency_penalty else {})
        return Penalties(params, counts, recent)

    def apply(self, logits: torch.Tensor | np.ndarray, path: Sequence[int] = ()) -> np.ndarray:
        """The penalised copy of one row of raw logits ([V], float32), whose token comes
        after the committed text and then ``path`` (the draft tokens from the root to the
        row's node, root side first; () for the root's row)."""
        if isinstance(logits, torch.Tensor):
            logits = logits.detach().float().cpu().numpy()
        out = np.array(logits, dtype=np.float32)  # a copy: the forward's rows stay raw
        p = self.params
        if _repeats(p):
            window = (*self.recent, *path)
            if p.repeat_last_n > 0:
                window = window[-p.repeat_last_n:]
            if window:
                ids = np.unique(np.asarray(window, dtype=np.int64))
                v = out[ids]
                r = np.float32(p.repeat_penalty)
                out[ids] = np.where(v > 0, v / r, v * r)
        if p.presence_penalty or p.frequency_penalty:
            counts = dict(self.counts)
            for t in path:
                counts[t] = counts.get(t, 0) + 1
            if counts:
                ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
                c = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
                out[ids] -= c * np.float32(p.frequency_penalty) + np.float32(p.presence_penalty)
        return out


def _repeats(params: SamplingParams) -> bool:
    """Whether the repeat penalty is on."""
    return params.repeat_penalty != 1.0 and params.repeat_last_n != 0
