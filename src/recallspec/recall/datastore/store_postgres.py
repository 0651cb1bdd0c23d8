"""CREST store in PostgreSQL (driver: psycopg 3, the optional ``postgres`` extra).

Schema: ``<table>(key bytea PRIMARY KEY, tree bytea NOT NULL)`` and
``<table>_meta(key text PRIMARY KEY, value text NOT NULL)`` (JSON values), the same
content as the SQLite backend.

Builds are atomic: one transaction creates ``<table>__building`` tables, bulk-loads
them with COPY, drops the old tables and renames the new ones into place (PostgreSQL
DDL is transactional: readers see the old store or the new one, never a half-built
one; a failed build rolls back and leaves nothing behind). Lookups use one prepared
``key = ANY($1)`` statement.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from recallspec.recall.datastore.errors import (
    DatastoreFormatError,
    DatastoreUnreachableError,
    DatastoreWriteError,
)
from recallspec.recall.datastore.store import DEFAULT_TABLE, StoreBase, rows_hash

_IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")
CONNECT_TIMEOUT_S = 5


def _check_table(table: str) -> str:
    if not _IDENT.match(table):
        raise ValueError(f"table name {table!r}: use lowercase letters, digits and _ (<= 41)")
    return table


def _redact(dsn: str) -> str:
    return re.sub(r"(password=)\S+|(://[^:/@]+:)[^@]+@", lambda m: (m.group(1) or m.group(2))
                  + "***" + ("@" if m.group(2) else ""), dsn)


def connect(dsn: str) -> Any:
    """A psycopg connection (autocommit off), or a clear error."""
    try:
        import psycopg
    except ImportError:
        raise DatastoreUnreachableError(
            "the PostgreSQL backend needs psycopg: pip install 'recallspec[postgres]'"
        ) from None
    try:
        return psycopg.connect(dsn, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.Error as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DatastoreUnreachableError(
            f"cannot connect to PostgreSQL at {_redact(dsn)}: {msg}"
        ) from None


def write_postgres(
    dsn: str, rows: Sequence[tuple[bytes, bytes]], metadata: dict[str, Any],
    table: str = DEFAULT_TABLE,
) -> int:
    """Replace ``table`` (and ``table_meta``) atomically; returns the bytes they use."""
    import psycopg

    t = _check_table(table)
    b = f"{t}__building"
    con = connect(dsn)
    try:
        return _write(con, t, b, rows, metadata)
    except psycopg.OperationalError as e:
        raise DatastoreUnreachableError(f"{_redact(dsn)}: connection failed during the "
                                        f"build, nothing written ({e})") from None
    except psycopg.Error as e:
        raise DatastoreWriteError(
            f"{_redact(dsn)} table {t}: build failed, nothing written ({e})"
        ) from None
    finally:
        con.close()


def _write(
    con: Any, t: str, b: str, rows: Sequence[tuple[bytes, bytes]], metadata: dict[str, Any]
) -> int:
    # One transaction: the old tables stay visible until COMMIT, a failure rolls back.
    with con.transaction(), con.cursor() as cur:
        cur.execute(f"CREATE TABLE {b} (key bytea NOT NULL, tree bytea NOT NULL)")
        with cur.copy(f"COPY {b} (key, tree) FROM STDIN") as cp:
            for k, v in sorted(rows):
                cp.write_row((k, v))
        cur.execute(f"ALTER TABLE {b} ADD CONSTRAINT {b}_pkey PRIMARY KEY (key)")
        cur.execute(f"CREATE TABLE {b}_meta (key text PRIMARY KEY, value text NOT NULL)")
        cur.executemany(f"INSERT INTO {b}_meta VALUES (%s, %s)",
                        [(k, json.dumps(v)) for k, v in sorted(metadata.items())])
        cur.execute(f"DROP TABLE IF EXISTS {t}, {t}_meta")
        cur.execute(f"ALTER TABLE {b} RENAME TO {t}")
        cur.execute(f"ALTER TABLE {t} RENAME CONSTRAINT {b}_pkey TO {t}_pkey")
        cur.execute(f"ALTER INDEX {b}_meta_pkey RENAME TO {t}_meta_pkey")
        cur.execute(f"ALTER TABLE {b}_meta RENAME TO {t}_meta")
    with con.cursor() as cur:
        cur.execute(f"ANALYZE {t}")
    con.commit()
    return _relation_bytes(con, t)


def _relation_bytes(con: Any, t: str) -> int:
    with con.cursor() as cur:
        cur.execute("SELECT pg_total_relation_size(%s) + pg_total_relation_size(%s)",
                    (t, f"{t}_meta"))
        return int(cur.fetchone()[0])


class PostgresTreeStore(StoreBase):
    """Read-only view of a CREST store in a PostgreSQL table."""

    def __init__(self, dsn: str, table: str, con: Any) -> None:
        self.location = f"{_redact(dsn)} table {table}"
        self.table = table
        self._con = con
        self._sql = f"SELECT key, tree FROM {table} WHERE key = ANY(%s)"

    @classmethod
    def open(
        cls, dsn: str, *, table: str = DEFAULT_TABLE, expected_fingerprint: str | None = None,
        expected_vocab_size: int | None = None, verify: bool = False,
    ) -> PostgresTreeStore:
        import psycopg

        t = _check_table(table)
        con = connect(dsn)
        con.autocommit = True
        store = cls(dsn, t, con)
        try:
            with con.cursor() as cur:
                cur.execute(f"SELECT key, value FROM {t}_meta")
                meta = {k: json.loads(v) for k, v in cur.fetchall()}
        except psycopg.errors.UndefinedTable:
            con.close()
            raise DatastoreFormatError(
                f"{store.location}: no CREST store in this database"
            ) from None
        except (psycopg.Error, ValueError) as e:
            con.close()
            raise DatastoreFormatError(f"{store.location}: unreadable metadata ({e})") from None
        store._init_meta(meta, expected_fingerprint, expected_vocab_size)
        if verify:
            with con.cursor() as cur:
                cur.execute(f"SELECT key, tree FROM {t}")
                rows = [(bytes(k), bytes(v)) for k, v in cur.fetchall()]
            if rows_hash(rows) != meta.get("payload_hash"):
                con.close()
                raise DatastoreFormatError(f"{store.location}: payload checksum mismatch")
        return store

    def _fetch(self, keys: list[bytes]) -> list[tuple[bytes, bytes]]:
        import psycopg

        try:
            with self._con.cursor() as cur:
                cur.execute(self._sql, (keys,), prepare=True)
                return [(bytes(k), bytes(v)) for k, v in cur.fetchall()]
        except psycopg.OperationalError as e:
            raise DatastoreUnreachableError(f"{self.location}: connection lost ({e})") from None

    def n_entries(self) -> int:
        with self._con.cursor() as cur:
            cur.execute(f"SELECT count(*) FROM {self.table}")
            return int(cur.fetchone()[0])

    def storage_bytes(self) -> int:
        return _relation_bytes(self._con, self.table)

    def close(self) -> None:
        self._con.close()
