"""Sampling parameters and the one place where logits become a distribution."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from recallspec import _kernels
from recallspec.decoding.masks import Guide
from recallspec.kernels import isa as _isa

MAX_LOGPROBS = 20  # alternatives per token at most (OpenAI's ``top_logprobs`` bound)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop. ``temperature == 0`` means greedy.

    Penalties change the distribution every token is taken from, greedy included, before
    temperature, top-k and top-p (``decoding/penalties.py`` says what each one counts).
    ``logprobs``: report each generated token's log-probability and this many most
    likely alternatives (None: none); they are the model's own (``decoding/logprobs.py``).
    ``guide``: the grammar the output must follow (``decoding/masks.py``); its mask acts
    after penalties, before temperature, top-k and top-p. EOS is allowed where the grammar
    accepts, so a guide and ``ignore_eos`` exclude each other.
    """

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()  # stop strings; the text is cut before the first match
    # Sampling's random source: the same seed gives the same tokens, whatever the drafts
    # and the batch (``verify_sampling``); None: a fresh one.
    seed: int | None = None
    ignore_eos: bool = False
    presence_penalty: float = 0.0  # OpenAI's, in [-2, 2]; 0 = off
    frequency_penalty: float = 0.0  # OpenAI's, in [-2, 2]; 0 = off
    repeat_penalty: float = 1.0  # llama.cpp's, > 0; 1 = off
    repeat_last_n: int = 64  # repeat_penalty's window (llama.cpp's): 0 = off, -1 = all
    logprobs: int | None = None  # 0..MAX_LOGPROBS alternatives; None = no logprobs
    guide: Guide | None = None  # the output's grammar; None = free text

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError("temperature must be >= 0")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:  # (NaN fails too)
                raise ValueError(f"{name} must be in [-2, 2]")
        if not 0.0 < self.repeat_penalty < math.inf:
            raise ValueError("repeat_penalty must be > 0 (1 = off)")
        if self.repeat_last_n < -1:
            raise ValueError("repeat_last_n must be >= -1 (-1 = the whole context)")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}]")
        if self.guide is not None and not isinstance(self.guide, Guide):
            raise ValueError("guide must be a decoding.masks.Guide")
        if self.guide is not None and self.ignore_eos:
            raise ValueError("ignore_eos cannot be combined with a grammar (the grammar "
                             "decides where the output may end)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether a penalty changes the logits (``decoding/penalties.py``)."""
        return bool(self.presence_penalty or self.frequency_penalty or (
            self.repeat_penalty != 1.0 and self.repeat_last_n != 0))


# A request's random source: numpy's (the engine's: a draw is far cheaper than torch.rand
# right after a forward, which pays a cold dispatch), a torch generator, or None for
# torch's global one (what a transformers user seeds with torch.manual_seed).
Rng = np.random.Generator | torch.Generator | None


def uniform(rng: Rng) -> float:
    """One float64 uniform in [0, 1) from ``rng``."""
    if isinstance(rng, np.random.Generator):
        return float(rng.random())
    return float(torch.rand((), dtype=torch.float64, generator=rng))


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Target distribution(s) for sampling: temperature, then top-k, then top-p.

    logits: [..., V] -> probabilities [..., V] (float32; float64 for float64 logits,
    which ``Weights`` passes where x / t overflows float32). The torch reference:
    ``Weights`` (what plain sampling and speculative verification draw from) uses it for
    top-k / top-p and computes the plain temperature softmax natively; tests compare
    the two.
    """
    x = (logits if logits.dtype == torch.float64 else logits.float()) / params.temperature
    if params.top_k and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        sorted_p = torch.softmax(sorted_x, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.softmax(x, dim=-1)


def inverse_cdf(p: torch.Tensor, u: float) -> int:
    """The index whose cumulative mass interval holds ``u`` (in [0, 1)) times the total
    (``Weights.draw`` where the torch reference computed the distribution).

    The cumulative sum is in float64, so the rounding it adds to each entry's probability
    (~1e-16 relative) is far below anything a sampling test could see. Zero-mass entries
    are never returned: the search (``right=True``) finds the first entry whose
    cumulative sum exceeds the target, and a zero-mass entry's sum equals the one before.
    """
    cdf = torch.cumsum(p, 0, dtype=torch.float64)
    i = int(torch.searchsorted(cdf, u * cdf[-1], right=True))
    if i >= len(p):  # u * total rounded up to the total: the last entry with mass
        i = int(torch.nonzero(p)[-1])
    return i


class Weights:
    """The target distribution of one row of logits as unnormalised weights: ``draw`` one
    token (what plain sampling and verification do, ``decoding/verify.py``), ``prob`` of a
    token, and ``remove`` a token (its mass set to 0, the rest implicitly renormalised:
    the residual distributions of rejection schemes; verification no longer uses them,
    it draws each position's token and compares it with the draft).

    Plain sampling (temperature only, a float32 CPU row) runs in the C++ kernels
    (``csrc/native/sample_bind.cpp``): w = exp(x / t - max(x) / t) in the native forward's exp,
    float64 sums by chunks of 64, so a removal re-adds one chunk and a draw walks the
    chunks then one chunk. That is three calls instead of ~8 torch operations over the
    vocabulary, which run cold after a forward has streamed the weights (on a small
    model more than a batched step's per-row share). Weights below e^-86 of the largest
    are exactly 0 (their probability is < 1e-37, and no test can see
    it). Top-k / top-p and other devices or dtypes use ``probabilities`` (the torch
    reference; in float64 where x / t overflows float32, as at a temperature of 1e-38:
    greedy in the limit). Either way plain sampling and speculative verification take
    their tokens from this one class, which is what keeps speculative sampling lossless.
    """

    def __init__(self, logits: torch.Tensor | np.ndarray, params: SamplingParams) -> None:
        """``logits``: one row [V], a tensor or a numpy array (verification passes numpy
        views of the forward's rows: indexing them costs no torch dispatch)."""
        if params.greedy:
            raise ValueError("Weights is for sampling (temperature > 0)")
        self._w: np.ndarray | None = None
        self._chunks: np.ndarray | None = None
        self._p: torch.Tensor | None = None
        if isinstance(logits, torch.Tensor) and logits.device.type == "cpu" and (
                logits.dtype == torch.float32):
            logits = logits.detach().numpy()
        n = logits.shape[-1]
        if (isinstance(logits, np.ndarray) and logits.ndim == 1
                and logits.dtype == np.float32 and logits.flags.c_contiguous
                and not (0 < params.top_k < n) and params.top_p >= 1.0):
            w = np.empty(n, dtype=np.float32)
            chunks = np.empty((n + 63) // 64, dtype=np.float64)
            try:
                self.total = float(_kernels.sample_weights(
                    logits, params.temperature, w, chunks, _isa.code()))
            except OverflowError:  # the largest logit / t overflows float32: the
                pass  # reference below, which then recomputes in float64
            except ValueError as e:
                raise ValueError(f"cannot sample: {e}") from None
            else:
                self._w, self._chunks = w, chunks
                return
        if isinstance(logits, np.ndarray):
            logits = torch.from_numpy(logits)
        self._p = probabilities(logits, params)
        self.total = float(self._p.sum(dtype=torch.float64))
        if not math.isfinite(self.total) and self._p.dtype != torch.float64:
            self._p = probabilities(logits.double(), params)  # x / t overflowed float32
            self.total = float(self._p.sum())
        if not self.total > 0.0:
            raise ValueError("cannot sample: the logits give no distribution (NaN?)")

    def prob(self, token: int) -> float:
        """The token's probability under the current (residual) distribution."""
        w = self._w[token] if self._w is not None else self._p[token]  # type: ignore[index]
        return float(w) / self.total

    def remove(self, token: int) -> None:
        """Give the token probability 0 (a rejected draft): the residual distribution."""
        if self._w is not None:
            self.total = float(_kernels.sample_remove(self._w, self._chunks, token, _isa.code()))
        else:
            assert self._p is not None
            self._p[token] = 0.0
            self.total = float(self._p.sum(dtype=torch.float64))

    def draw(self, generator: Rng) -> int:
        """One token from the current distribution: one float64 uniform, inverse CDF."""
        u = uniform(generator)
        if self._w is not None:
            return int(_kernels.sample_draw(self._w, self._chunks, u))
        assert self._p is not None
        return inverse_cdf(self._p, u)
