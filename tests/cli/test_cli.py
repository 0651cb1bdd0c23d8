"""The CLI: a real generation with --json, and one clear error line for bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.imports import loaded_after

CLI = [sys.executable, "-m", "recallspec.cli"]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})


def test_generate_json_verify_lossless() -> None:
    r = run_cli("generate", "--chat", "--prompt", "Repeat exactly: red green blue red green blue",
                "--max-new-tokens", "24", "--json", "--verify-lossless")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("text", "new_tokens", "steps", "mean_accepted_tokens", "tokens_per_s",
                "lossless", "speedup"):
        assert key in out
    assert out["lossless"] is True
    assert out["new_tokens"] >= out["steps"]
    # No --drafter: the measured default policy drafts (and the repetition is drafted).
    from recallspec.policy import POLICY

    assert out["drafter"] == POLICY
    assert out["new_tokens"] > out["steps"]


def one_error_line(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    """A failed command's stderr: one error line, last, naming ``needles``; before it at
    most the command's own notes (e.g. "the machine is busy: ..." when a cost curve
    measured under load is reused), never a traceback."""
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("recallspec: error:"), r.stderr
    assert all(ln.startswith("recallspec: ") and " error:" not in ln for ln in lines[:-1]), (
        r.stderr)
    for n in needles:
        assert n in lines[-1], lines[-1]


def test_nonexistent_model() -> None:
    one_error_line(run_cli("generate", "--model", "/nonexistent/model.gguf", "--prompt", "hi"),
                   "/nonexistent/model.gguf")


def test_truncated_gguf(tmp_path: Path) -> None:
    from recallspec.models import default_model_path

    src = Path(default_model_path())
    bad = tmp_path / "truncated.gguf"
    with open(src, "rb") as f, open(bad, "wb") as g:
        g.write(f.read(src.stat().st_size // 3))
    one_error_line(run_cli("generate", "--model", str(bad), "--prompt", "hi"), "truncated.gguf")


def test_empty_prompt() -> None:
    one_error_line(run_cli("generate", "--prompt", "   "), "empty prompt")


def test_unknown_drafter() -> None:
    one_error_line(run_cli("generate", "--drafter", "telepathy", "--prompt", "hi"), "telepathy")


def test_serve_refuses_a_batch_layout_mode() -> None:
    """`serve --mode` takes a sizing; a batch layout is refused before the model loads,
    naming where EMS-SD's padded layouts live (a benchmark ablation)."""
    one_error_line(run_cli("serve", "--mode", "vanilla", "--port", "0"), "'vanilla'",
                   "recallspec.bench.suite.padded_layouts")


def test_prompt_longer_than_context() -> None:
    one_error_line(run_cli("generate", "--prompt", "word " * 9000), "context")


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_readme_commands_exist() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    ci = (Path(__file__).parents[2] / ".ci" / "run").read_text()
    assert "make test" in ci


def test_help_does_not_load_torch() -> None:
    """Every command's options and defaults come from torch-free modules (params.py,
    policy.py), so `recallspec <command> --help` answers at once (it took ~2 s of
    torch's import when a command module imported the engine)."""
    code = "import recallspec.cli as c\nc.build_parser()"
    assert loaded_after(code, ("torch", "transformers", "fastapi")) == []
    r = run_cli("serve", "--help")
    assert r.returncode == 0, r.stderr
    assert "--prefix-cache-tokens" in r.stdout and "16384" in r.stdout  # the default, stated
