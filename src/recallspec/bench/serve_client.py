"""The load generator of ``recallspec bench serve``: Poisson arrivals, streamed chat
requests, and what each request measured.

Times are ``perf_counter`` seconds on the client, taken as each Server-Sent Event line
arrives. TTFT runs from sending the request to the first chunk that carries a token
(our and OpenAI's first chat chunk carries only the role); each later token-carrying
chunk adds one inter-token latency per token it carries, the gap since the previous
such chunk divided evenly among them (a speculative step delivers several at once);
end-to-end latency runs to ``data: [DONE]``.
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
    index: int  # position in the arrival order
    question_id: str
    category: str
    scheduled_s: float  # Poisson arrival time, from the start of the rate's run
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
    chunks: int = 0  # chunks that carried tokens
    finish_reason: str | None = None
    text: str = ""
    # The server's per-request speculation figures where it reports them (ours:
    # vLLM's ``metrics.speculative_decoding`` shape), as sent.
    speculative_decoding: dict[str, Any] | None = None


def request_body(model: str, prompt: str, max_tokens: int, extra: dict[str, Any]
                 ) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, **extra}


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
            for ch in obj.get("choices") or []:
                text = (ch.get("delta") or {}).get("content") or ""
                ids = ch.get("token_ids")
                n = len(ids) if ids is not None else (1 if text else 0)
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


@dataclass(frozen=True)
class Prompt:
    question_id: str
    category: str
    text: str


async def run_rate(base: str, model: str, target: str, prompts: Sequence[Prompt],
                   arrivals: Sequence[float], rate: float, max_tokens: int,
                   extra: dict[str, Any], timeout: float) -> list[RequestRecord]:
    """``prompts[i]`` sent at ``arrivals[i]`` seconds, all streamed concurrently; one
    record each, in arrival order."""
    import httpx

    recs = [RequestRecord(target, rate, i, p.question_id, p.category, round(a, 6))
            for i, (p, a) in enumerate(zip(prompts, arrivals, strict=True))]
    limits = httpx.Limits(max_connections=len(prompts) + 1, max_keepalive_connections=8)
    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(timeout),
                                 limits=limits) as client:
        t0 = time.perf_counter()
        tasks = []
        for p, a, rec in zip(prompts, arrivals, recs, strict=True):
            delay = t0 + a - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            body = request_body(model, p.text, max_tokens, extra)
            tasks.append(asyncio.create_task(stream_request(client, body, rec, t0, timeout)))
        await asyncio.gather(*tasks)
    return recs


async def warm_up(base: str, model: str, extra: dict[str, Any], timeout: float) -> str | None:
    """One short request before measuring (first-request costs stay out of the
    figures); the error when it fails, else None."""
    import httpx

    rec = RequestRecord("warm-up", 0.0, 0, "-", "-", 0.0)
    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(timeout)) as client:
        await stream_request(client, request_body(model, WARMUP_MESSAGE, 8, extra), rec,
                             time.perf_counter(), timeout)
    return rec.error
