"""Log-probabilities of generated tokens, as the API reports them.

Which distribution: the model's own. A token's log-probability is the log-softmax of the
raw logits row that chose it, before penalties, temperature, top-k and top-p (vLLM's
default, "raw logprobs"): it says what the model thinks of the token, whatever the
request's sampling settings, and greedy's chosen token has the largest one unless a
penalty moved the argmax.

Which row: the row of the forward that verified the token, at the token's position (the
root's row for the first token of a step, accepted node i's row for the token after it).
That row is bit-identical to the row plain decoding computes at the same position (the
kernels are row-local and batch-invariant), and ``token_logprob`` reads one row alone, so
the reported numbers are the same with and without drafts, alone or batched.

Under a grammar (``decoding/masks.py``) the row is masked first: the values are those of
the masked distribution (the log-softmax of the raw row over the allowed tokens), the
distribution the token was chosen from. A forbidden token never appears among the
alternatives, and a token the grammar forces has log-probability 0. The mask is a
function of the tokens before the row, so these values too are the same with and
without drafts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from recallspec.decoding.masks import Mask
from recallspec.decoding.masks import apply as apply_mask


@dataclass(frozen=True)
class TokenLogprob:
    token: int  # the generated token
    logprob: float  # its log-probability
    # The k most likely tokens of the row and their log-probabilities, most likely first
    # (equal logits: lower id first); () when no alternatives were asked for.
    top: tuple[tuple[int, float], ...] = ()


def token_logprob(logits: torch.Tensor | np.ndarray, token: int, k: int,
                  mask: Mask | None = None) -> TokenLogprob:
    """``token``'s log-probability under one row of raw logits ([V]), masked by ``mask``
    (one row's) if given, and the row's ``k`` most likely (allowed) tokens. In float64:
    the log-sum-exp over the vocabulary adds ~1e-16 relative rounding, far below what a
    client reads."""
    if isinstance(logits, torch.Tensor):
        logits = logits.detach().float().cpu().numpy()
    if mask is not None:
        logits = apply_mask(logits, mask)
    x = np.asarray(logits, dtype=np.float64)
    z = x - x.max()
    lse = float(np.log(np.exp(z).sum()))
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        k = min(k, len(x) if mask is None else int(np.isfinite(x).sum()))
        kth = np.partition(x, len(x) - k)[len(x) - k]  # the k-th largest value
        ids = np.flatnonzero(x >= kth)
        ids = ids[np.lexsort((ids, -x[ids]))][:k]  # by value, then id: canonical ties
        top = tuple((int(i), float(z[i]) - lse) for i in ids)
    return TokenLogprob(int(token), float(z[token]) - lse, top)
