"""The engine's recall sources: the response memory and the live corpora.

``RecallSources`` owns both (and the scratch directory their run-time automata live
in), decides what a request may see (``view``: its tenant's memory unless the engine
or the request turned it off, plus every ready corpus) and feeds the memory when a
request ends normally (``remember``: a queue append, never a build). ``Engine``
delegates ``recall_view``, ``memory_stats``, ``save_memory`` and ``close`` here.
"""

from __future__ import annotations

import os
from typing import Any

from recallspec.engine.config import EngineConfig
from recallspec.engine.corpora import CorpusRegistry
from recallspec.engine.request import Request
from recallspec.errors import DataError
from recallspec.index.memory import ResponseMemory
from recallspec.index.memory_snapshot import load_snapshot, save_snapshot
from recallspec.index.recall import RecallView, ScratchDir


class RecallSources:
    def __init__(self, config: EngineConfig, tokenizer: Any, vocab_size: int) -> None:
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

    def view(self, req: Request | None) -> RecallView:
        """What a running request may draft from (immutable snapshots only)."""
        corpora = self.corpora.view()
        if req is None or self.memory is None or not req.use_memory:
            return (corpora,)
        return (self.memory.view(req.tenant), corpora)

    def remember(self, req: Request) -> None:
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
