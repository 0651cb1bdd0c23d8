"""Where benchmark data lives.

Order: an explicit path, the ``RECALLSPEC_DATA_DIR`` environment variable, then
``../shared/data`` next to the current directory or next to the source checkout.
Nothing is ever downloaded.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "RECALLSPEC_DATA_DIR"


class DataNotFoundError(FileNotFoundError):
    pass


def candidate_data_dirs() -> list[Path]:
    repo_root = Path(__file__).resolve().parents[3]  # src/recallspec/data/paths.py -> checkout
    return [Path.cwd().parent / "shared" / "data", repo_root.parent / "shared" / "data"]


def data_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Return the benchmark data directory or raise DataNotFoundError naming what was tried."""
    if explicit is not None:
        p = Path(explicit)
        if not p.is_dir():
            raise DataNotFoundError(f"data directory {p} does not exist")
        return p
    env = os.environ.get(ENV_VAR)
    if env:
        p = Path(env)
        if not p.is_dir():
            raise DataNotFoundError(f"{ENV_VAR}={env} is not a directory")
        return p
    tried = candidate_data_dirs()
    for p in tried:
        if p.is_dir():
            return p
    raise DataNotFoundError(
        "benchmark data not found; set "
        + ENV_VAR
        + " or pass a path (tried: "
        + ", ".join(str(t) for t in tried)
        + ")"
    )
