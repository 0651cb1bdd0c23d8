"""Validation of token arrays handed to the C++ core.

The core takes 1-D C-contiguous uint32 arrays. These helpers turn what users pass
(lists, any integer numpy array) into exactly that, or raise a clear TypeError /
ValueError. A uint32 C-contiguous array passes without a copy (the hot path).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

# 0xFFFFFFFF is the document separator inside the index; never a token id.
MAX_TOKEN_ID = 0xFFFFFFFE

TokensLike = Sequence[int] | npt.NDArray[np.integer[Any]]
_SHORT_LIST = 64  # lists up to this long are checked element by element in Python


def as_tokens(tokens: Any, vocab_size: int | None = None, name: str = "tokens") -> np.ndarray:
    """Return ``tokens`` as a 1-D C-contiguous uint32 array, checking every id is valid."""
    if type(tokens) is list and len(tokens) <= _SHORT_LIST:
        # What the engine commits each step: a few Python ints. Checked here in Python
        # (numpy's asarray + min + max cost far more on so few); anything else, or an
        # id out of range, takes the general path below and its errors.
        limit = MAX_TOKEN_ID + 1 if vocab_size is None else vocab_size
        if all(type(t) is int and 0 <= t < limit for t in tokens):
            return np.array(tokens, np.uint32)
    if isinstance(tokens, np.ndarray):
        arr = tokens
        if arr.dtype == np.uint32 and arr.ndim == 1 and arr.flags.c_contiguous:
            if vocab_size is not None and arr.size and int(arr.max()) >= vocab_size:
                _raise_too_large(arr, vocab_size, name)
            return arr
        if not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"{name} must be an integer array, got dtype {arr.dtype}")
    else:
        if isinstance(tokens, str | bytes):
            raise TypeError(f"{name} must be a sequence of token ids, not {type(tokens).__name__}")
        try:
            arr = np.asarray(tokens)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{name} must be a sequence of token ids: {e}") from None
        if arr.size == 0:
            arr = arr.astype(np.int64)
        if not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"{name} must contain integers, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0:
            raise ValueError(f"{name} contains a negative token id ({lo})")
        limit = MAX_TOKEN_ID + 1 if vocab_size is None else vocab_size
        if hi >= limit:
            _raise_too_large(arr, limit, name)
    return np.ascontiguousarray(arr, dtype=np.uint32)


def _raise_too_large(arr: np.ndarray, limit: int, name: str) -> None:
    i = int(np.argmax(arr >= limit))
    raise ValueError(
        f"{name}[{i}] = {int(arr[i])} is out of range: token ids must be < vocab_size {limit}"
    )


def check_out(out: Any, name: str = "out") -> np.ndarray:
    """Check a preallocated output buffer: 1-D C-contiguous writable int64."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(out).__name__}")
    if out.dtype != np.int64 or out.ndim != 1 or not out.flags.c_contiguous:
        raise TypeError(
            f"{name} must be a 1-D C-contiguous int64 array, got {out.dtype} {out.shape}"
        )
    if not out.flags.writeable:
        raise ValueError(f"{name} must be writable")
    return out
