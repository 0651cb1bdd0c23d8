"""CREST store in one SQLite file (stdlib sqlite3).

Schema: ``trees(key BLOB PRIMARY KEY, tree BLOB) WITHOUT ROWID`` - the n-gram's packed
int32 tokens are the clustered B-tree key, so a lookup is one B-tree descent with no
rowid indirection - and ``meta(key TEXT PRIMARY KEY, value TEXT)`` holding JSON values.
The SQLite header's ``application_id`` marks the file as ours and ``user_version``
holds the format version.

Writes are atomic: the database is built in a temporary file next to the target,
vacuumed, fsynced and renamed. Reads open the file read-only and immutable (no locks:
a finished store never changes), with a memory map and a small page cache; the
lookup statement is prepared once and reused (sqlite3's statement cache).
"""

from __future__ import annotations

import json
import os
import sqlite3
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recallspec.recall.datastore.errors import DatastoreFormatError
from recallspec.recall.datastore.store import FORMAT_VERSION, StoreBase, rows_hash
from recallspec.recall.fileio import atomic_path

APPLICATION_ID = 0x52534352  # "RSCR"


def write_sqlite(
    path: str | os.PathLike[str], rows: Sequence[tuple[bytes, bytes]], metadata: dict[str, Any]
) -> int:
    """Write the store atomically; returns the file size in bytes."""
    with atomic_path(path) as tmp:
        con = sqlite3.connect(tmp)
        try:
            con.execute("PRAGMA journal_mode=OFF")
            con.execute("PRAGMA synchronous=OFF")
            con.execute(f"PRAGMA application_id={APPLICATION_ID}")
            con.execute(f"PRAGMA user_version={FORMAT_VERSION}")
            con.execute(
                "CREATE TABLE trees(key BLOB PRIMARY KEY, tree BLOB NOT NULL) WITHOUT ROWID"
            )
            con.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            con.executemany("INSERT INTO trees VALUES (?, ?)", sorted(rows))
            con.executemany("INSERT INTO meta VALUES (?, ?)",
                            [(k, json.dumps(v)) for k, v in sorted(metadata.items())])
            con.commit()
            con.execute("VACUUM")
        finally:
            con.close()
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        size = os.path.getsize(tmp)
    return size


def _check_header(p: str, size: int) -> None:
    """O(1) checks on the SQLite file header (100 bytes, big-endian fields): magic,
    our application_id, and the page count x page size against the file size."""
    with open(p, "rb") as f:
        hdr = f.read(100)
    if len(hdr) < 100 or not hdr.startswith(b"SQLite format 3\0"):
        raise DatastoreFormatError(f"{p}: corrupt or not an SQLite datastore (bad header)")
    if int.from_bytes(hdr[68:72], "big") != APPLICATION_ID:
        raise DatastoreFormatError(f"{p}: not a CREST datastore (SQLite application_id)")
    page_size = int.from_bytes(hdr[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(hdr[28:32], "big")
    if pages * page_size != size:
        raise DatastoreFormatError(
            f"{p}: truncated or extended: {pages} pages of {page_size} bytes, "
            f"file has {size} bytes"
        )


class SqliteTreeStore(StoreBase):
    """Read-only CREST store in an SQLite file."""

    _SQL_ONE = "SELECT tree FROM trees WHERE key = ?"

    def __init__(self, path: str, con: sqlite3.Connection) -> None:
        self.location = path
        self._con = con
        self._cur = con.cursor()
        self._sql: dict[int, str] = {}

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], *, expected_fingerprint: str | None = None,
        expected_vocab_size: int | None = None, verify: bool = False,
    ) -> SqliteTreeStore:
        p = os.fspath(path)
        if not Path(p).is_file():
            raise DatastoreFormatError(f"{p}: datastore file does not exist")
        size = os.path.getsize(p)
        _check_header(p, size)
        uri = "file:" + urllib.parse.quote(os.path.abspath(p)) + "?mode=ro&immutable=1"
        try:
            con = sqlite3.connect(uri, uri=True, check_same_thread=False, cached_statements=64)
            meta = {k: json.loads(v) for k, v in con.execute("SELECT key, value FROM meta")}
            con.execute("PRAGMA cache_size=-512")  # 512 KiB: the mmap does the caching
            con.execute(f"PRAGMA mmap_size={max(size, 1 << 20)}")
            con.execute("PRAGMA query_only=1")
        except sqlite3.DatabaseError as e:  # "file is not a database", malformed, ...
            raise DatastoreFormatError(f"{p}: corrupt or not an SQLite datastore ({e})") from None
        store = cls(p, con)
        store._init_meta(meta, expected_fingerprint, expected_vocab_size)
        if verify:
            store._verify()
        return store

    def _verify(self) -> None:
        try:
            ok = self._con.execute("PRAGMA quick_check").fetchone()[0]
            rows = list(self._con.execute("SELECT key, tree FROM trees"))
        except sqlite3.DatabaseError as e:
            raise DatastoreFormatError(f"{self.location}: corrupt ({e})") from None
        if ok != "ok" or rows_hash(rows) != self.metadata.get("payload_hash"):
            raise DatastoreFormatError(f"{self.location}: payload checksum mismatch (corrupt data)")

    def _fetch(self, keys: list[bytes]) -> list[tuple[bytes, bytes]]:
        sql = self._sql.get(len(keys))
        if sql is None:
            sql = self._sql.setdefault(
                len(keys), "SELECT key, tree FROM trees WHERE key IN (" +
                ",".join("?" * len(keys)) + ")")
        try:
            return self._con.execute(sql, keys).fetchall()
        except sqlite3.DatabaseError as e:
            raise DatastoreFormatError(f"{self.location}: corrupt ({e})") from None

    def _fetch_first(self, keys: list[bytes]) -> tuple[bytes, bytes] | None:
        # One primary-key probe per key on a reused cursor (the statement is prepared
        # once and cached): cheaper than one IN (...) query.
        cur = self._cur
        try:
            for k in keys:
                row = cur.execute(self._SQL_ONE, (k,)).fetchone()
                if row is not None:
                    return k, row[0]
        except sqlite3.DatabaseError as e:
            raise DatastoreFormatError(f"{self.location}: corrupt ({e})") from None
        return None

    def n_entries(self) -> int:
        return int(self._con.execute("SELECT count(*) FROM trees").fetchone()[0])

    def storage_bytes(self) -> int:
        return os.path.getsize(self.location)

    def close(self) -> None:
        self._con.close()
