"""AR decoding timed as the speed benchmarks time it, and the weight bytes a decode step
reads.

``bench runtime`` and ``bench scale``'s child (``bench/scale/ours.py``) time our engine the
same way: ``n`` greedy tokens after the same prompt (``prompt_ids``), EOS ignored, no
drafter, each run from a cold prefill; end to end is time(n), decode only (time(n) -
time(1)) over the n - 1 tokens after the first (``ar_rates``). Achieved bandwidth is the
bytes one decode step reads (``weight_bytes_per_token``: every parameter once, the
embedding table one row unless it is also the head) over the decode time per token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from recallspec.bench.common.prompting import conversation_ids
from recallspec.cost.calibration import median_time
from recallspec.cost.expert_counts import expert_bytes
from recallspec.decoding.sampling import SamplingParams
from recallspec.errors import DataError

PROMPT_TOKENS = 100
# The prompt text repeats until it has PROMPT_TOKENS tokens (written for this project).
_PROMPT_TEXT = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle. "
    "The story should describe the island, the weather, the keeper's daily routine and "
    "the moment the bottle arrives, and end with the keeper deciding what to do next. "
)


def prompt_ids(tokenizer: Any) -> list[int]:
    """The benchmarks' prompt (``_PROMPT_TEXT`` repeated to at least ``PROMPT_TOKENS``
    tokens) as chat-template token ids: what AR decoding is timed after."""
    ids: list[int] = []
    text = _PROMPT_TEXT
    while len(ids) < PROMPT_TOKENS:
        ids = conversation_ids(tokenizer, [text], [])
        text += _PROMPT_TEXT
    return ids


def engine_ar(engine: Any, ids: list[int], n: int, repeats: int) -> dict[str, float]:
    """AR decoding of ``engine``, end to end and decode only (seconds, tok/s, ms/token):
    ``n`` greedy tokens after ``ids``, EOS ignored, no drafter; each the median of
    ``repeats`` runs of n and of 1 token, each from a cold prefill (no prefix reuse)."""
    def gen(k: int) -> Callable[[], Any]:
        p = SamplingParams(max_new_tokens=k, ignore_eos=True)
        return lambda: engine.generate(ids, p, drafter="none", prefix_cache=False)

    t_n = median_time(gen(n), repeats)
    t_1 = median_time(gen(1), repeats)
    return ar_rates(t_n, t_1, n)


def ar_rates(t_n: float, t_1: float, n: int) -> dict[str, float]:
    """End-to-end and decode-only rates of ``n`` tokens from time(n) and time(1)."""
    dec = max(t_n - t_1, 1e-9)
    return {"e2e_s": t_n, "prefill_s": t_1, "e2e_tok_s": n / t_n,
            "decode_tok_s": (n - 1) / dec, "decode_ms_per_tok": 1000 * dec / (n - 1)}


def weight_bytes_per_token(model: torch.nn.Module, vocab: int, hidden: int) -> dict[str, int]:
    """Bytes of parameters one decode step reads (shared tensors counted once).

    A [vocab, hidden] matrix is the lm_head (read whole) or the input embedding (one row
    read); with tied embeddings the single such tensor is the lm_head.
    """
    seen: set[int] = set()
    tables: list[torch.Tensor] = []
    other = 0
    # Our model keeps weights as buffers (inference only); a peer's are parameters.
    for p in [*model.parameters(), *model.buffers()]:
        if p.data_ptr() in seen or not p.is_floating_point():
            continue
        seen.add(p.data_ptr())
        if p.ndim == 2 and tuple(p.shape) == (vocab, hidden):
            tables.append(p)
        else:
            other += p.numel() * p.element_size()
    if not tables:
        raise DataError("could not find the embedding / lm_head matrix")
    es = tables[0].element_size()
    lm_head = vocab * hidden * es
    embed_row = hidden * es
    return {"total": other + lm_head + embed_row, "lm_head": lm_head, "other": other,
            "tied": int(len(tables) == 1)}


def quantized_bytes_per_token(model: Any) -> dict[str, int]:
    """``weight_bytes_per_token`` for a model whose matrices are ``QuantizedWeight``s. A
    mixture of experts' token reads ``experts_per_token`` of each layer's experts (every
    expert of a layer is the same size): ``experts`` is all their resident bytes (biases included),
    ``experts_read`` what one token reads of them, in ``total`` and ``other``."""
    resident = int(model.weight_bytes())
    embed, head = model.embed_w, model.lm_head_w
    row = embed.nbytes // embed.n  # one embedding row per token
    tied = int(embed is head)
    other = resident - head.nbytes - (0 if tied else embed.nbytes)
    experts = read = 0
    c = model.config
    if c.moe:
        experts = expert_bytes(model)
        read = experts * c.experts_per_token // c.num_experts
        other += read - experts
    out = {"total": other + head.nbytes + row, "lm_head": int(head.nbytes), "other": other,
           "tied": tied}
    if c.moe:
        out |= {"experts": experts, "experts_read": read}
    return out
