"""Keep the cache bounded: remove entries that can never be read again.

A converted GGUF's entry (``<cache>/models/<stem>-<key>``, ``loader._target_dir``) is keyed
by its file's size, mtime and ends, so an entry outlives its use when the file is deleted or
changes (a reinstalled package, a rebuilt shape, a test's temporary file): nothing points at
it again, and with a repack cache it holds more than the GGUF's size. Each entry records its
source (``source.json``: the path and the key it had); when a new entry is made, the entries
whose source is gone or has another key now are removed, as are entries without a record
(made before records were written) and builds interrupted more than ``STALE_TMP_S`` ago.

A conformance build (``<cache>/conformance/<variant>-<key>``) is keyed by the variant's
definition and the tools' versions; a new build of a variant replaces its older ones.

Removal only ever follows the making of a new entry, in the process that made it; a reader
of an entry whose source still exists is never affected. A removal that fails (a file in use
on a platform that refuses, permissions) is skipped: pruning never fails a load.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

SOURCE_RECORD = "source.json"
# A temporary build directory older than this is a killed build's leftover, not one in
# progress (conversions take seconds to minutes; a day leaves any real one alone).
STALE_TMP_S = 24 * 3600.0


def record_source(entry: Path, source: Path, key: str) -> None:
    """Write ``entry``'s record of the file it was made from (before it is renamed in)."""
    (entry / SOURCE_RECORD).write_text(json.dumps({"path": str(source.resolve()), "key": key}))


def _is_live(entry: Path, key_of: Callable[[Path], str]) -> bool:
    try:
        record = json.loads((entry / SOURCE_RECORD).read_text())
        source = Path(record["path"])
        return source.is_file() and key_of(source) == record["key"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _is_stale_tmp(path: Path, now: float) -> bool:
    try:
        return ".tmp-" in path.name and now - path.stat().st_mtime > STALE_TMP_S
    except OSError:
        return False


def _remove(paths: list[Path], what: str) -> list[Path]:
    removed, freed = [], 0
    for p in paths:
        size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else 0
        shutil.rmtree(p, ignore_errors=True)
        if not p.exists():
            removed.append(p)
            freed += size
    if removed:
        print(f"recallspec: removed {len(removed)} {what} from the cache "
              f"({freed / 1e6:,.0f} MB freed)", file=sys.stderr, flush=True)
    return removed


def prune_models(root: Path, keep: Path, key_of: Callable[[Path], str]) -> list[Path]:
    """Remove the converted-model entries under ``root`` that no file maps to any more
    (``key_of``: a file's current key); ``keep`` (the entry just made) stays. Returns what
    was removed."""
    now = time.time()
    stale = []
    for p in sorted(root.iterdir()) if root.is_dir() else []:
        if p == keep or not p.is_dir():
            continue
        if ".tmp-" in p.name:
            if _is_stale_tmp(p, now):
                stale.append(p)
        elif not _is_live(p, key_of):
            stale.append(p)
    return _remove(stale, "converted models whose GGUF is gone or changed")


def prune_builds(root: Path, keep: Path) -> list[Path]:
    """Remove the other builds of ``keep``'s variant under ``root`` (``<variant>-<key>``,
    the key a 16-hex-digit hash) and interrupted builds of any variant."""
    now = time.time()
    variant = keep.name.rsplit("-", 1)[0]
    stale = []
    for p in sorted(root.iterdir()) if root.is_dir() else []:
        if p == keep or not p.is_dir():
            continue
        if ".tmp-" in p.name:
            if _is_stale_tmp(p, now):
                stale.append(p)
        elif p.name.rsplit("-", 1)[0] == variant:
            stale.append(p)
    return _remove(stale, f"older builds of the conformance variant {variant}")
