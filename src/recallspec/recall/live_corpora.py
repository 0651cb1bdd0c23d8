"""Live corpora: operator text added to and removed from a running engine.

``Engine.corpora`` is a ``CorpusRegistry``. A corpus is documents given as text (the
registry tokenizes them and builds a static automaton), a file of documents
(``add_file``: ``.txt``, ``.json``, ``.jsonl``, optionally ``.gz``, read by
``data/corpus_files.py``) or an index file built offline by ``recallspec index build``
(``add_index``, or ``add_file`` for any other name; checked against the engine's
tokenizer at once - header, fingerprint, vocabulary: an O(1) read - and its payload
checksum verified in the background). Loading runs in one background thread: the
caller gets a ``CorpusInfo`` with status "loading" at once, and the corpus turns
"ready" (or "failed", with the reason) later. Every tenant's requests draft from every
ready corpus (source ``corpus``): corpora are operator data, not tenant data.

Decoding never waits for a load: drafters read ``view()``, an immutable tuple of the
ready corpora replaced as a whole (under the lock, read without it) when a corpus turns
ready or is removed. A running request keeps its cursor into a removed corpus's
automaton until its next commit (the mapping lives while a cursor does), then drops it.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from itertools import count
from pathlib import Path
from typing import Any

import numpy as np

from recallspec.data.corpus_files import iter_documents
from recallspec.errors import DataError
from recallspec.recall.automata import StaticIndex
from recallspec.recall.view import CORPUS, RecallSource, ScratchDir, flatten
from recallspec.recall.worker import ensure_worker

MAX_CORPORA = 32  # each ready corpus costs every running request a cursor advance per step
ENCODE_BATCH = 64  # documents per tokenizer call (a removal is noticed between batches)
KINDS = ("documents", "index")
STATUSES = ("loading", "ready", "failed")
# Files read as documents by ``add_file``; any other name is taken as an index file.
DOCUMENT_SUFFIXES = (".txt", ".json", ".jsonl")


@dataclass(frozen=True)
class CorpusInfo:
    id: str
    name: str
    kind: str  # "documents" | "index"
    tokens: int  # tokens in the automaton (0 while documents are being tokenized)
    status: str  # "loading" | "ready" | "failed"
    error: str | None  # why it failed
    created: float  # time.time() it was added

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Loader = Callable[[Callable[[], bool]], StaticIndex]  # (cancelled?) -> the built index


class CorpusRegistry:
    """See the module docstring. Thread-safe: a server may call it from any thread."""

    def __init__(self, tokenizer: Any, vocab_size: int, scratch: ScratchDir | None = None) -> None:
        self._tokenizer = tokenizer
        self._vocab = vocab_size
        self._scratch = scratch or ScratchDir()
        self._cond = threading.Condition()
        self._infos: dict[str, CorpusInfo] = {}  # added and not removed, in order
        self._sources: dict[str, RecallSource] = {}  # the ready ones
        self._view: tuple[RecallSource, ...] = ()  # published: the ready ones' sources
        self._jobs: deque[tuple[str, Loader]] = deque()
        self._thread: threading.Thread | None = None
        self._ids = count(1)
        self._closed = False

    # ---- adding ------------------------------------------------------------------------
    def add_documents(self, name: str, texts: Sequence[str]) -> CorpusInfo:
        """Tokenize ``texts`` (one document each) and build an automaton, in the
        background. ``DataError`` at once for no documents or only empty ones."""
        if isinstance(texts, str) or not isinstance(texts, list | tuple) or not all(
                isinstance(t, str) for t in texts):
            raise DataError("a corpus's documents must be a list of strings")
        if not any(t.strip() for t in texts):
            raise DataError(f"corpus {name!r} is empty: no text in its {len(texts)} documents")
        docs = list(texts)
        return self._submit(name, "documents", 0, lambda cancelled: self._build(docs, cancelled))

    def add_index(self, name: str, path: str | os.PathLike[str], *,
                  verify: bool = True) -> CorpusInfo:
        """Attach an index file built offline. Its header is checked at once (an
        ``IndexFileError`` for a missing, truncated or foreign file, or one built with
        another tokenizer); with ``verify`` the payload checksum is verified in the
        background (a mismatch fails the corpus)."""
        fp = self._fingerprint()
        p = os.fspath(path)
        index = StaticIndex.open(p, expected_fingerprint=fp, expected_vocab_size=self._vocab)
        if index.n_tokens == 0:
            raise DataError(f"{p}: the index holds no tokens")

        def load(cancelled: Callable[[], bool]) -> StaticIndex:
            if not verify:
                return index
            return StaticIndex.open(p, expected_fingerprint=fp, verify=True,
                                    expected_vocab_size=self._vocab)

        return self._submit(name, "index", index.n_tokens, load)

    def add_file(self, name: str, path: str | os.PathLike[str]) -> CorpusInfo:
        """A corpus from a file: a file of documents (``is_document_file``) is read here,
        at once, then tokenized and built like ``add_documents``; any other file is an
        index (``add_index``). A ``RecallspecError`` naming the file when it does not
        read, holds no text or is not a usable index."""
        p = Path(path)
        if is_document_file(p):
            return self.add_documents(name, read_documents(p))
        return self.add_index(name, p)

    def _submit(self, name: str, kind: str, tokens: int, load: Loader) -> CorpusInfo:
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise DataError("a corpus needs a name (1 to 200 characters)")
        with self._cond:
            if self._closed:
                raise DataError("the engine is closed")
            if len(self._infos) >= MAX_CORPORA:
                raise DataError(f"at most {MAX_CORPORA} corpora; remove one first")
            cid = f"corpus-{next(self._ids)}"
            info = self._infos[cid] = CorpusInfo(cid, name, kind, tokens, "loading", None,
                                                 time.time())
            self._jobs.append((cid, load))
            ensure_worker(self, "recallspec-corpora")
            self._cond.notify_all()
        return info

    # ---- the rest of the API -------------------------------------------------------------
    def remove(self, corpus_id: str) -> CorpusInfo:
        """Detach a corpus (a loading one is abandoned): no request drafts from it after
        its next commit. ``DataError`` for an unknown id."""
        with self._cond:
            info = self._infos.pop(corpus_id, None)
            if info is None:
                raise DataError(f"unknown corpus id {corpus_id!r}")
            if self._sources.pop(corpus_id, None) is not None:
                self._view = tuple(self._sources.values())
            self._cond.notify_all()
        return info

    def get(self, corpus_id: str) -> CorpusInfo:
        with self._cond:
            info = self._infos.get(corpus_id)
        if info is None:
            raise DataError(f"unknown corpus id {corpus_id!r}")
        return info

    def list(self) -> list[CorpusInfo]:
        with self._cond:
            return list(self._infos.values())

    def wait(self, corpus_id: str, timeout: float | None = None) -> CorpusInfo:
        """Wait until the corpus is no longer loading (or removed); its info then (the
        last one, still "loading", on timeout). ``DataError`` for an unknown id."""
        with self._cond:
            self._cond.wait_for(lambda: corpus_id not in self._infos
                                or self._infos[corpus_id].status != "loading", timeout)
        return self.get(corpus_id)

    def view(self) -> tuple[RecallSource, ...]:
        """The ready corpora (an immutable tuple; a reference read, no lock)."""
        return self._view

    def stats(self) -> dict[str, Any]:
        with self._cond:
            srcs = list(self._sources.values())
            return {"count": len(self._infos), "ready": len(srcs),
                    "loading": sum(i.status == "loading" for i in self._infos.values()),
                    "tokens": sum(s.tokens for s in srcs), "bytes": sum(s.bytes for s in srcs)}

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._infos.clear()
            self._sources.clear()
            self._view = ()
            self._jobs.clear()
            self._cond.notify_all()

    # ---- the loader thread (``recall/worker.py``) ------------------------------------------
    def _next_job(self) -> tuple[str, Loader] | None:
        while self._jobs:
            cid, load = self._jobs.popleft()
            if cid in self._infos:  # else removed before it started
                return cid, load
        return None

    def _do(self, job: tuple[str, Loader]) -> None:
        cid, load = job
        try:
            index: StaticIndex | None = load(partial(self._removed, cid))
            error = None
        except Exception as e:  # the corpus fails, the engine goes on
            index = None
            error = str(e) or type(e).__name__
        with self._cond:
            info = self._infos.get(cid)
            if info is not None:  # else removed meanwhile: drop what was built
                if index is None:
                    self._infos[cid] = replace(info, status="failed", error=error)
                else:
                    self._sources[cid] = RecallSource(CORPUS, cid, index)
                    self._view = tuple(self._sources.values())
                    self._infos[cid] = replace(info, status="ready", tokens=index.n_tokens)
            self._cond.notify_all()

    def _removed(self, corpus_id: str) -> bool:
        return corpus_id not in self._infos  # a dict lookup: no lock needed under the GIL

    def _build(self, texts: builtins.list[str], cancelled: Callable[[], bool]) -> StaticIndex:
        """Tokenize (in batches, so a removal stops it early) and build."""
        encode_batch = getattr(self._tokenizer, "encode_batch", None)
        docs = []
        for i in range(0, len(texts), ENCODE_BATCH):
            if cancelled():
                raise DataError("removed while loading")
            batch = texts[i : i + ENCODE_BATCH]
            ids = (encode_batch(batch) if callable(encode_batch)
                   else [self._tokenizer.encode(t) for t in batch])
            docs += [np.asarray(d, np.uint32) for d in ids if len(d)]
        if not docs:
            raise DataError("empty corpus: its documents encode to no tokens")
        tokens, offsets = flatten(docs)
        if int(tokens.max()) >= self._vocab:
            raise DataError("the tokenizer produced ids outside the model's vocabulary")
        fp = ""
        with contextlib.suppress(DataError):
            fp = self._fingerprint()
        return self._scratch.build(tokens, offsets, self._vocab, fp)

    def _fingerprint(self) -> str:
        fp = getattr(self._tokenizer, "fingerprint", None)
        if not fp:
            raise DataError("the engine's tokenizer has no fingerprint: an index file "
                            "cannot be checked against it")
        return str(fp)


def is_document_file(path: Path) -> bool:
    """Whether ``add_file`` reads ``path`` as documents (else as an index file)."""
    return path.name.lower().removesuffix(".gz").endswith(DOCUMENT_SUFFIXES)


def read_documents(path: Path) -> list[str]:
    """The non-blank documents of a corpus file; a ``RecallspecError`` naming the file
    when they do not read or hold no text."""
    try:
        docs = [d for d in iter_documents(path) if d.strip()]
    except (UnicodeDecodeError, OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read ({e})") from None
    if not docs:
        raise DataError(f"{path}: no text in the file")
    return docs


def is_within(path: str | os.PathLike[str], directory: str | os.PathLike[str]) -> bool:
    """Whether ``path`` resolves (symlinks followed) to a file inside ``directory``: what
    a server checks before attaching an index file a client names."""
    try:
        p, d = Path(path).resolve(strict=True), Path(directory).resolve(strict=True)
    except (OSError, RuntimeError):
        return False
    return p.is_file() and p.is_relative_to(d)
