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
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from helpers.availability import data_dir_or_unavailable

from recallspec.bench.serve.client import run_sessions
from recallspec.bench.serve.workloads import Session

GATE_S = 30.0  # a held answer's longest wait: a hang guard only (the client then fails)


@dataclass
class _Log:
    """What the fake server saw. ``events``: ("in", m) as the request whose last message
    is ``m`` arrives, ("end", m) just before its closing ``data: [DONE]`` (so before its
    client can see the end); ``spans``: m -> (perf_counter at its arrival, perf_counter
    just before its first token chunk); ``holds``: m -> the message whose arrival m's
    tokens wait for."""

    holds: dict[str, str]
    received: list[list[dict[str, str]]] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def at(self, kind: str, message: str) -> int:
        return self.events.index((kind, message))


class _FakeChat(BaseHTTPRequestHandler):
    """Streams ``A<n>`` (n: requests received before it) in two chunks after a role
    chunk, with usage (10 prompt tokens per message, all but the last message's cached);
    a request whose last message says FAIL gets a 500. A request named in ``log.holds``
    sends its token chunks only once the message it waits for has arrived (after
    GATE_S: an error event instead), so what a client sends while that stream is open
    shows in the order of ``log.events``, whatever the machine's speed."""

    log: _Log

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        msgs, log = body["messages"], self.log
        last = msgs[-1]["content"]
        t_in = time.perf_counter()
        with log.cond:
            n = len(log.received)
            log.received.append(msgs)
            log.events.append(("in", last))
            log.cond.notify_all()
        if "FAIL" in last:
            self.send_response(500)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"boom")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self._send({"choices": [{"delta": {"role": "assistant"}}]})
        if last in log.holds:
            with log.cond:
                if not log.cond.wait_for(lambda: ("in", log.holds[last]) in log.events,
                                         GATE_S):
                    self._send({"error": {"message": f"{log.holds[last]!r} never came"}})
                    return
        usage = {"prompt_tokens": 10 * len(msgs), "completion_tokens": 2,
                 "prompt_tokens_details": {"cached_tokens": 10 * (len(msgs) - 1)}}
        log.spans[last] = (t_in, time.perf_counter())
        for c in ({"choices": [{"delta": {"content": "A"}}]},
                  {"choices": [{"delta": {"content": str(n)}, "finish_reason": "stop"}]},
                  {"choices": [], "usage": usage}):
            self._send(c)
        with log.cond:
            log.events.append(("end", last))
        self.wfile.write(b"data: [DONE]\n\n")

    def _send(self, chunk: dict[str, Any]) -> None:
        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.flush()


# a's first answer waits until b's first request has come; b's first answer until a's
# third request has come: both can only arrive while the other session's stream is open.
HOLDS = {"one": "uno", "uno": "three"}


@pytest.fixture
def fake_server() -> Iterator[tuple[str, _Log]]:
    log = _Log(dict(HOLDS))
    handler = type("Handler", (_FakeChat,), {"log": log})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", log
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_session_sends_its_next_turn_when_the_answer_has_ended(
        fake_server: tuple[str, _Log]) -> None:
    base, log = fake_server
    sessions = [Session("a", "x", ("one", "two", "three")),
                Session("b", "x", ("uno", "FAIL", "tres")),
                Session("c", "x", ("q1", "q2"), system="sys", history=False, prefix="doc "),
                ]
    arrivals = [0.0, 0.02, 0.3]
    recs = asyncio.run(run_sessions(base, "m", "fake", "multiturn", sessions, arrivals, 1.0,
                                    8, {}, 2 * GATE_S))
    assert [(r.index, r.session, r.turn) for r in recs] == [
        (0, "a", 0), (0, "a", 1), (0, "a", 2), (1, "b", 0), (1, "b", 1), (1, "b", 2),
        (2, "c", 0), (2, "c", 1)]
    a, b, c = recs[:3], recs[3:6], recs[6:]
    for r in (*a, b[0], *c):
        assert r.ok, r.error  # (a held answer whose message never came fails here)
        assert r.workload == "multiturn" and r.text.startswith("A") and r.output_tokens == 2
    # Closed loop within a session: each turn is due, and sent, when the previous ended
    # (the server saw the previous answer's end before the next request) ...
    for s, turns in ((a, ("one", "two", "three")), (c, ("doc q1", "doc q2"))):
        for (prev, nxt), (m_prev, m_nxt) in zip(itertools.pairwise(s),
                                                itertools.pairwise(turns), strict=True):
            assert nxt.scheduled_s == pytest.approx(prev.end_s, abs=1e-6)
            assert nxt.sent_s is not None and prev.end_s is not None
            assert nxt.sent_s >= prev.end_s
            assert log.at("end", m_prev) < log.at("in", m_nxt)
    # ... and for nothing else: a's next turns went out while b's first stream was still
    # open (it was held until a's third request came).
    assert log.at("in", "three") < log.at("end", "uno")
    assert a[2].sent_s is not None and b[0].end_s is not None and a[2].sent_s < b[0].end_s
    # Open loop across sessions: b starts at its arrival, while a's first turn runs (held
    # until b's first request came), and c not before its arrival.
    assert log.at("in", "uno") < log.at("end", "one")
    assert b[0].sent_s is not None and a[0].end_s is not None and b[0].sent_s < a[0].end_s
    assert c[0].scheduled_s == 0.3 and c[0].sent_s is not None and c[0].sent_s >= 0.29
    # TTFT runs from sending to the first token chunk: it spans the server's time from
    # the request's arrival to that chunk (a's first: the hold after its role chunk).
    for r, m in zip((*a, b[0], *c), ("one", "two", "three", "uno", "doc q1", "doc q2"),
                    strict=True):
        t_in, t_first = log.spans[m]
        assert r.ttft_s is not None and r.ttft_s >= t_first - t_in
    # The transcript carries this server's own answers; c has no transcript.
    by_last = {msgs[-1]["content"]: msgs for msgs in log.received}
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
    assert "tres" not in by_last and len(log.received) == 7


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
