"""`recallspec serve` with no cost curve cached (a fresh cache directory): it answers
/health and requests at once while the curve is measured in the background, the
answers token-identical to plain decoding's, and the curve measured and cached within
the server's idle time (cost/job.py, cost/source.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.server import MODEL, Server, ext, start_server

pytestmark = [pytest.mark.server, pytest.mark.slow]

QUESTIONS = ["Summarise: the quick brown fox jumps over the lazy dog twice a day.",
             "List three prime numbers larger than 10, then repeat the list."]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    cache = tmp_path_factory.mktemp("cache")
    servers = start_server(tmp_path_factory.mktemp("serve") / "server.log",
                           "--cost-curve", "background", env={"RECALLSPEC_CACHE_DIR": str(cache)})
    try:
        yield next(servers), cache
    finally:
        servers.close()


def ids(server: Server, question: str, drafter: str | None) -> list[int]:
    kw: dict[str, Any] = {} if drafter is None else {"drafter": drafter}
    r = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=48,
        temperature=0, extra_body=ext(**kw))
    out: list[int] = (r.choices[0].model_extra or {})["token_ids"]
    return out


def curve_state(server: Server) -> str:
    state: str = httpx.get(f"{server.base}/health", timeout=10).json()["cost_curve"]
    return state


def test_serves_while_the_cost_curve_is_measured_then_caches_it(
    fresh: tuple[Server, Path],
) -> None:
    server, cache = fresh
    # The full measurement takes ~25 s on SmolLM2-135M (2 threads): it is under way.
    assert curve_state(server) == "measuring"
    for q in QUESTIONS:  # the default (cost-aware) drafting, priced by the prior
        assert ids(server, q, None) == ids(server, q, "none")
    deadline = time.monotonic() + 300
    while curve_state(server) == "measuring":
        assert time.monotonic() < deadline, server.log.read_text()
        time.sleep(0.5)
    assert curve_state(server) == "measured"
    log = server.log.read_text()
    assert "measured in the background" in log and "failed" not in log, log
    assert list((cache / "cost_curves").glob("*.json"))  # (cached, or provisional if busy)
    for q in QUESTIONS:  # priced by the measured curve
        assert ids(server, q, None) == ids(server, q, "none")
