"""Tokenizer fingerprints for host libraries' tokenizers.

Our index files record the fingerprint of the tokenizer they were built with
(``recallspec.models.tokenizer.vocab_fingerprint``, the one definition); here it is taken
of a host library's tokenizer, so that an index opened from transformers or vLLM accepts
exactly the vocabularies ours does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from recallspec.models.tokenizer import vocab_fingerprint


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """Fingerprint of a ``tokenizers.Tokenizer`` or a transformers fast tokenizer."""
    return vocab_fingerprint(getattr(tokenizer, "backend_tokenizer", tokenizer))


def fingerprint_of_dir(directory: str | os.PathLike[str]) -> str | None:
    """Fingerprint of ``directory/tokenizer.json``; None when there is none."""
    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    return tokenizer_fingerprint(Tokenizer.from_file(str(path)))
