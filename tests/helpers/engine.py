"""Engines on the bigram test double (``helpers.BigramModel``) with byte tokenizers, and
the prompts the engine, drafter and datastore tests run them on."""

from __future__ import annotations

from typing import Any

import torch
from helpers import BigramModel, ByteTokenizer

from recallspec.engine import Engine, EngineConfig

PROMPTS = [b"abcabcabcab", b"hello hello hello", b"xyz", b"the cat sat on the mat; the cat"]
FP = "byte-tokenizer-test"


def make_engine(v: int = 256, seed: int = 0, **cfg: object) -> Engine:
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(v, v, generator=g) * 3
    cfg.setdefault("mode", "fixed")  # named drafters at fixed sizes unless a test says
    return Engine(BigramModel(table), ByteTokenizer(), EngineConfig(**cfg))  # type: ignore[arg-type]


def chain_engine() -> Engine:
    """An engine whose bigram model decodes 1 -> 2 -> 3 -> 4 -> EOS (id 0) with certainty
    (every other next token 20 logits lower), named drafters at fixed sizes."""
    v = 8
    table = torch.full((v, v), -10.0)
    for a, b in [(1, 2), (2, 3), (3, 4), (4, 0)]:
        table[a, b] = 10.0
    return Engine(BigramModel(table), ByteTokenizer(),  # type: ignore[arg-type]
                  EngineConfig(mode="fixed"))


class FingerprintedBytes(ByteTokenizer):
    fingerprint = FP


def bigram_table(v: int = 256, seed: int = 0) -> torch.Tensor:
    return torch.randn(v, v, generator=torch.Generator().manual_seed(seed)) * 3


def make_fingerprinted_engine(**cfg: Any) -> Engine:
    """An engine whose tokenizer has the fingerprint ``FP``, so it accepts the indexes and
    datastores the tests build with it."""
    cfg.setdefault("max_draft_nodes", 60)
    cfg.setdefault("mode", "fixed")  # named drafters at fixed sizes unless a test says
    return Engine(BigramModel(bigram_table()), FingerprintedBytes(), EngineConfig(**cfg))
