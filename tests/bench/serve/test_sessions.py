"""`recallspec bench serve` sessions: the closed loop within a session and the open loop
across sessions against a fake OpenAI server, and one end-to-end run of a tiny multi-turn
workload against our real server with its prefix cache on and off."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from helpers.availability import data_dir_or_unavailable

from recallspec.bench.serve.client import run_sessions
from recallspec.bench.serve.workloads import Session

DELAY_S = 0.1  # the fake server's time to answer a request


class _FakeChat(BaseHTTPRequestHandler):
    """Streams ``A<n>`` (n: requests answered so far) in two chunks after ``DELAY_S``,
    with usage (10 prompt tokens per message, all but the last message's cached); a
    request whose last message says FAIL gets a 500."""

    received: list[tuple[float, list[dict[str, str]]]]  # (perf_counter, messages)
    lock = threading.Lock()

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        msgs = body["messages"]
        with self.lock:
            n = len(self.received)
            self.received.append((time.perf_counter(), msgs))
        if "FAIL" in msgs[-1]["content"]:
            self.send_response(500)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"boom")
            return
        time.sleep(DELAY_S)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        usage = {"prompt_tokens": 10 * len(msgs), "completion_tokens": 2,
                 "prompt_tokens_details": {"cached_tokens": 10 * (len(msgs) - 1)}}
        chunks: list[dict[str, Any]] = [
            {"choices": [{"delta": {"role": "assistant"}}]},
            {"choices": [{"delta": {"content": "A"}}]},
            {"choices": [{"delta": {"content": str(n)}, "finish_reason": "stop"}]},
            {"choices": [], "usage": usage}]
        for c in chunks:
            self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture
def fake_server() -> Iterator[tuple[str, list[tuple[float, list[dict[str, str]]]]]]:
    received: list[tuple[float, list[dict[str, str]]]] = []
    handler = type("Handler", (_FakeChat,), {"received": received})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", received
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_session_sends_its_next_turn_when_the_answer_has_ended(
        fake_server: tuple[str, list[tuple[float, list[dict[str, str]]]]]) -> None:
    base, received = fake_server
    sessions = [Session("a", "x", ("one", "two", "three")),
                Session("b", "x", ("uno", "FAIL", "tres")),
                Session("c", "x", ("q1", "q2"), system="sys", history=False, prefix="doc "),
                ]
    arrivals = [0.0, 0.02, 0.3]
    recs = asyncio.run(run_sessions(base, "m", "fake", "multiturn", sessions, arrivals, 1.0,
                                    8, {}, 10.0))
    assert [(r.index, r.session, r.turn) for r in recs] == [
        (0, "a", 0), (0, "a", 1), (0, "a", 2), (1, "b", 0), (1, "b", 1), (1, "b", 2),
        (2, "c", 0), (2, "c", 1)]
    a, b, c = recs[:3], recs[3:6], recs[6:]
    # Closed loop within a session: each turn is due, and sent, when the previous ended.
    for s in (a, c):
        for prev, nxt in itertools.pairwise(s):
            assert nxt.scheduled_s == pytest.approx(prev.end_s, abs=1e-6)
            assert nxt.sent_s is not None and prev.end_s is not None
            assert nxt.sent_s >= prev.end_s and nxt.sent_s - prev.end_s < DELAY_S
    # Open loop across sessions: b starts at its arrival, while a's first turn runs.
    assert b[0].sent_s is not None and a[0].end_s is not None and b[0].sent_s < a[0].end_s
    assert c[0].scheduled_s == 0.3 and c[0].sent_s is not None and c[0].sent_s >= 0.29
    for r in (*a, b[0], *c):
        assert r.ok and r.workload == "multiturn" and r.text.startswith("A")
        assert r.output_tokens == 2 and r.ttft_s is not None and r.ttft_s >= DELAY_S * 0.9
    # The transcript carries this server's own answers; c has no transcript.
    by_last = {msgs[-1]["content"]: msgs for _, msgs in received}
    assert by_last["three"] == [
        {"role": "user", "content": "one"}, {"role": "assistant", "content": a[0].text},
        {"role": "user", "content": "two"}, {"role": "assistant", "content": a[1].text},
        {"role": "user", "content": "three"}]
    assert by_last["doc q2"] == [{"role": "system", "content": "sys"},
                                 {"role": "user", "content": "doc q2"}]
    assert (a[2].prompt_tokens, a[2].cached_tokens) == (50, 40)
    # A failed turn ends its session: the next one is recorded, never sent.
    assert b[1].error is not None and b[1].error.startswith("HTTP 500")
    assert not b[2].ok and b[2].sent_s is None and "not sent" in (b[2].error or "")
    assert "tres" not in by_last and len(received) == 7


@pytest.mark.server
def test_prefix_cache_end_to_end_on_a_real_server(tmp_path: Path) -> None:
    """2 chats x 2 turns, max_tokens 8, through the CLI against `recallspec serve` with
    its prefix cache on and off: turn 2 reuses cached prompt tokens only with it on."""
    from recallspec.cli import main

    data_dir_or_unavailable()
    out = tmp_path / "serve"
    rc = main(["bench", "serve", "--workload", "multiturn", "--sessions", "2", "--turns", "2",
               "--targets", "ours-off,ours-off-nocache", "--rates", "4", "--max-tokens", "8",
               "--out", str(out)])
    assert rc == 0
    rep = json.loads((out / "serve.json").read_text())
    assert rep["config"]["context"] == 2048 and rep["workload"]["history"]
    assert "--no-prefix-cache" in rep["targets"]["ours-off-nocache"]["argv"]
    assert "--no-prefix-cache" not in rep["targets"]["ours-off"]["argv"]
    recs = rep["records"]
    assert len(recs) == 8 and all(r["ok"] for r in recs), [r["error"] for r in recs]
    by = {(r["target"], r["session"], r["turn"]): r for r in recs}
    for (target, session, turn), r in by.items():
        assert r["workload"] == "multiturn" and r["cached_tokens"] is not None
        assert r["cached_tokens"] <= r["prompt_tokens"]
        if turn == 1:  # the transcript grew by the first answer and the second turn
            assert r["prompt_tokens"] > by[(target, session, 0)]["prompt_tokens"] + 1
            if target == "ours-off":  # the first turn's KV, left in its slot
                assert r["cached_tokens"] > 0
        if target == "ours-off-nocache":
            assert r["cached_tokens"] == 0
    s = {x["target"]: x for x in rep["summaries"]}
    assert s["ours-off"]["cached_share_later"] > 0.5
    assert s["ours-off-nocache"]["cached_share_later"] == 0
    assert rep["prefix_cache"][0]["target"] == "ours-off"
    md = (out / "serve.md").read_text()
    assert "## 4 sessions/s" in md and "## Prefix cache" in md
