"""recallspec: lossless speculative decoding with drafts recalled from text."""

__version__ = "0.1.0"
