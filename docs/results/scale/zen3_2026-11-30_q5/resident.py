"""Resident weight bytes of a GGUF loaded in this process, against the file's size (a
fresh cache directory: no repack cache read or written).

    .venv/bin/python docs/results/scale/zen3_2026-11-30_q5/resident.py GGUF
"""

from __future__ import annotations

import os
import sys
import tempfile


def main() -> None:
    os.environ["RECALLSPEC_CACHE_DIR"] = tempfile.mkdtemp()
    from recallspec.models import load_model

    path = sys.argv[1]
    model, _ = load_model(path, repack_cache=False)
    wb, fb = model.weight_bytes(), os.path.getsize(path)
    print(f"{os.path.basename(path)}: weights {wb / 1e6:.1f} MB, file {fb / 1e6:.1f} MB, "
          f"{wb / fb:.3f}x")


if __name__ == "__main__":
    main()
