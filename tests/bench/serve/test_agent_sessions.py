"""The agent workloads' client side against a fake streaming server: tool-call fragments
joined per index, the tool loop of ``bfcl_multiturn`` (calls executed on BFCL's API
classes, results sent back as tool messages), the answers scored, the figures."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from recallspec.bench.serve import agent_data, agents
from recallspec.bench.serve.client import RequestRecord, _add_fragment, run_sessions
from recallspec.bench.serve.report import summarize
from recallspec.bench.serve.workloads import Session, Workload, context_needed, load_sessions


def bfcl_or_fail() -> None:
    import os

    if not agent_data.bfcl_available():
        if os.environ.get("CI"):
            pytest.fail(f"bfcl-eval is missing: {agent_data.BFCL_INSTALL}")
        pytest.skip(f"bfcl-eval is missing: {agent_data.BFCL_INSTALL}")


def test_tool_call_fragments_join_per_index() -> None:
    calls: list[dict[str, str]] = []
    for tc in ({"index": 0, "id": "call_a", "function": {"name": "f", "arguments": ""}},
               {"index": 1, "id": "call_b", "function": {"name": "g", "arguments": "{\"x\""}},
               {"index": 0, "function": {"arguments": "{}"}},
               {"index": 1, "function": {"arguments": ": 1}"}}):
        _add_fragment(calls, tc)
    assert calls == [{"id": "call_a", "name": "f", "arguments": "{}"},
                     {"id": "call_b", "name": "g", "arguments": "{\"x\": 1}"}]


class _ToolChat(BaseHTTPRequestHandler):
    """Answers a request whose last message is the user's with one streamed tool call
    (``CALL``, its arguments in two fragments), any other with text."""

    received: list[list[dict[str, Any]]]
    call: tuple[str, str]
    lock = threading.Lock()

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            self.received.append(body["messages"])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        name, args = self.call
        if body["messages"][-1]["role"] == "user":
            chunks: list[dict[str, Any]] = [
                {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_1", "type":
                 "function", "function": {"name": name, "arguments": ""}}]}}]},
                {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {
                    "arguments": args[:5]}}]}}]},
                {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {
                    "arguments": args[5:]}}]}, "finish_reason": "tool_calls"}]}]
        else:
            chunks = [{"choices": [{"delta": {"content": "Done."}, "finish_reason": "stop"}]}]
        for c in chunks:
            self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture
def tool_server() -> Iterator[tuple[str, type[_ToolChat]]]:
    handler = type("Handler", (_ToolChat,), {"received": [], "call": ("", "")})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", handler
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_multi_turn_tool_loop(tool_server: tuple[str, type[_ToolChat]]) -> None:
    bfcl_or_fail()
    base, handler = tool_server
    s = load_sessions(Workload("bfcl_multiturn", sessions=1, turns=2), 0)[0]
    assert s.task is not None and s.task.item is not None
    name, kwargs = agent_data.answer_calls(s.task.item)[0][0]
    handler.call = (name, json.dumps(kwargs))
    recs = asyncio.run(run_sessions(base, "m", "fake", "bfcl_multiturn", [s], [0.0], 1.0,
                                    16, {}, 30.0))
    # Each turn: a request answered by the call, then one with its result answered in text.
    assert [(r.turn, r.step) for r in recs] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert recs[0].calls() == [(name, json.dumps(kwargs))]
    second = handler.received[1]
    assert second[-2]["role"] == "assistant" and second[-2]["tool_calls"][0]["id"] == "call_1"
    assert second[-1]["role"] == "tool" and second[-1]["tool_call_id"] == "call_1"
    expected = agent_data.MultiTurnEnv(s.task.item).execute(name, kwargs)
    assert second[-1]["content"] == expected[:agents.RESULT_CHARS]
    # Every request carried the tools; the verdict is BFCL's on the calls made.
    assert all(r.valid is None for r in recs[:-1]) and recs[-1].valid is not None
    assert summarize(recs)["valid_share"] == float(bool(recs[-1].valid))


def test_single_turn_answers_are_scored(tool_server: tuple[str, type[_ToolChat]]) -> None:
    bfcl_or_fail()
    base, handler = tool_server
    ss = [s for s in load_sessions(Workload("bfcl", sessions=8), 0)
          if s.source == "simple_python"][:1]
    assert ss and ss[0].task is not None and ss[0].task.item is not None
    name, kwargs = agent_data.answer_calls(ss[0].task.item)[0][0]
    handler.call = (name, json.dumps(kwargs))
    recs = asyncio.run(run_sessions(base, "m", "fake", "bfcl", ss, [0.0], 1.0, 16, {}, 30.0))
    assert len(recs) == 1 and recs[0].valid is True
    handler.call = (name, "{}")  # required parameters missing
    recs = asyncio.run(run_sessions(base, "m", "fake", "bfcl", ss, [0.0], 1.0, 16, {}, 30.0))
    assert recs[0].valid is False and recs[0].invalid_reason


def test_agent_sessions_size_the_context_with_their_tools() -> None:
    bfcl_or_fail()
    s = load_sessions(Workload("bfcl", sessions=1), 0)[0]
    bare = Session(s.id, s.source, s.turns)
    assert context_needed([s], 64) > context_needed([bare], 64)
    assert s.record()["fields"]["tools"] == s.task.fields["tools"]  # type: ignore[union-attr]


def test_agent_figures() -> None:
    recs = [RequestRecord("t", 1.0, i, f"s{i}", "x", 0.0, workload="extract", ok=True,
                          output_tokens=10, valid=i % 2 == 0,
                          speculative_decoding={"num_steps": 5, "num_accepted_tokens": 4,
                                                "num_forced_tokens": 1})
            for i in range(4)]
    recs.append(RequestRecord("t", 1.0, 4, "s4", "x", 0.0, workload="extract", ok=False))
    f = summarize(recs)
    assert f["valid_share"] == 2 / 5  # a failed request counts as invalid
    assert f["tokens_per_step"] == 40 / 20 and f["forced_share"] == 4 / 16
