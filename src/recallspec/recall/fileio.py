"""Atomic file writes: write to a temporary file next to the target, then rename.

A reader never sees a half-written file: either the old file (or none) or the complete
new one. On any error the temporary file is removed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path in the target's directory; rename it onto ``path`` when the
    block ends without an exception, delete it otherwise."""
    target = Path(path)
    if target.is_dir():
        raise IsADirectoryError(f"{target} is a directory")
    parent = target.parent if str(target.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".{target.name}.tmp-{os.getpid()}"
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
