"""What a fresh interpreter has imported: for tests that keep a heavy module (torch, gguf,
FastAPI) off a path where it costs start-up time."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable


def loaded_after(code: str, names: Iterable[str]) -> list[str]:
    """Those of ``names`` in ``sys.modules`` after a fresh interpreter runs ``code``,
    sorted."""
    probe = (f"{code}\nimport json, sys\n"
             f"print(json.dumps(sorted(m for m in {sorted(names)!r} if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)
    loaded: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded
