"""Corpus datastores for retrieval drafts.

* REST: a suffix array over the corpus tokens in one memory-mapped file
  (:mod:`recallspec.recall.datastore.rest`), queried with the context's longest matching suffix.
* CREST: the REST draft trees of the corpus's most frequent n-grams, precomputed and
  stored compressed in a key-value store with O(1) lookup (SQLite file or PostgreSQL
  table, :mod:`recallspec.recall.datastore.crest`).
"""

from recallspec.recall.datastore.errors import (
    DatastoreFormatError,
    DatastoreUnreachableError,
    DatastoreWriteError,
)
from recallspec.recall.datastore.open import open_tree_store
from recallspec.recall.datastore.rest import RestDatastore, RetrievalConfig, build_rest
from recallspec.recall.datastore.store import TreeStore

__all__ = [
    "DatastoreFormatError",
    "DatastoreUnreachableError",
    "DatastoreWriteError",
    "RestDatastore",
    "RetrievalConfig",
    "TreeStore",
    "build_rest",
    "open_tree_store",
]
