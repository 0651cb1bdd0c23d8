"""Datastore-specific errors (subclasses of the user-facing errors in recallspec.errors)."""

from __future__ import annotations

from recallspec.errors import IndexFileError, ResourceError


class DatastoreUnreachableError(ResourceError):
    """A database server (PostgreSQL) cannot be reached or refused the connection."""


class DatastoreFormatError(IndexFileError):
    """A datastore file or table is corrupt, truncated, of another version or tokenizer."""


class DatastoreWriteError(IndexFileError):
    """Writing a datastore failed; nothing was changed (the build was rolled back)."""
