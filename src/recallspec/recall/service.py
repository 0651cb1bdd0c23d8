"""The recall service the engine owns: the response memory and the live corpora.

``RecallSources`` owns both (and the scratch directory their run-time automata live
in), decides what a request may see (``view``: its tenant's memory unless the service
or the request turned it off, plus every ready corpus) and feeds the memory when a
request ends normally (``remember``: a queue append, never a build). It is configured
by a ``RecallConfig`` the engine builds from its own config (``EngineConfig.recall``)
and reads requests only through the ``RecallRequest`` protocol, so this layer never
imports the engine. ``Engine`` delegates ``recall_view``, ``memory_stats``,
``save_memory`` and ``close`` here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol

from recallspec.errors import DataError
from recallspec.recall.live_corpora import CorpusRegistry
from recallspec.recall.memory import ResponseMemory, load_snapshot, save_snapshot
from recallspec.recall.view import RecallView, ScratchDir


@dataclass(frozen=True)
class RecallConfig:
    """The response memory's settings, validated here once. The defaults and their
    meaning are ``EngineConfig``'s (``engine/config.py``), which builds this."""

    memory_tokens: int  # each tenant's token budget; 0: no response memory
    memory_prompts: bool  # keep whole prompts, not only their last memory_prompt_tail
    memory_prompt_tail: int
    memory_segments: int  # a tenant's memory is a ring of at most this + 1 automata
    memory_max_tenants: int  # past this many, the least recently fed tenant is forgotten
    memory_snapshot: str | None  # loaded at start when it exists; ``save``'s default

    def __post_init__(self) -> None:
        if (self.memory_tokens < 0 or self.memory_prompt_tail < 0 or self.memory_segments < 1
                or self.memory_max_tenants < 1):
            raise ValueError("memory_tokens and memory_prompt_tail must be >= 0, "
                             "memory_segments and memory_max_tenants >= 1")
        if self.memory_snapshot is not None and not self.memory_tokens:
            raise ValueError("memory_snapshot needs the response memory (memory_tokens > 0)")


class RecallRequest(Protocol):
    """What the service reads of a request (the engine's ``Request`` has all of it)."""

    @property
    def tenant(self) -> str: ...  # the memory partition it reads and feeds
    @property
    def use_memory(self) -> bool: ...
    @property
    def prompt(self) -> list[int]: ...
    @property
    def output_ids(self) -> list[int]: ...
    @property
    def finish_reason(self) -> str | None: ...  # "abort" / "error": it fed nothing


class RecallSources:
    def __init__(self, config: RecallConfig, tokenizer: Any, vocab_size: int) -> None:
        self.config = config
        self._scratch = ScratchDir()
        self.corpora = CorpusRegistry(tokenizer, vocab_size, self._scratch)
        self.memory: ResponseMemory | None = None
        if config.memory_tokens:
            self.memory = ResponseMemory(
                config.memory_tokens, vocab_size, getattr(tokenizer, "fingerprint", None),
                segments=config.memory_segments, max_tenants=config.memory_max_tenants,
                scratch=self._scratch)
            snap = config.memory_snapshot
            if snap is not None and os.path.exists(snap):  # absent: the first run
                docs = load_snapshot(snap, self.memory.fingerprint, vocab_size)
                for tenant, tenant_docs in docs.items():
                    self.memory.add_documents(tenant, tenant_docs)

    def view(self, req: RecallRequest | None) -> RecallView:
        """What a running request may draft from (immutable snapshots only)."""
        corpora = self.corpora.view()
        if req is None or self.memory is None or not req.use_memory:
            return (corpora,)
        return (self.memory.view(req.tenant), corpora)

    def remember(self, req: RecallRequest) -> None:
        """A request that ended normally feeds its tenant's memory (queued: O(1)); an
        aborted or failed one does not."""
        if (self.memory is None or not req.use_memory or not req.output_ids
                or req.finish_reason in ("abort", "error")):
            return
        cfg = self.config
        tail = len(req.prompt) if cfg.memory_prompts else min(cfg.memory_prompt_tail,
                                                              len(req.prompt))
        self.memory.add(req.tenant, req.prompt[len(req.prompt) - tail:] + req.output_ids)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"enabled": self.memory is not None}
        out.update(self.memory.stats() if self.memory is not None else {
            "budget_tokens": 0, "tokens": 0, "segments": 0, "bytes": 0, "tenants": {}})
        out["corpora"] = self.corpora.stats()
        return out

    def save(self, path: str | os.PathLike[str] | None) -> int:
        if self.memory is None:
            raise DataError("the response memory is off (memory_tokens=0)")
        path = path if path is not None else self.config.memory_snapshot
        if path is None:
            raise DataError("no snapshot path: pass one or set memory_snapshot")
        return save_snapshot(path, self.memory.documents(), self.memory.fingerprint,
                             self.memory.vocab_size)

    def close(self) -> None:
        if self.memory is not None:
            self.memory.close()
        self.corpora.close()
        self._scratch.close()
