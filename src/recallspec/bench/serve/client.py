"""The load generator of ``recallspec bench serve``: sessions starting at Poisson
arrivals, each sending its streamed chat requests in a closed loop, and what each request
measured.

Sessions (``workloads.Session``) are independent clients: session i starts at
``arrivals[i]`` whatever the others do (an open loop across sessions), and sends its
request k + 1 as soon as the stream of request k has ended (a closed loop within it, no
think time), with the text this server just answered in the transcript, as a chat client
does: after the first turn each target is sent its own answers. A request that fails
ends its session: the turns after it are recorded as not sent.

Times are ``perf_counter`` seconds on the client, taken as each Server-Sent Event line
arrives. TTFT runs from sending the request to the first chunk that carries a token
(our and OpenAI's first chat chunk carries only the role); each later token-carrying
chunk adds one inter-token latency per token it carries, the gap since the previous
such chunk divided evenly among them (a speculative step delivers several at once);
end-to-end latency runs to ``data: [DONE]``.

Agent workloads (``agents.py``): every request adds its session's fields (tools,
response_format); streamed ``delta.tool_calls`` fragments are joined per ``index``;
a single-turn answer is scored as it ends, and a ``bfcl_multiturn`` session runs the
tool loop: while an answer calls tools (at most ``agents.MAX_TOOL_STEPS`` requests a
user turn), the calls are executed on the session's BFCL API instances and the
transcript goes back with the assistant's calls and one ``role: "tool"`` message per
result; its last record carries BFCL's multi-turn verdict.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from recallspec.bench.serve import agents
from recallspec.bench.serve.workloads import Session, messages

WARMUP_MESSAGE = "Say hello."


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """Arrival times (seconds from the start) of ``n`` requests at ``rate`` req/s.

    The gaps are exponential draws of one generator seeded by ``seed`` alone, scaled by
    ``1 / rate``: every target sees the same times at a rate, and every rate the same
    pattern, stretched (common random numbers, so rates differ only by their rate)."""
    if n < 0 or not 0 < rate < math.inf:
        raise ValueError("n must be >= 0 and rate a positive finite number")
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(1.0)
        out.append(t / rate)
    return out


@dataclass
class RequestRecord:
    target: str
    rate: float
    index: int  # its session's position in the arrival order
    session: str  # its session's id
    source: str  # its session's data (a Spec-Bench category, mt_bench, sharegpt, ...)
    # When it was due, from the start of the rate's run: turn 0 at its session's Poisson
    # arrival, a later turn when the previous one ended.
    scheduled_s: float
    workload: str = "spec_bench"
    turn: int = 0  # 0-based position in its session
    sent_s: float | None = None  # when it was actually sent (the client may lag)
    end_s: float | None = None  # when it ended, successfully or not
    ok: bool = False
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)  # one per token after the first chunk
    output_tokens: int = 0  # the server's usage figure when it gives one, else streamed
    streamed_tokens: int = 0  # counted from the chunks
    usage_completion_tokens: int | None = None
    prompt_tokens: int | None = None
    # usage.prompt_tokens_details.cached_tokens: prompt tokens the server did not prefill
    # (ours and llama-server send it; None when the server does not).
    cached_tokens: int | None = None
    chunks: int = 0  # chunks that carried tokens
    finish_reason: str | None = None
    text: str = ""
    # The server's per-request speculation figures where it reports them (ours:
    # vLLM's ``metrics.speculative_decoding`` shape), as sent.
    speculative_decoding: dict[str, Any] | None = None
    step: int = 0  # bfcl_multiturn: the request's place in its user turn's tool loop
    # The answer's tool calls: {"id", "name", "arguments"} (arguments: the JSON text).
    tool_calls: list[dict[str, str]] = field(default_factory=list)
    valid: bool | None = None  # agent workloads: the answer's verdict (None: not scored)
    invalid_reason: str | None = None

    def calls(self) -> list[tuple[str, str]]:
        return [(c["name"], c["arguments"]) for c in self.tool_calls]


def request_body(model: str, messages: list[dict[str, str]], max_tokens: int,
                 extra: dict[str, Any]) -> dict[str, Any]:
    return {"model": model, "messages": messages, "max_tokens": max_tokens,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
            **extra}


async def stream_request(client: Any, body: dict[str, Any], rec: RequestRecord,
                         t0: float, timeout: float) -> None:
    """Send one streamed chat request, filling ``rec``; never raises for the server's
    or the network's failures (they become ``rec.error``)."""
    t_send = time.perf_counter()
    rec.sent_s = t_send - t0
    try:
        await asyncio.wait_for(_consume(client, body, rec, t_send), timeout)
    except TimeoutError:
        rec.error = f"timeout after {timeout:g} s"
    except Exception as e:  # the network's or the server's failure is a result, not a crash
        rec.error = f"{type(e).__name__}: {e}"
    end = time.perf_counter()
    rec.end_s = end - t0
    rec.ok = rec.error is None
    if rec.ok:
        rec.e2e_s = end - t_send
        rec.output_tokens = (rec.usage_completion_tokens if rec.usage_completion_tokens
                             is not None else rec.streamed_tokens)


async def _consume(client: Any, body: dict[str, Any], rec: RequestRecord, t_send: float
                   ) -> None:
    last: float | None = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            detail = (await resp.aread()).decode(errors="replace")[:300]
            rec.error = f"HTTP {resp.status_code}: {detail}"
            return
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue  # blank separators, SSE comments (keep-alive pings)
            data = line[5:].strip()
            if data == "[DONE]":
                return
            now = time.perf_counter()
            obj = json.loads(data)
            if "error" in obj:
                rec.error = f"stream error: {obj['error']}"
                return
            spec = (obj.get("metrics") or {}).get("speculative_decoding")
            if spec:
                rec.speculative_decoding = spec
            usage = obj.get("usage")
            if usage:
                rec.usage_completion_tokens = int(usage["completion_tokens"])
                rec.prompt_tokens = int(usage["prompt_tokens"])
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                rec.cached_tokens = None if cached is None else int(cached)
            for ch in obj.get("choices") or []:
                delta = ch.get("delta") or {}
                text = delta.get("content") or ""
                fragments = delta.get("tool_calls") or []
                for tc in fragments:
                    _add_fragment(rec.tool_calls, tc)
                ids = ch.get("token_ids")
                n = len(ids) if ids is not None else (1 if text or fragments else 0)
                rec.text += text
                rec.finish_reason = ch.get("finish_reason") or rec.finish_reason
                if n == 0:
                    continue
                rec.chunks += 1
                rec.streamed_tokens += n
                if last is None:
                    rec.ttft_s = now - t_send
                else:
                    rec.itl_s.extend([(now - last) / n] * n)
                last = now
    rec.error = "the stream ended without data: [DONE]"


def _add_fragment(calls: list[dict[str, str]], tc: dict[str, Any]) -> None:
    """Join one streamed ``delta.tool_calls`` item into the call at its ``index``."""
    i = int(tc.get("index", 0))
    while len(calls) <= i:
        calls.append({"id": "", "name": "", "arguments": ""})
    fn = tc.get("function") or {}
    if tc.get("id"):
        calls[i]["id"] = str(tc["id"])
    if fn.get("name"):
        calls[i]["name"] = str(fn["name"])
    calls[i]["arguments"] += str(fn.get("arguments") or "")


async def run_sessions(base: str, model: str, target: str, workload: str,
                       sessions: Sequence[Session], arrivals: Sequence[float], rate: float,
                       max_tokens: int, extra: dict[str, Any], timeout: float
                       ) -> list[RequestRecord]:
    """``sessions[i]`` started at ``arrivals[i]`` seconds, its requests streamed one after
    another (see the module docstring), all sessions concurrently; one record per turn,
    in arrival order, then turn order."""
    if len(sessions) != len(arrivals):
        raise ValueError("one arrival time per session")
    recs: list[list[RequestRecord]] = [[] for _ in sessions]
    limits = httpx.Limits(max_connections=len(sessions) + 1, max_keepalive_connections=8)
    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(timeout),
                                 limits=limits) as client:
        t0 = time.perf_counter()

        async def session(i: int) -> None:
            s, due = sessions[i], arrivals[i]
            await asyncio.sleep(max(0.0, t0 + due - time.perf_counter()))
            fields = {**(s.task.fields if s.task is not None else {}), **extra}
            if s.task is not None and s.task.tool_loop:
                await _tool_session(client, model, target, workload, s, i, due, rate,
                                    max_tokens, fields, timeout, t0, recs[i])
                return
            answers: list[str] = []
            failed = False
            for k in range(len(s.turns)):
                rec = RequestRecord(target, rate, i, s.id, s.source, round(due, 6),
                                    workload=workload, turn=k)
                recs[i].append(rec)
                if failed:
                    rec.error = "not sent: an earlier turn of its session failed"
                    continue
                body = request_body(model, messages(s, k, answers), max_tokens, fields)
                await stream_request(client, body, rec, t0, timeout)
                failed = not rec.ok
                if rec.ok and s.task is not None:
                    rec.valid, why = agents.score_single(workload, s.task, rec.text, rec.calls())
                    rec.invalid_reason = why or None
                answers.append(rec.text)
                due = rec.end_s if rec.end_s is not None else due

        await asyncio.gather(*(session(i) for i in range(len(sessions))))
    return [r for rs in recs for r in rs]


async def _tool_session(client: Any, model: str, target: str, workload: str, s: Session,
                        i: int, due: float, rate: float, max_tokens: int,
                        fields: dict[str, Any], timeout: float, t0: float,
                        out: list[RequestRecord]) -> None:
    """A ``bfcl_multiturn`` session (the module docstring); records appended to ``out``."""
    assert s.task is not None
    env = agents.new_env(s.task)
    transcript: list[dict[str, Any]] = [{"role": "system", "content": s.system}] if s.system else []
    turn_calls: list[list[tuple[str, str]]] = []
    for k, turn in enumerate(s.turns):
        transcript.append({"role": "user", "content": turn})
        calls: list[tuple[str, str]] = []
        turn_calls.append(calls)
        for step in range(agents.MAX_TOOL_STEPS):
            rec = RequestRecord(target, rate, i, s.id, s.source, round(due, 6),
                                workload=workload, turn=k, step=step)
            out.append(rec)
            body = request_body(model, list(transcript), max_tokens,
                                agents.step_fields(fields, step))
            await stream_request(client, body, rec, t0, timeout)
            due = rec.end_s if rec.end_s is not None else due
            if not rec.ok:
                for later in range(k + 1, len(s.turns)):
                    out.append(RequestRecord(target, rate, i, s.id, s.source, round(due, 6),
                                             workload=workload, turn=later,
                                             error="not sent: an earlier turn of its "
                                                   "session failed"))
                return
            if not rec.tool_calls or not all(_json_object(c["arguments"])
                                             for c in rec.tool_calls):
                # A text answer ends the turn; so does a call cut short (max_tokens): its
                # arguments are no JSON a client could run or send back.
                transcript.append({"role": "assistant", "content": rec.text})
                break
            ids = [c["id"] or f"call_{k}_{step}_{j}" for j, c in enumerate(rec.tool_calls)]
            transcript.append({"role": "assistant", "content": rec.text or None, "tool_calls": [
                {"id": cid, "type": "function",
                 "function": {"name": c["name"], "arguments": c["arguments"]}}
                for cid, c in zip(ids, rec.tool_calls, strict=True)]})
            for cid, (name, arguments) in zip(ids, rec.calls(), strict=True):
                result = env.execute(name, arguments)[:agents.RESULT_CHARS]
                transcript.append({"role": "tool", "tool_call_id": cid, "content": result})
                calls.append((name, arguments))
    last = out[-1]
    last.valid, why = agents.score_multi_turn(s.task, turn_calls)
    last.invalid_reason = why or None


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


async def warm_up(base: str, model: str, extra: dict[str, Any], timeout: float) -> str | None:
    """One short request before measuring (first-request costs stay out of the
    figures); the error when it fails, else None."""
    rec = RequestRecord("warm-up", 0.0, 0, "-", "-", 0.0)
    body = request_body(model, [{"role": "user", "content": WARMUP_MESSAGE}], 8, extra)
    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(timeout)) as client:
        await stream_request(client, body, rec, time.perf_counter(), timeout)
    return rec.error
