"""Tokenizer fingerprints for host libraries' tokenizers.

Our index files record the fingerprint of the tokenizer they were built with: hex
sha256 of the vocabulary in id order, ``f"{id}\\0{token}\\0"`` per id, added tokens
included. This must equal ``recallspec.models.Tokenizer.fingerprint`` (tested), so that
an index opened from transformers or vLLM accepts exactly the vocabularies ours does.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """Fingerprint of a ``tokenizers.Tokenizer`` or a transformers fast tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    h = hashlib.sha256()
    for i in range(int(backend.get_vocab_size(with_added_tokens=True))):
        tok = backend.id_to_token(i)
        h.update(f"{i}\x00{'' if tok is None else tok}\x00".encode())
    return h.hexdigest()


def fingerprint_of_dir(directory: str | os.PathLike[str]) -> str | None:
    """Fingerprint of ``directory/tokenizer.json``; None when there is none."""
    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    return tokenizer_fingerprint(Tokenizer.from_file(str(path)))
