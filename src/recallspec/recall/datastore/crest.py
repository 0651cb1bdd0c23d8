"""CREST: precomputed REST draft trees of the corpus's most frequent n-grams.

Build: from a REST datastore (the corpus and its suffix array), for each n in ``ns``
(``1..max_n`` - "multiple n, top t" - or one n for the single-n ablation) keep the
``top_t`` most frequent n-grams not crossing a document end; for each, the REST draft
tree of exactly that n-gram over the full corpus; store n-gram -> encoded tree in a
``TreeStore`` (SQLite file or PostgreSQL table). Lookup (``TreeStore.longest``) tries
the longest stored suffix of the context first.

N-gram counting reuses the suffix array: in suffix-array order equal n-grams are
adjacent, so each distinct n-gram is one run of rows of the [n_sa, n] window matrix,
its count the run length and its suffix-array range the run itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from recallspec.decoding.tree import DraftTree
from recallspec.recall.datastore.codec import CODECS, MAX_TREE_NODES, TreeCodec
from recallspec.recall.datastore.rest import RestDatastore, RetrievalConfig
from recallspec.recall.datastore.store import (
    DEFAULT_TABLE,
    FORMAT,
    FORMAT_VERSION,
    is_dsn,
    pack_key,
    rows_hash,
)
from recallspec.recall.datastore.store_postgres import write_postgres
from recallspec.recall.datastore.store_sqlite import write_sqlite
from recallspec.recall.datastore.suffix_array import SEPARATOR
from recallspec.recall.datastore.trie import top_k_trie

DEFAULT_CODEC = "raw"  # docs/DATASTORE.md: the fastest decode at about equal size


@dataclass(frozen=True)
class CrestConfig:
    max_n: int = 4  # n-grams of length 1..max_n ("multiple n")
    top_t: int = 1000  # kept per n
    single_n: int | None = None  # ablation: only n-grams of this length (top_t of them)
    codec: str = DEFAULT_CODEC
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)

    def __post_init__(self) -> None:
        if not 1 <= self.max_n <= 16:
            raise ValueError("max_n must be in [1, 16]")
        if self.single_n is not None and not 1 <= self.single_n <= 16:
            raise ValueError("single_n must be in [1, 16]")
        if self.top_t < 1:
            raise ValueError("top_t must be >= 1")
        if self.codec not in CODECS:
            raise ValueError(f"codec must be one of {', '.join(CODECS)}")
        if self.retrieval.tree_nodes > MAX_TREE_NODES:
            raise ValueError(f"tree_nodes must be <= {MAX_TREE_NODES} for CREST")

    @property
    def ns(self) -> tuple[int, ...]:
        return (self.single_n,) if self.single_n is not None else tuple(range(1, self.max_n + 1))


@dataclass(frozen=True)
class NGram:
    tokens: tuple[int, ...]
    lo: int  # suffix-array run [lo, hi) = its occurrences
    hi: int

    @property
    def count(self) -> int:
        return self.hi - self.lo


def top_ngrams(ds: RestDatastore, n: int, top_t: int) -> list[NGram]:
    """The ``top_t`` most frequent n-grams (ties: suffix-array order), most frequent first."""
    sa = ds.sa.astype(np.int64)
    text = ds.text
    m = sa.shape[0]
    if m == 0:
        return []
    at = sa[:, None] + np.arange(n, dtype=np.int64)[None, :]
    win = text[np.minimum(at, text.shape[0] - 1)]
    valid = np.all(win != SEPARATOR, axis=1) & np.all(at < text.shape[0], axis=1)
    start = np.ones(m, bool)
    start[1:] = np.any(win[1:] != win[:-1], axis=1)
    starts = np.flatnonzero(start)
    ends = np.append(starts[1:], m)
    ok = valid[starts]  # a run is uniform: all rows share the window
    starts, ends = starts[ok], ends[ok]
    counts = ends - starts
    order = np.argsort(-counts, kind="stable")[:top_t]
    return [NGram(tuple(int(x) for x in win[starts[i]].tolist()), int(starts[i]), int(ends[i]))
            for i in order]


def crest_tree(ds: RestDatastore, g: NGram, cfg: RetrievalConfig) -> DraftTree:
    return top_k_trie(ds.continuations(g.lo, g.hi, len(g.tokens), cfg), cfg.tree_nodes)


@dataclass(frozen=True)
class CrestBuild:
    location: str
    storage_bytes: int
    n_entries: int
    per_n: dict[int, int]  # n -> entries stored
    mean_tree_nodes: float
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compute_rows(
    ds: RestDatastore, cfg: CrestConfig, progress: bool = False,
    on_tree: Callable[[DraftTree], None] | None = None,
) -> tuple[list[tuple[bytes, bytes]], dict[int, int], float]:
    """(key/value rows, entries per n, mean tree size) for ``cfg``."""
    from tqdm import tqdm

    codec = TreeCodec.for_vocab(cfg.codec, ds.vocab_size)
    grams: list[NGram] = []
    for n in cfg.ns:
        grams += top_ngrams(ds, n, cfg.top_t)
    rows: list[tuple[bytes, bytes]] = []
    per_n: dict[int, int] = {}
    nodes = 0
    for g in tqdm(grams, desc="CREST trees", unit="ngram", disable=not progress):
        tree = crest_tree(ds, g, cfg.retrieval)
        if len(tree) == 0:
            continue  # occurs only at document ends: a shorter n-gram may still draft
        if on_tree is not None:
            on_tree(tree)
        rows.append((pack_key(g.tokens), codec.encode(tree)))
        per_n[len(g.tokens)] = per_n.get(len(g.tokens), 0) + 1
        nodes += len(tree)
    return rows, per_n, nodes / max(1, len(rows))


def crest_metadata(
    ds: RestDatastore, cfg: CrestConfig, rows: Sequence[tuple[bytes, bytes]],
    per_n: dict[int, int], extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    codec = TreeCodec.for_vocab(cfg.codec, ds.vocab_size)
    return {
        "format": FORMAT, "version": FORMAT_VERSION,
        "tokenizer_fingerprint": ds.fingerprint, "vocab_size": ds.vocab_size,
        "codec": codec.name, "token_bytes": codec.token_bytes,
        "ns": sorted(per_n), "max_n": cfg.max_n, "top_t": cfg.top_t, "single_n": cfg.single_n,
        "retrieval": asdict(cfg.retrieval), "entries": len(rows),
        "entries_per_n": {str(k): v for k, v in sorted(per_n.items())},
        "corpus_tokens": ds.n_tokens, "corpus_docs": ds.n_docs,
        "payload_hash": rows_hash(rows),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **(extra or {}),
    }


def build_crest(
    ds: RestDatastore, cfg: CrestConfig, out: str, *, table: str = DEFAULT_TABLE,
    progress: bool = False, extra_metadata: dict[str, Any] | None = None,
) -> CrestBuild:
    """Build a CREST store at ``out`` (an SQLite path or a PostgreSQL DSN), atomically."""
    t0 = time.perf_counter()
    rows, per_n, mean_nodes = compute_rows(ds, cfg, progress)
    meta = crest_metadata(ds, cfg, rows, per_n, extra_metadata)
    size = write_postgres(out, rows, meta, table) if is_dsn(out) else write_sqlite(out, rows, meta)
    return CrestBuild(out, size, len(rows), per_n, mean_nodes, time.perf_counter() - t0)


def measure_codecs(trees: Sequence[DraftTree], vocab_size: int) -> dict[str, dict[str, float]]:
    """Per codec: total encoded bytes and median encode/decode µs over ``trees``."""
    out: dict[str, dict[str, float]] = {}
    for name in CODECS:
        codec = TreeCodec.for_vocab(name, vocab_size)
        enc_t: list[float] = []
        dec_t: list[float] = []
        total = 0
        for t in trees:
            a = time.perf_counter()
            blob = codec.encode(t)
            b = time.perf_counter()
            back = codec.decode(blob)
            c = time.perf_counter()
            same = np.array_equal(back.tokens, t.tokens)
            if not (same and np.array_equal(back.parents, t.parents)):
                raise AssertionError(f"codec {name} does not round-trip")
            total += len(blob)
            enc_t.append((b - a) * 1e6)
            dec_t.append((c - b) * 1e6)
        out[name] = {"bytes": float(total), "encode_us_median": float(np.median(enc_t)),
                     "decode_us_median": float(np.median(dec_t))}
    return out


