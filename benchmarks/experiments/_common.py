"""What the experiments share: the UTC time stamp of a run and the OUT.json + OUT.md pair
most of them write.

An experiment runs as a file (``.venv/bin/python benchmarks/experiments/NAME.py``), so
this folder is on ``sys.path`` and ``from _common import ...`` finds this module.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def utc_now() -> str:
    """The run's date as the reports write it: ``2026-12-01 21:34 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def write_outputs(out: Path | str, data: Any, lines: Sequence[str]) -> str:
    """Write ``OUT.json`` (``data``) and ``OUT.md`` (``lines``, one a line) beside each
    other, making the folder; print the Markdown and return it. ``OUT`` keeps its whole
    name (``--out runs/smollm2-1.7b`` writes ``smollm2-1.7b.json``)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_name(out.name + ".json").write_text(json.dumps(data, indent=1) + "\n",
                                                 encoding="utf-8")
    md = "\n".join(lines) + "\n"
    out.with_name(out.name + ".md").write_text(md, encoding="utf-8")
    print(md)
    return md
