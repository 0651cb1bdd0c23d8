"""User-facing error types. The CLI prints these as one line and exits non-zero."""

from __future__ import annotations


class RecallspecError(Exception):
    """Base class for errors caused by user input or environment, not by bugs."""


class ModelLoadError(RecallspecError):
    """A model file or directory is missing, corrupt, or of an unsupported kind."""


class ContextLengthError(RecallspecError):
    """A request does not fit in the model's context or the KV cache."""


class UnknownNameError(RecallspecError):
    """An unknown drafter, suite, method or similar registry name."""


class IndexFileError(RecallspecError):
    """An index/datastore file is corrupt, truncated, of another version or tokenizer."""


class DataError(RecallspecError):
    """Input data (corpus, answers file, request) is malformed or empty."""


class ResourceError(RecallspecError):
    """The request needs more memory (or another resource) than the machine has."""
