"""Shared fixtures: the real default model (loaded once) and real benchmark prompts."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from availability import spec_bench_path

# The weight format the real-model engine tests run on: "auto" (the default: the GGUF's
# own blocks through the quantized kernel) or "float32" (the reference path); CI runs the
# lossless tests on both (`make test-portable`).
TEST_DTYPE = os.environ.get("RECALLSPEC_TEST_DTYPE", "auto")


@pytest.fixture(scope="session")
def engine() -> Iterator[object]:
    from recallspec.engine import Engine

    # mode="fixed": requests naming a drafter draft at fixed sizes unless a test states a
    # mode (a named drafter's default is cost-aware sizing; its tests say "adaptive").
    yield Engine.load(None, max_batch_size=8, dtype=TEST_DTYPE, mode="fixed")


def spec_bench_questions() -> list[dict[str, object]]:
    path = spec_bench_path()  # skips outside CI when missing; fails under CI
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="session")
def spec_bench_prompts() -> list[str]:
    """20 real first-turn prompts, stratified over Spec-Bench's six categories (the first
    questions of each category in file order)."""
    qs = spec_bench_questions()
    by_cat: dict[str, list[str]] = {}
    for q in qs:
        by_cat.setdefault(str(q["category"]), []).append(str(q["turns"][0]))  # type: ignore[index]
    out: list[str] = []
    i = 0
    while len(out) < 20:
        for cat in sorted(by_cat):
            if i < len(by_cat[cat]) and len(out) < 20:
                out.append(by_cat[cat][i])
        i += 1
    return out


def pytest_report_header() -> list[str]:
    """The CPU and the kernel path under test (RECALLSPEC_KERNELS forces one)."""
    from recallspec.runtime import isa

    return [f"recallspec: {isa.describe()}"]
