"""The fake engine the benchmark tests run: the real ``Engine`` on a tiny deterministic
model (next token = a fixed permutation of the current one), fast and exact."""

from __future__ import annotations

import torch
from helpers import BigramModel, successor_model

from recallspec.engine import Engine, EngineConfig

V = 256


class FakeTokenizer:
    has_chat_template = False
    eos_token_ids = frozenset({0})

    def encode(self, text: str) -> list[int]:
        return [b or 1 for b in text.encode("utf-8")]

    def encode_prompt(self, text: str) -> list[int]:
        return self.encode(text)

    def decode(self, ids: list[int]) -> str:
        return bytes(int(i) for i in ids).decode("latin-1")


def FakeModel(seed: int = 0) -> BigramModel:
    """Logits put all mass on perm[token]: deterministic, cyclic, so PLD finds matches."""
    g = torch.Generator().manual_seed(seed)
    return successor_model(torch.randperm(V, generator=g))


def fake_engine() -> Engine:
    # mode="fixed": methods naming a drafter draft at fixed sizes unless they say mode=.
    return Engine(FakeModel(), FakeTokenizer(), EngineConfig(max_len=1024, mode="fixed"))
