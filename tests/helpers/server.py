"""A real `recallspec serve` process for the server tests, and reading its /metrics."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

MODEL = "smollm2-135m"
DTYPE = os.environ.get("RECALLSPEC_TEST_DTYPE", "auto")  # as the conftest engine
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]  # (name, labels) -> value


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    base: str
    log: Path

    def client(self, **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key=kw.pop("api_key", "unused"),
                             max_retries=0, timeout=300, **kw)

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.base}/v1", api_key="unused", max_retries=0,
                                  timeout=300)

    def metrics(self) -> Samples:
        """Every sample of /metrics: (name, labels) -> value."""
        out = {}
        for line in httpx.get(f"{self.base}/metrics").text.splitlines():
            if not line or line.startswith("#"):
                continue
            key, value = line.rsplit(" ", 1)
            m = re.fullmatch(r"([^{]+)(?:\{(.*)\})?", key)
            assert m, line
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            out[(m.group(1), labels)] = float(value)
        return out

    def wait_idle(self, timeout: float = 30.0) -> Samples:
        """Metrics once no request runs or waits (fails after ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if total(m, "recallspec:num_requests_running") == 0 and total(
                    m, "recallspec:num_requests_waiting") == 0:
                return m
            assert time.monotonic() < deadline, "requests are stuck in the server"
            time.sleep(0.1)


def total(m: Samples, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, lab), v in m.items() if n == name and want <= lab)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(log: Path, *args: str, env: dict[str, str] | None = None,
                 ) -> Iterator[Server]:
    """``recallspec serve`` with ``args`` (and ``env`` added), up and answering; its cost
    curve measured before it serves unless ``args`` say otherwise (the tests' servers
    serve as before the background measurement; tests/server/test_server_cost_curve.py
    covers that)."""
    port = _free_port()
    if "--cost-curve" not in args:
        args = (*args, "--cost-curve", "start")
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "recallspec", "serve", "--port", str(port), "--dtype", DTYPE,
             *args], stdout=f, stderr=subprocess.STDOUT,
            env=None if env is None else {**os.environ, **env})
        server = Server(proc, f"http://127.0.0.1:{port}", log)
        try:
            deadline = time.monotonic() + 240
            while True:
                assert proc.poll() is None, f"server exited:\n{log.read_text()}"
                assert time.monotonic() < deadline, f"server did not start:\n{log.read_text()}"
                try:
                    if httpx.get(f"{server.base}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.25)
            yield server
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def ext(**kw: Any) -> dict[str, Any]:
    return {"recallspec": {"return_token_ids": True, **kw}}


@dataclass
class Answer:
    ids: list[int] = field(default_factory=list)
    text: str = ""
    spec: dict[str, Any] | None = None
    usage: Any = None
    cancelled: bool = False


async def stream_chat(client: openai.AsyncOpenAI, prompt: str, drafter: str, max_tokens: int,
                      cancel_after: int | None = None) -> Answer:
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
        temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body=ext(drafter=drafter))
    a, pieces, n = Answer(), [], 0
    async for chunk in stream:
        if chunk.choices:
            c = chunk.choices[0]
            a.ids += (c.model_extra or {}).get("token_ids") or []
            pieces.append(c.delta.content or "")
            n += bool(c.delta.content)
            if cancel_after is not None and n >= cancel_after:
                await stream.close()  # hang up mid-stream
                a.cancelled = True
                return a
        a.spec = (chunk.model_extra or {}).get("metrics", {}).get("speculative_decoding", a.spec)
        a.usage = chunk.usage or a.usage
    a.text = "".join(pieces)
    return a
