"""An index's corpus as SGLang's NGRAM external corpus.

SGLang's NGRAM speculative mode builds its own suffix automaton from a JSONL file in
which every line is one document as a JSON string; it tokenizes each with the served
model's tokenizer (no special tokens added) and separates documents::

    python -m sglang.launch_server --model-path MODEL \\
        --speculative-algorithm NGRAM \\
        --speculative-ngram-external-corpus-path corpus.jsonl \\
        --speculative-ngram-external-sam-budget 4 \\
        --speculative-ngram-external-corpus-max-tokens N   # >= the corpus's tokens

(the budget must be positive when a corpus is given: the draft-tree nodes the corpus
may fill). Our index file keeps the corpus token stream itself (``StaticIndex.text``:
documents, each followed by an all-ones separator), so ``export_sglang`` splits it at
the separators and decodes each document with the index's own tokenizer (checked by
fingerprint), keeping special tokens as text. Decoding and re-encoding is not always
the identity for a BPE vocabulary; ``check=True`` counts the documents that
round-trip exactly, i.e. those SGLang will see token-for-token as we indexed them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from recallspec.errors import DataError
from recallspec.recall.automata import StaticIndex


@dataclass(frozen=True)
class ExportSummary:
    path: str
    documents: int  # written (empty documents are skipped)
    tokens: int
    round_trip: int | None  # documents whose text re-encodes to the same tokens
    flags: str  # the SGLang flags that load this file

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def documents(index: StaticIndex) -> Iterator[npt.NDArray[np.int64]]:
    """The corpus documents in index order (each without its separator)."""
    text = index.text
    sep = np.iinfo(text.dtype).max  # the all-ones separator after every document
    ends = np.flatnonzero(text == sep)
    start = 0
    for end in ends.tolist():
        yield text[start:end].astype(np.int64)
        start = end + 1


def sglang_flags(path: str, tokens: int, budget: int = 4) -> str:
    # The token cap must cover the corpus plus one separator per document boundary;
    # round up to leave room for text that re-tokenizes longer.
    cap = max(1024, int(tokens * 1.1) + 1)
    return (f"--speculative-algorithm NGRAM --speculative-ngram-external-corpus-path {path} "
            f"--speculative-ngram-external-sam-budget {budget} "
            f"--speculative-ngram-external-corpus-max-tokens {cap}")


def export_sglang(index: StaticIndex, tokenizer: Any, out: str | os.PathLike[str], *,
                  check: bool = False) -> ExportSummary:
    """Write ``index``'s documents as SGLang external-corpus JSONL. ``tokenizer`` (ours,
    ``recallspec.models.Tokenizer``) must be the one the index was built with."""
    fp = getattr(tokenizer, "fingerprint", None)
    if fp != index.tokenizer_fingerprint:
        raise DataError(
            f"{index.path}: built with another tokenizer (fingerprint "
            f"{index.tokenizer_fingerprint[:16]}..., this model's {str(fp)[:16]}...); pass the "
            "model the index was built for (--model)")
    n_docs = n_tokens = same = 0
    tmp = f"{os.fspath(out)}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for doc in documents(index):
            if doc.size == 0:
                continue
            ids = doc.tolist()
            text = tokenizer.decode(ids, skip_special_tokens=False)
            f.write(json.dumps(text, ensure_ascii=False) + "\n")
            n_docs += 1
            n_tokens += len(ids)
            if check:
                same += tokenizer.encode(text) == ids
    os.replace(tmp, out)  # no half-written corpus for a server to load
    return ExportSummary(os.fspath(out), n_docs, n_tokens, same if check else None,
                         sglang_flags(os.fspath(out), n_tokens + n_docs))
