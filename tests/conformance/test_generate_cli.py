"""``recallspec generate --model <a variant's GGUF>`` as a user runs it: a real process, the
file's quantized weights, its chat template, the default drafting policy, and the output
identical to plain decoding (``--verify-lossless``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers.conformance import built


@pytest.mark.parametrize("name", ["phi4-mini", "gemma2-2b", "smollm3-3b", "llama3.2-tied"])
def test_generate_on_a_variant(name: str) -> None:
    gguf = built(name).f32_gguf
    cmd = [sys.executable, "-m", "recallspec", "generate", "--model", str(gguf), "--chat",
           "--prompt", "Repeat after me: one two three four five, one two three four five.",
           "--max-new-tokens", "24", "--json", "--verify-lossless", "--no-repack-cache"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["lossless"] is True and out["new_tokens"] >= 1, out
