"""The CREST key-value store interface and what both backends share.

A store maps an n-gram (key: its int32 tokens packed little-endian) to a serialised
draft tree (see :mod:`recallspec.recall.datastore.codec`), plus store-wide metadata (format,
version, tokenizer fingerprint, vocabulary size, codec, the stored n values, ...).

Backends: SQLite (one file; :mod:`.store_sqlite`) and PostgreSQL (one table pair;
:mod:`.store_postgres`). Both implement ``TreeStore``; ``open.open_tree_store`` picks
the backend from the location (a PostgreSQL DSN or a file path).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from recallspec.decoding.tree import DraftTree
from recallspec.recall.datastore.codec import TreeCodec
from recallspec.recall.datastore.errors import DatastoreFormatError

FORMAT = "recallspec-crest"
FORMAT_VERSION = 1
DEFAULT_TABLE = "recallspec_crest"


def pack_key(tokens: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}i", *tokens)


def is_dsn(location: str) -> bool:
    """A PostgreSQL connection string (URI or key=value form), not a file path."""
    s = location.strip()
    return s.startswith(("postgresql://", "postgres://")) or (
        "=" in s and any(k in s for k in ("dbname=", "host=", "user=", "port="))
    )


@runtime_checkable
class TreeStore(Protocol):
    location: str
    metadata: dict[str, Any]

    def get(self, ngram: Sequence[int]) -> DraftTree | None:
        """The stored tree of exactly this n-gram, or None."""
        ...

    def longest(
        self, context: Sequence[int], max_nodes: int | None = None
    ) -> tuple[int, DraftTree | None]:
        """(n, tree) for the longest stored n-gram that is a suffix of ``context``; the
        tree cut to its first ``max_nodes`` nodes if given."""
        ...

    def storage_bytes(self) -> int: ...

    def close(self) -> None: ...


class StoreBase:
    """Decoding, metadata checks and longest-suffix lookup on top of ``_fetch``."""

    location: str
    metadata: dict[str, Any]
    _codec: TreeCodec
    _ns_desc: tuple[int, ...]

    def _init_meta(
        self, meta: dict[str, Any], expected_fingerprint: str | None,
        expected_vocab_size: int | None,
    ) -> None:
        loc = self.location
        if meta.get("format") != FORMAT:
            raise DatastoreFormatError(
                f"{loc}: not a CREST datastore (format {meta.get('format')!r})"
            )
        if meta.get("version") != FORMAT_VERSION:
            raise DatastoreFormatError(
                f"{loc}: format version {meta.get('version')}, this build reads {FORMAT_VERSION}"
            )
        fp = str(meta.get("tokenizer_fingerprint", ""))
        if expected_fingerprint is not None and fp != expected_fingerprint:
            raise DatastoreFormatError(
                f"{loc}: built with another tokenizer (fingerprint {fp[:12]}..., expected "
                f"{expected_fingerprint[:12]}...)"
            )
        vocab = int(meta.get("vocab_size", 0))
        if expected_vocab_size is not None and vocab > expected_vocab_size:
            raise DatastoreFormatError(
                f"{loc}: vocabulary size {vocab} exceeds the model's {expected_vocab_size}"
            )
        try:
            self._codec = TreeCodec(str(meta["codec"]), int(meta["token_bytes"]))
            self._ns_desc = tuple(sorted((int(n) for n in meta["ns"]), reverse=True))
        except (KeyError, ValueError, TypeError) as e:
            raise DatastoreFormatError(f"{loc}: bad metadata ({e})") from None
        self.metadata = meta

    def _fetch(self, keys: list[bytes]) -> list[tuple[bytes, bytes]]:
        """(key, value) rows of the stored ``keys`` (any order)."""
        raise NotImplementedError

    def _fetch_first(self, keys: list[bytes]) -> tuple[bytes, bytes] | None:
        """The first of ``keys`` (in the given order) that is stored. Backends override
        this with one cheap probe per key, stopping at the first hit."""
        rows = dict(self._fetch(keys))
        return next(((k, rows[k]) for k in keys if k in rows), None)

    def _decode(self, blob: bytes, max_nodes: int | None = None) -> DraftTree:
        try:
            return self._codec.decode(blob, max_nodes)
        except Exception as e:  # any decoding failure = a corrupt value
            raise DatastoreFormatError(f"{self.location}: corrupt tree value ({e})") from None

    def get(self, ngram: Sequence[int]) -> DraftTree | None:
        rows = self._fetch([pack_key([int(t) for t in ngram])])
        return self._decode(rows[0][1]) if rows else None

    def longest(
        self, context: Sequence[int], max_nodes: int | None = None
    ) -> tuple[int, DraftTree | None]:
        if not self._ns_desc:
            return 0, None
        tail = context[-self._ns_desc[0]:]
        m = len(tail)
        packed = struct.pack(f"<{m}i", *tail)  # suffix keys are byte suffixes of this
        keys = [packed[4 * (m - n):] for n in self._ns_desc if n <= m]
        if not keys:
            return 0, None
        hit = self._fetch_first(keys)
        if hit is None:
            return 0, None
        return len(hit[0]) // 4, self._decode(hit[1], max_nodes)


def rows_hash(rows: Sequence[tuple[bytes, bytes]]) -> str:
    """64-bit BLAKE2b over (key, value) pairs in key order (what verify recomputes)."""
    import hashlib

    h = hashlib.blake2b(digest_size=8)
    for k, v in sorted(rows):
        h.update(struct.pack("<II", len(k), len(v)))
        h.update(k)
        h.update(v)
    return h.hexdigest()
