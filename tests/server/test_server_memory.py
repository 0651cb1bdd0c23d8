"""The server's KV memory stays within its budgets under load (issue 38): 64 streaming
clients, a quarter hanging up mid-answer, on a server whose prefix pool and KV budget
are small enough to bind; ``/metrics`` sampled throughout never shows the pool above its
budget nor the KV rows above theirs, and every answer that completed equals offline
greedy decoding."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.server import Server, start_server, stream_chat, total

from recallspec.decoding.sampling import SamplingParams

POOL, BUDGET, TOKENS = 600, 3000, 24


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from start_server(tmp_path_factory.mktemp("serve") / "server.log",
                            "--drafter", "pld", "--mode", "fixed", "--max-batch-size", "8",
                            "--max-len", "1024", "--prefix-cache-tokens", str(POOL),
                            "--kv-budget-tokens", str(BUDGET))


def test_the_budgets_show_from_the_first_scrape(server: Server) -> None:
    # The module's server is fresh: this is the first /metrics after /health answered,
    # before any request (a scraper must never see a budget missing or zero).
    m = server.metrics()
    assert total(m, "recallspec:prefix_cache_budget_tokens") == POOL
    assert total(m, "recallspec:kv_cache_budget_tokens") == BUDGET


def test_64_clients_with_disconnects_stay_within_the_budgets(
        server: Server, engine: Any, spec_bench_prompts: list[str]) -> None:
    prompts = (spec_bench_prompts * 4)[:64]
    rng = random.Random(0)
    hang_up = {i for i in range(64) if rng.random() < 0.25}
    seen: list[tuple[float, float, float, float]] = []
    done = threading.Event()

    def sample() -> None:  # /metrics while the clients run
        while not done.is_set():
            m = server.metrics()
            seen.append((total(m, "recallspec:prefix_pool_resident_tokens"),
                         total(m, "recallspec:prefix_cache_budget_tokens"),
                         total(m, "recallspec:kv_cache_resident_tokens"),
                         total(m, "recallspec:kv_cache_budget_tokens")))
            done.wait(0.05)

    async def run() -> list[Any]:
        client = server.async_client()
        return await asyncio.gather(*(
            stream_chat(client, p, "pld", TOKENS, cancel_after=2 if i in hang_up else None)
            for i, p in enumerate(prompts)))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        answers = asyncio.run(run())
    finally:
        done.set()
        sampler.join()
    after = server.wait_idle()
    assert len(seen) >= 10 and {s[1] for s in seen} == {POOL} and {s[3] for s in seen} == {BUDGET}
    assert max(s[0] for s in seen) <= POOL and max(s[2] for s in seen) <= BUDGET
    assert total(after, "recallspec:prefix_pool_resident_tokens") > 0  # the pool was used
    assert total(after, "recallspec:prefix_cache_evictions_total") > 0  # and had to evict
    p = SamplingParams(max_new_tokens=TOKENS)
    want: dict[str, list[int]] = {}  # per prompt (64 clients ask 20 prompts)
    wrong = []
    for i, a in enumerate(answers):
        if i not in hang_up:
            if prompts[i] not in want:
                ids = engine.prompt_ids([{"role": "user", "content": prompts[i]}])
                want[prompts[i]] = engine.generate(ids, p, drafter="pld", mode="fixed").token_ids
            if a.ids != want[prompts[i]]:
                wrong.append(f"client {i} (prompt {spec_bench_prompts.index(prompts[i])}): "
                             f"{a.ids[:8]} != {want[prompts[i]][:8]}, speculation {a.spec}")
    # (Everything a failure can tell: which answers, the pool's and cache's counters.)
    counters = {k: total(after, k) for k in (
        "recallspec:prefix_cache_hits_total", "recallspec:prefix_cache_queries_total",
        "recallspec:prefix_cache_evictions_total", "recallspec:prefix_pool_resident_tokens")}
    assert not wrong, f"{len(wrong)} answers differ from offline greedy decoding:\n" + (
        "\n".join(wrong) + f"\n{counters}\nserver log: {server.log}")
