"""Shared fixtures: the real default model (loaded once) and real benchmark prompts.

Helpers shared by test files live at tests/ root in modules that hold no tests: the
``*_helpers.py`` modules (``stats_helpers``, ``engine_helpers``, ...), ``helpers.py``,
``availability.py``, ``sam_bruteforce.py``, ``fake_llama_server.py`` and ``pg_server.py``;
they are imported by their own name (``pythonpath = ["tests"]``). A test file imports
only from those, never from another ``test_*.py`` file nor from this conftest (importing
a test module re-collects its tests' names and couples the files); a helper one test file
uses stays in that file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers.availability import spec_bench_path
from helpers.real_model import TEST_DTYPE


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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that need native llama.cpp (marked ``peer``) run last: CI builds the
    peer at idle priority beside the run (.ci/run), and by the end it is there."""
    items.sort(key=lambda item: item.get_closest_marker("peer") is not None)  # stable


def pytest_report_header() -> list[str]:
    """The CPU and the kernel path under test (RECALLSPEC_KERNELS forces one)."""
    from recallspec.kernels import isa

    return [f"recallspec: {isa.describe()}"]


@pytest.fixture(scope="session")
def hf_gguf_tokenizer() -> Callable[[str | None], Any]:
    """transformers' own tokenizer of a real model's GGUF (``AutoTokenizer`` with
    ``gguf_file``), built once per model and session (Gemma's takes about a minute)."""
    import transformers

    from recallspec.models import resolve_model

    built: dict[str | None, Any] = {}

    def get(model: str | None) -> Any:
        if model not in built:
            g = resolve_model(model)
            built[model] = transformers.AutoTokenizer.from_pretrained(str(g.parent),
                                                                      gguf_file=g.name)
        return built[model]

    return get
