"""StaticIndex: a corpus suffix automaton persisted in one memory-mapped file.

``StaticIndex.build`` (or an ``IndexBuilder`` fed in chunks) constructs the
automaton in C++ and writes it atomically; ``StaticIndex.open`` maps the file
without parsing or copying (O(1) header + size checks; ``verify=True`` also
recomputes the payload checksum). Any problem with the file is an IndexFileError
naming the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from recallspec import _core
from recallspec.errors import DataError, IndexFileError
from recallspec.recall.automata._arrays import as_tokens
from recallspec.recall.automata.cursor import MatchCursor
from recallspec.recall.index_info import IndexInfo

PathLike = str | os.PathLike[str]


class IndexBuilder:
    """Incremental builder: feed documents in chunks, then ``write``.

    Each ``add_*`` call runs in C++ without the GIL. Token ids must be < vocab_size.
    """

    def __init__(self, vocab_size: int, expected_tokens: int = 0) -> None:
        if not isinstance(vocab_size, int) or not 0 < vocab_size < 0xFFFFFFFF:
            raise ValueError(f"vocab_size must be an int in [1, 2^32-1), got {vocab_size!r}")
        self.vocab_size = vocab_size
        self._b = _core.StaticSamBuilder(vocab_size, max(0, int(expected_tokens)))

    def add_document(self, tokens: Any) -> None:
        arr = as_tokens(tokens, self.vocab_size)
        self._add(arr, np.array([0, arr.shape[0]], np.int64))

    def add_documents(self, docs: Iterable[Any]) -> None:
        arrays = [as_tokens(d, self.vocab_size, name=f"document {i}") for i, d in enumerate(docs)]
        if not arrays:
            return
        offsets = np.zeros(len(arrays) + 1, np.int64)
        np.cumsum([a.shape[0] for a in arrays], out=offsets[1:])
        self._add(np.concatenate(arrays), offsets)

    def add_flat(self, tokens: Any, offsets: Any) -> None:
        """Documents given as one token array and int64 offsets (len = n_docs + 1)."""
        arr = as_tokens(tokens, self.vocab_size)
        off = np.ascontiguousarray(offsets, dtype=np.int64)
        if off.ndim != 1 or off.shape[0] < 1 or off[0] != 0 or off[-1] != arr.shape[0]:
            raise ValueError("offsets must be 1-D, start at 0 and end at len(tokens)")
        if np.any(np.diff(off) < 0):
            raise ValueError("offsets must be non-decreasing")
        self._add(arr, off)

    def _add(self, tokens: np.ndarray, offsets: np.ndarray) -> None:
        try:
            self._b.add_documents(tokens, offsets)
        except ValueError as e:  # the core's own range check (should not trigger)
            raise ValueError(str(e)) from None

    @property
    def n_tokens(self) -> int:
        return int(self._b.n_tokens)

    @property
    def n_docs(self) -> int:
        return int(self._b.n_docs)

    @property
    def n_states(self) -> int:
        return int(self._b.n_states)

    def write(
        self,
        path: PathLike,
        tokenizer_fingerprint: str,
        metadata: dict[str, Any] | None = None,
    ) -> int:
        """Finish and write the index atomically; returns the file size in bytes."""
        if self.n_tokens == 0:
            raise DataError("cannot build an index from an empty corpus (no tokens)")
        meta = json.dumps(metadata or {}, sort_keys=True, separators=(",", ":"))
        if len(meta.encode()) >= 2048:
            raise ValueError("index metadata must encode to < 2048 bytes of JSON")
        fp = str(tokenizer_fingerprint)
        if len(fp.encode()) >= 128:
            raise ValueError("tokenizer_fingerprint must be < 128 bytes")
        try:
            return int(self._b.write(os.fspath(path), fp, meta))
        except _core.IndexFormatError as e:
            raise IndexFileError(f"{path}: {e}") from None


class StaticIndex:
    """A read-only corpus suffix automaton backed by a memory-mapped file."""

    def __init__(self, sam: Any, path: str, verified: bool) -> None:
        self._sam = sam
        self.path = path
        self._verified = verified

    def core_cursor(self) -> tuple[Any, int | None]:
        """A C++ cursor over the index; ids are bounded by its vocabulary."""
        return _core.StaticCursor(self._sam), self.vocab_size

    @classmethod
    def build(
        cls,
        tokens_or_docs: Any,
        vocab_size: int,
        tokenizer_fingerprint: str,
        path: PathLike,
        progress: bool | Callable[[int], None] = False,
        metadata: dict[str, Any] | None = None,
    ) -> StaticIndex:
        """Build from one token sequence or an iterable of documents, write, and open.

        ``progress``: False, True (a tqdm bar over tokens) or a callback receiving the
        number of tokens added so far.
        """
        docs: Iterable[Any]
        if isinstance(tokens_or_docs, np.ndarray) and tokens_or_docs.ndim == 1:
            docs = [tokens_or_docs]
        elif isinstance(tokens_or_docs, list | tuple) and all(
            isinstance(t, int | np.integer) for t in tokens_or_docs
        ):
            docs = [tokens_or_docs] if tokens_or_docs else []
        else:
            docs = tokens_or_docs
        builder = IndexBuilder(vocab_size)
        bar: Any = None
        callback: Callable[[int], None] | None = None
        if progress is True:
            from tqdm import tqdm

            bar = tqdm(unit="tok", unit_scale=True, desc="building index")
            callback = lambda n: bar.update(n - bar.n)  # noqa: E731
        elif callable(progress):
            callback = progress
        chunk: list[Any] = []
        chunk_tokens = 0
        for i, d in enumerate(docs):
            arr = as_tokens(d, vocab_size, name=f"document {i}")
            chunk.append(arr)
            chunk_tokens += arr.shape[0]
            if chunk_tokens >= 1 << 20:
                builder.add_documents(chunk)
                chunk, chunk_tokens = [], 0
                if callback:
                    callback(builder.n_tokens)
        builder.add_documents(chunk)
        if callback:
            callback(builder.n_tokens)
        if bar is not None:
            bar.close()
        builder.write(path, tokenizer_fingerprint, metadata)
        return cls.open(path, expected_fingerprint=tokenizer_fingerprint)

    @classmethod
    def open(
        cls,
        path: PathLike,
        expected_fingerprint: str | None = None,
        verify: bool = False,
        expected_vocab_size: int | None = None,
    ) -> StaticIndex:
        """Map an index file. Raises IndexFileError naming the file and the problem."""
        p = os.fspath(path)
        if not Path(p).is_file():
            raise IndexFileError(f"{p}: index file does not exist")
        try:
            sam = _core.StaticSam(p, bool(verify))
        except _core.IndexFormatError as e:
            raise IndexFileError(f"{p}: {e}") from None
        if expected_fingerprint is not None and sam.fingerprint != expected_fingerprint:
            raise IndexFileError(
                f"{p}: built with a different tokenizer (fingerprint {sam.fingerprint[:16]}..., "
                f"expected {expected_fingerprint[:16]}...); rebuild the index for this model"
            )
        if expected_vocab_size is not None and sam.vocab_size != expected_vocab_size:
            raise IndexFileError(
                f"{p}: vocabulary size {sam.vocab_size} does not match the model's "
                f"{expected_vocab_size}"
            )
        return cls(sam, p, bool(verify))

    # -- metadata --------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return int(self._sam.vocab_size)

    @property
    def tokenizer_fingerprint(self) -> str:
        return str(self._sam.fingerprint)

    @property
    def n_tokens(self) -> int:
        return int(self._sam.n_tokens)

    @property
    def n_docs(self) -> int:
        return int(self._sam.n_docs)

    @property
    def n_states(self) -> int:
        return int(self._sam.n_states)

    @property
    def n_edges(self) -> int:
        return int(self._sam.n_edges)

    @property
    def file_bytes(self) -> int:
        return int(self._sam.file_bytes)

    @property
    def metadata(self) -> dict[str, Any]:
        raw = self._sam.metadata
        try:
            out = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            return {"raw": raw}
        return out if isinstance(out, dict) else {"value": out}

    def info(self) -> IndexInfo:
        return IndexInfo(
            kind="sam",
            path=self.path,
            format_version=int(self._sam.version),
            vocab_size=self.vocab_size,
            tokenizer_fingerprint=self.tokenizer_fingerprint,
            n_tokens=self.n_tokens,
            n_docs=self.n_docs,
            n_states=self.n_states,
            n_edges=self.n_edges,
            file_bytes=self.file_bytes,
            payload_hash=f"{int(self._sam.payload_hash):016x}",
            verified=self._verified,
            metadata=self.metadata,
        )

    @property
    def text(self) -> npt.NDArray[np.unsignedinteger[Any]]:
        """Zero-copy view of the stored text: documents, each followed by an all-ones
        separator. uint16 when the vocabulary has < 65535 ids, else uint32."""
        return np.asarray(self._sam.text())

    def cursor(self) -> MatchCursor:
        return MatchCursor(self)

    def __repr__(self) -> str:
        return (
            f"StaticIndex({self.path!r}, tokens={self.n_tokens}, docs={self.n_docs}, "
            f"states={self.n_states})"
        )

