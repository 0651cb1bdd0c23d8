"""Corpus files -> token arrays (one per document), batched through the tokenizer."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from recallspec.data.corpus_files import iter_corpus

BATCH_CHARS = 1 << 20


def tokenize_corpus(
    paths: Sequence[str | os.PathLike[str]], tokenizer: Any, *, field: str | None = None,
    chat_template: Callable[[list[dict[str, str]]], str] | None = None,
    txt_mode: str = "blocks", progress: bool = False, desc: str = "tokenize",
) -> list[npt.NDArray[np.int32]]:
    """Token ids of every document of the corpus files (progress in input bytes)."""
    from tqdm import tqdm

    total = sum(os.path.getsize(p) for p in paths if os.path.isfile(p))
    bar = tqdm(total=total or None, unit="B", unit_scale=True, desc=desc, disable=not progress)
    out: list[npt.NDArray[np.int32]] = []
    batch: list[str] = []
    chars = 0

    def flush() -> None:
        nonlocal batch, chars
        if batch:
            out.extend(np.asarray(ids, np.int32) for ids in tokenizer.encode_batch(batch))
            bar.update(chars)
        batch, chars = [], 0

    for doc in iter_corpus(list(paths), field=field, chat_template=chat_template,
                           txt_mode=txt_mode):
        batch.append(doc)
        chars += len(doc.encode("utf-8", "replace"))
        if chars >= BATCH_CHARS:
            flush()
    flush()
    if bar.total:
        bar.update(max(0, bar.total - bar.n))
    bar.close()
    return out
