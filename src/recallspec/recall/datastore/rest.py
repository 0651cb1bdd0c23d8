"""REST datastore: the corpus tokens and their suffix array in one memory-mapped file.

File layout (little-endian)::

    [header: 4096 bytes][text: int32 x n_text][pad to 64][sa: int32 x n_sa]

``text`` is the corpus with -1 after every document; ``sa`` its suffix array (see
:mod:`recallspec.recall.datastore.suffix_array`). The header carries magic, format version,
vocabulary size, tokenizer fingerprint, build metadata (JSON), the section offsets,
the file size and two 64-bit BLAKE2b checksums: ``header_hash`` over the header (with
itself zeroed), checked on every open, and ``payload_hash`` over everything after the
header, checked only with ``verify=True`` because it reads the whole file. Files are
written atomically (temporary file + rename).

Retrieval (REST defaults, ``RetrievalConfig``): the longest suffix of the context of
length ``max_query`` down to ``min_query`` that occurs in the corpus; up to
``max_matches`` of its occurrences (evenly spaced over the suffix-array run, so the
sample is not biased towards lexicographically small continuations); the ``depth``
tokens after each; the ``tree_nodes`` most frequent nodes of their trie.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from recallspec import _core
from recallspec.decoding.tree import DraftTree
from recallspec.errors import DataError
from recallspec.recall.datastore.errors import DatastoreFormatError
from recallspec.recall.datastore.suffix_array import (
    SEPARATOR,
    as_int32,
    match_range,
    suffix_array,
)
from recallspec.recall.datastore.trie import top_k_trie
from recallspec.recall.fileio import atomic_path
from recallspec.recall.index_info import IndexInfo

PathLike = str | os.PathLike[str]

MAGIC = b"RSPCREST"
VERSION = 1
HEADER_BYTES = 4096
ALIGN = 64
_FMT = "<8sIIII8Q128s2048sQ"  # see _Header; header_hash is the last field
_HASH_AT = struct.calcsize(_FMT) - 8


@dataclass(frozen=True)
class RetrievalConfig:
    max_query: int = 16  # longest context suffix tried
    min_query: int = 2  # shortest; no match at this length = no draft
    max_matches: int = 5000  # occurrences whose continuations are merged
    depth: int = 10  # continuation tokens taken after each occurrence
    tree_nodes: int = 64  # nodes kept in the draft tree

    def __post_init__(self) -> None:
        if not 1 <= self.min_query <= self.max_query:
            raise ValueError("need 1 <= min_query <= max_query")
        if self.max_matches < 1 or self.depth < 1 or self.tree_nodes < 1:
            raise ValueError("max_matches, depth and tree_nodes must be >= 1")


def _hash(*chunks: bytes | memoryview) -> int:
    h = hashlib.blake2b(digest_size=8)
    for c in chunks:
        h.update(c)
    return int.from_bytes(h.digest(), "little")


def _align(x: int) -> int:
    return (x + ALIGN - 1) // ALIGN * ALIGN


def flatten_documents(
    docs: Iterable[Sequence[int] | npt.NDArray[np.integer[Any]]], vocab_size: int
) -> tuple[npt.NDArray[np.int32], int, int]:
    """(text with -1 after every non-empty document, n_tokens, n_docs)."""
    parts: list[npt.NDArray[np.int32]] = []
    n_tokens = n_docs = 0
    sep = np.array([SEPARATOR], np.int32)
    for i, d in enumerate(docs):
        a = np.asarray(d, dtype=np.int64).reshape(-1)
        if a.size == 0:
            continue
        if int(a.min()) < 0 or int(a.max()) >= vocab_size:
            raise ValueError(f"document {i}: token ids must be in [0, {vocab_size})")
        parts += [a.astype(np.int32), sep]
        n_tokens += a.size
        n_docs += 1
    if not parts:
        raise DataError("cannot build a datastore from an empty corpus (no tokens)")
    return np.concatenate(parts), n_tokens, n_docs


def write_rest(
    path: PathLike, text: npt.NDArray[np.int32], sa: npt.NDArray[np.int32], *, vocab_size: int,
    tokenizer_fingerprint: str, n_tokens: int, n_docs: int,
    metadata: dict[str, Any] | None = None,
) -> int:
    """Write a REST file atomically; returns its size in bytes."""
    fp = tokenizer_fingerprint.encode()
    meta = json.dumps(metadata or {}, sort_keys=True, separators=(",", ":")).encode()
    if len(fp) >= 128:
        raise ValueError("tokenizer_fingerprint must be < 128 bytes")
    if len(meta) >= 2048:
        raise ValueError("metadata must encode to < 2048 bytes of JSON")
    text_b = np.ascontiguousarray(text, "<i4").tobytes()
    sa_b = np.ascontiguousarray(sa, "<i4").tobytes()
    text_off = HEADER_BYTES
    sa_off = _align(text_off + len(text_b))
    pad = b"\0" * (sa_off - text_off - len(text_b))
    file_bytes = sa_off + len(sa_b)
    payload_hash = _hash(text_b, pad, sa_b)

    def header(hh: int) -> bytes:
        return struct.pack(
            _FMT, MAGIC, VERSION, HEADER_BYTES, vocab_size, 4, len(text), n_tokens, n_docs,
            len(sa), file_bytes, text_off, sa_off, payload_hash, fp, meta, hh,
        ).ljust(HEADER_BYTES, b"\0")

    hdr = header(0)
    hdr = header(_hash(hdr))
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(hdr)
        f.write(text_b)
        f.write(pad)
        f.write(sa_b)
        f.flush()
        os.fsync(f.fileno())
    return file_bytes


def build_rest(
    docs: Iterable[Sequence[int] | npt.NDArray[np.integer[Any]]], *, vocab_size: int,
    tokenizer_fingerprint: str, path: PathLike, metadata: dict[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
) -> RestDatastore:
    """Build the suffix array of the documents, write the file atomically, open it."""
    text, n_tokens, n_docs = flatten_documents(docs, vocab_size)
    sa = suffix_array(text, progress)
    write_rest(path, text, sa, vocab_size=vocab_size, tokenizer_fingerprint=tokenizer_fingerprint,
               n_tokens=n_tokens, n_docs=n_docs, metadata=metadata)
    return RestDatastore.open(path, expected_fingerprint=tokenizer_fingerprint)


class RestDatastore:
    """A read-only REST datastore backed by a memory-mapped file."""

    def __init__(self, path: str, mm: mmap.mmap, fields: tuple[Any, ...], verified: bool) -> None:
        self.path = path
        self._mm = mm
        (_, self.version, _, self.vocab_size, _, n_text, self.n_tokens, self.n_docs, n_sa,
         self.file_bytes, text_off, sa_off, self.payload_hash, fp, meta, _) = fields
        self.fingerprint: str = fp.rstrip(b"\0").decode()
        self.metadata: dict[str, Any] = json.loads(meta.rstrip(b"\0").decode() or "{}")
        self.text: npt.NDArray[np.int32] = np.frombuffer(mm, "<i4", n_text, text_off)
        self.sa: npt.NDArray[np.int32] = np.frombuffer(mm, "<i4", n_sa, sa_off)
        self.verified = verified

    @classmethod
    def open(
        cls, path: PathLike, expected_fingerprint: str | None = None, verify: bool = False,
        expected_vocab_size: int | None = None,
    ) -> RestDatastore:
        """Map a REST file; any problem is a DatastoreFormatError naming the file."""
        p = os.fspath(path)
        if not Path(p).is_file():
            raise DatastoreFormatError(f"{p}: datastore file does not exist")
        size = os.path.getsize(p)
        if size < HEADER_BYTES:
            raise DatastoreFormatError(f"{p}: truncated ({size} bytes, smaller than the header)")
        with open(p, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        hdr = bytes(mm[:HEADER_BYTES])
        if hdr[:8] != MAGIC:
            mm.close()
            raise DatastoreFormatError(f"{p}: not a REST datastore file (bad magic)")
        fields = struct.unpack_from(_FMT, hdr)
        zeroed = hdr[:_HASH_AT] + b"\0" * 8 + hdr[_HASH_AT + 8:]
        problem = None
        if fields[1] != VERSION:
            problem = f"format version {fields[1]}, this build reads version {VERSION}"
        elif _hash(zeroed) != fields[-1]:
            problem = "header checksum mismatch (corrupt header)"
        elif fields[9] != size:
            problem = f"truncated or extended: header says {fields[9]} bytes, file has {size}"
        elif fields[10] + 4 * fields[5] > fields[11] or fields[11] + 4 * fields[8] != size:
            problem = "section offsets out of range"
        elif verify and _hash(memoryview(mm)[HEADER_BYTES:]) != fields[12]:
            problem = "payload checksum mismatch (corrupt data)"
        if problem:
            mm.close()
            raise DatastoreFormatError(f"{p}: {problem}")
        ds = cls(p, mm, fields, verify)
        if expected_fingerprint is not None and ds.fingerprint != expected_fingerprint:
            raise DatastoreFormatError(
                f"{p}: built with another tokenizer (fingerprint {ds.fingerprint[:12]}..., "
                f"expected {expected_fingerprint[:12]}...)"
            )
        if expected_vocab_size is not None and ds.vocab_size > expected_vocab_size:
            raise DatastoreFormatError(
                f"{p}: vocabulary size {ds.vocab_size} exceeds the model's {expected_vocab_size}"
            )
        return ds

    def info(self) -> IndexInfo:
        return IndexInfo("rest", self.path, self.version, self.vocab_size, self.fingerprint,
                         self.n_tokens, self.n_docs, self.file_bytes,
                         f"{self.payload_hash:016x}", self.verified, self.metadata)

    # -- retrieval ---------------------------------------------------------------
    def count(self, query: Sequence[int]) -> int:
        lo, hi = match_range(self.text, self.sa, query)
        return hi - lo

    def continuations(
        self, lo: int, hi: int, offset: int, cfg: RetrievalConfig
    ) -> npt.NDArray[np.int64]:
        """[k, depth] tokens after up to max_matches entries of sa[lo:hi] (evenly spaced
        over the run when it is longer, so the sample is not biased towards
        lexicographically small continuations; each entry's suffix continues ``offset``
        tokens past its start), -1 past a document end."""
        out = np.empty((min(max(hi - lo, 0), cfg.max_matches), cfg.depth), np.int64)
        _core.sa_continuations(self.text, self.sa, lo, hi, offset, cfg.max_matches, out)
        return out

    def tree_for(self, query: Sequence[int], cfg: RetrievalConfig) -> DraftTree:
        """The draft tree of exactly ``query`` (empty if it does not occur)."""
        lo, hi = match_range(self.text, self.sa, query)
        if hi <= lo:
            return DraftTree.empty()
        return top_k_trie(self.continuations(lo, hi, len(query), cfg), cfg.tree_nodes)

    def longest_match(self, context: Sequence[int], cfg: RetrievalConfig) -> tuple[int, int, int]:
        """(length, lo, hi): the longest suffix of ``context`` with length in
        [min_query, max_query] occurring in the corpus (length 0 = none). Occurrence is
        monotone in the length (a suffix of an occurrence occurs), so a binary search
        over lengths finds the same length as backing off one by one (C core)."""
        ctx = as_int32(context[-cfg.max_query:])
        n, lo, hi = _core.sa_longest_match(self.text, self.sa, ctx, cfg.min_query,
                                           cfg.max_query)
        return int(n), int(lo), int(hi)

    def retrieve(self, context: Sequence[int], cfg: RetrievalConfig) -> tuple[int, DraftTree]:
        """(matched suffix length, draft tree) for the text ``context``."""
        length, lo, hi = self.longest_match(context, cfg)
        if length == 0:
            return 0, DraftTree.empty()
        return length, top_k_trie(self.continuations(lo, hi, length, cfg), cfg.tree_nodes)

    def close(self) -> None:
        # Arrays may still view the map; drop them first so the map can close.
        self.text = np.zeros(0, np.int32)
        self.sa = np.zeros(0, np.int32)
        # A caller may still hold a view; the map then closes when it is collected.
        with contextlib.suppress(BufferError):
            self._mm.close()


def rest_build_metadata(**kw: Any) -> dict[str, Any]:
    return {**kw, "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
