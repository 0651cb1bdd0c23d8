"""Open a CREST store by its location: a PostgreSQL DSN or an SQLite file path."""

from __future__ import annotations

from recallspec.recall.datastore.store import DEFAULT_TABLE, TreeStore, is_dsn
from recallspec.recall.datastore.store_postgres import PostgresTreeStore
from recallspec.recall.datastore.store_sqlite import SqliteTreeStore

__all__ = ["open_tree_store"]


def open_tree_store(
    location: str, *, table: str = DEFAULT_TABLE, expected_fingerprint: str | None = None,
    expected_vocab_size: int | None = None, verify: bool = False,
) -> TreeStore:
    """Open a CREST store: a PostgreSQL DSN (with ``table``) or an SQLite file path."""
    if is_dsn(location):
        return PostgresTreeStore.open(location, table=table,
                                      expected_fingerprint=expected_fingerprint,
                                      expected_vocab_size=expected_vocab_size, verify=verify)
    return SqliteTreeStore.open(location, expected_fingerprint=expected_fingerprint,
                                expected_vocab_size=expected_vocab_size, verify=verify)
