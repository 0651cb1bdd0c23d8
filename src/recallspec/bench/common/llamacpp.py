"""Native llama.cpp, our benchmark peer: its binaries, its server and its own benchmark.

``make peers`` builds ``llama-server``, ``llama-bench`` and ``llama-quantize`` from the
llama.cpp source that llama-cpp-python 0.3.36 vendors (commit 0c1e570), for this CPU,
into ``.venv/peers/llama.cpp/bin`` with ``peer.json`` (how they were built) beside them.
``RECALLSPEC_LLAMACPP_BIN`` names another directory holding them.

* ``bin_dir`` / ``available`` / ``peer_info``: where the binaries are (a ``PeerNotBuilt``
  naming ``make peers`` when they are not), and what they are.
* ``LlamaServer``: one ``llama-server`` child on a free loopback port (flash attention
  on, ``-np`` slots, optionally one ``--spec-type`` of n-gram speculation), ready once
  ``/health`` answers, its log kept in a file, stopped (its process group) on exit and
  at interpreter exit. ``complete`` posts token ids to ``/completion`` and returns the
  generated ids, the stop reason and the server's own ``timings``.
* ``llama_bench``: ``llama-bench -o json`` rows (tg, pp, pp at a depth).
* ``server_cost_curve``: llama-server's verification cost curve (k new prompt tokens on a
  cached prefix), as ``bench runtime`` and ``bench scale`` measure it.

Nothing here imports torch or our model code: the peer is a separate program.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from recallspec.bench.common.process import free_port, stop_group
from recallspec.errors import DataError, RecallspecError

BIN_ENV = "RECALLSPEC_LLAMACPP_BIN"
BINARIES = ("llama-server", "llama-bench")
# llama-server's n-gram speculation (`--spec-type`, common/speculative.cpp): no draft model.
SPEC_TYPES = ("ngram-simple", "ngram-mod", "ngram-map-k", "ngram-map-k4v", "ngram-cache")
_REPO = Path(__file__).resolve().parents[4]  # src/recallspec/bench/common/llamacpp.py -> repo
_SUBDIR = Path("peers") / "llama.cpp" / "bin"
_LOG_TAIL = 5  # log lines quoted when the server dies
# Token ids of the cost curve's random prompts: inside every shape's vocabulary and the
# default tokenizer's ordinary range (49,152 entries), past its special tokens.
_IDS = (100, 40_000)


class PeerNotBuilt(DataError):
    """The native llama.cpp binaries are not there (``make peers`` builds them)."""


class LlamaCppError(RecallspecError):
    """llama.cpp refused a request or a llama-bench run failed (the server goes on)."""


class LlamaCppCrashed(LlamaCppError):
    """The server process died or stopped answering: it is finished."""


# ---- the binaries ---------------------------------------------------------------------


def candidate_dirs() -> list[Path]:
    """Where the binaries are looked for, in order: $RECALLSPEC_LLAMACPP_BIN alone when
    set; else the running venv's ``peers/llama.cpp/bin``, then the repository's
    ``.venv/peers/llama.cpp/bin`` (for a Python outside the venv)."""
    env = os.environ.get(BIN_ENV)
    if env:
        return [Path(env)]
    dirs = [Path(sys.prefix) / _SUBDIR, _REPO / ".venv" / _SUBDIR]
    return list(dict.fromkeys(d.resolve() for d in dirs))


def bin_dir() -> Path:
    """The directory holding llama-server and llama-bench; ``PeerNotBuilt`` if none does."""
    dirs = candidate_dirs()
    for d in dirs:
        if all(os.access(d / b, os.X_OK) for b in BINARIES):
            return d
    where = ", ".join(str(d) for d in dirs)
    raise PeerNotBuilt(f"native llama.cpp is not built: no {' / '.join(BINARIES)} in {where} "
                       f"(run `make peers`, or set {BIN_ENV} to their directory)")


def available() -> bool:
    try:
        bin_dir()
    except PeerNotBuilt:
        return False
    return True


def binary(name: str) -> Path:
    return bin_dir() / name


def peer_info(system_info: str | None = None) -> dict[str, Any]:
    """``peer.json`` (written by ``make peers``: llama-cpp-python version, llama.cpp
    commit, cmake arguments, compilers) plus the binaries' directory and, when given,
    the ``system_info`` line a llama.cpp process printed (its instruction sets)."""
    d = bin_dir()
    try:
        info: dict[str, Any] = json.loads((d / "peer.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        info = {"peer_json": f"unreadable: {type(e).__name__}"}
    info["bin"] = str(d)
    if system_info is not None:
        info["system_info"] = system_info
    return info


def system_info_line(log_text: str) -> str | None:
    """The ``system_info: ...`` line of a llama.cpp log (its prefix stripped)."""
    for line in log_text.splitlines():
        i = line.find("system_info:")
        if i >= 0:
            return line[i:].strip()
    return None


# ---- llama-server -----------------------------------------------------------------------


@dataclass(frozen=True)
class ServerConfig:
    gguf: str
    threads: int
    ctx_per_slot: int = 4096  # -c is this times `parallel` (llama-server splits it)
    parallel: int = 1  # -np: slots, served by continuous batching
    spec_type: str | None = None  # one of SPEC_TYPES, else plain decoding
    start_timeout_s: float = 300.0
    request_timeout_s: float = 3600.0  # a turn of our benchmarks takes seconds
    # --swa-full: a sliding-window model's KV cache at full size, so a prompt that extends
    # a cached one reuses all of it (else llama-server re-evaluates part of the cached
    # tail, more tokens than the new ones).
    swa_full: bool = False
    # --jinja --chat-template-file FILE: the prompt rendered by this Jinja template (tools
    # included), the output's tool calls parsed by the format llama.cpp detects in it.
    chat_template_file: str | None = None

    def __post_init__(self) -> None:
        if self.spec_type is not None and self.spec_type not in SPEC_TYPES:
            raise DataError(f"unknown llama.cpp --spec-type {self.spec_type!r}; "
                            f"available: {', '.join(SPEC_TYPES)}")
        if self.threads < 1 or self.parallel < 1 or self.ctx_per_slot < 16:
            raise DataError("llama-server needs threads >= 1, parallel >= 1, ctx >= 16")
        if self.start_timeout_s <= 0 or self.request_timeout_s <= 0:
            raise DataError("llama-server timeouts must be > 0")

    def argv(self, server: Path, port: int) -> list[str]:
        """The command line. ``-lv 4`` (trace): the start-up log then holds the
        ``system_info`` line and the sampler chain; nothing per token."""
        t = str(self.threads)
        argv = [str(server), "-m", self.gguf, "--host", "127.0.0.1", "--port", str(port),
                "-t", t, "-tb", t, "-fa", "on", "-c", str(self.ctx_per_slot * self.parallel),
                "-np", str(self.parallel), "--no-webui", "-lv", "4"]
        if self.spec_type is not None:
            argv += ["--spec-type", self.spec_type]
        if self.swa_full:
            argv.append("--swa-full")
        if self.chat_template_file is not None:
            argv += ["--jinja", "--chat-template-file", self.chat_template_file]
        return argv


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]  # generated ids as returned (stop_type "eos": its EOG token last)
    stop_type: str  # the server's: "eos", "limit" (n_predict reached), "word" or "none"
    timings: dict[str, float]  # the server's: prompt_n, prompt_ms, predicted_n, ...
    client_s: float  # request sent -> response read, on our side
    prompt_tokens: int  # tokens_evaluated

    @property
    def server_s(self) -> float:
        """Prefill + decode as the server timed them (``prompt_ms + predicted_ms``)."""
        return (self.timings.get("prompt_ms", 0.0) + self.timings.get("predicted_ms", 0.0)) / 1e3

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "server_s": self.server_s}


_LIVE: set[subprocess.Popen[bytes]] = set()


def _stop_all() -> None:
    for proc in list(_LIVE):
        _stop(proc)


atexit.register(_stop_all)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server child and its process group (10 s grace)."""
    _LIVE.discard(proc)
    stop_group(proc, 10.0)


class LlamaServer:
    """A running ``llama-server`` (a context manager; ``start`` / ``stop`` also work)."""

    def __init__(self, config: ServerConfig, log_path: Path | None = None) -> None:
        self.config = config
        self.log_path = log_path  # None: a temporary file, removed on stop
        self.port = 0
        self.system_info: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._own_log = False

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def info(self) -> dict[str, Any]:
        return {**peer_info(self.system_info), "argv": self.argv}

    @property
    def pid(self) -> int:
        """The server's process id (its resident memory: ``/proc/PID/status``)."""
        if self._proc is None:
            raise LlamaCppCrashed("llama-server is not running")
        return int(self._proc.pid)

    @property
    def argv(self) -> list[str]:
        return list(self._proc.args) if self._proc is not None else []  # type: ignore[arg-type]

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> LlamaServer:
        server = binary("llama-server")
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(fd)
            self.log_path, self._own_log = Path(name), True
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                self.config.argv(server, self.port), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)
        _LIVE.add(self._proc)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.system_info = system_info_line(self.log_text())
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.config.start_timeout_s
        while True:
            self._check_alive()
            if time.monotonic() > deadline:
                raise self._crashed(f"not ready after {self.config.start_timeout_s:.0f} s")
            try:
                with urllib.request.urlopen(f"{self.base}/health", timeout=2.0) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass  # still loading (503) or not listening yet
            time.sleep(0.2)

    def stop(self) -> None:
        if self._proc is not None:
            _stop(self._proc)
        if self._own_log and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
            self._own_log = False

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return ""

    def _check_alive(self) -> None:
        if self._proc is None:
            raise LlamaCppCrashed("llama-server is not running")
        rc = self._proc.poll()
        if rc is not None:
            how = (f"killed by {signal.Signals(-rc).name}" if rc < 0
                   else f"exited with status {rc}")
            raise self._crashed(how)

    def _crashed(self, how: str) -> LlamaCppCrashed:
        if self._proc is not None and self._proc.poll() is None:
            _stop(self._proc)
        tail = [ln.strip() for ln in self.log_text().splitlines() if ln.strip()][-_LOG_TAIL:]
        return LlamaCppCrashed(f"llama-server {how}" + (f" ({' | '.join(tail)})" if tail else ""))

    def complete(self, prompt_ids: Sequence[int], n_predict: int, *, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                 ignore_eos: bool = False, cache_prompt: bool = False) -> Completion:
        """One ``/completion`` of the token ids. Sampling as ours: temperature, then
        top-k, then top-p (0 / 1.0 = off; no min-p, penalties or the like), greedy at
        temperature 0. The server stops at its vocabulary's end-of-generation tokens;
        ``ignore_eos`` bans them instead."""
        self._check_alive()
        body = {
            "prompt": [int(t) for t in prompt_ids], "n_predict": int(n_predict),
            "temperature": float(temperature), "top_k": int(top_k), "top_p": float(top_p),
            "samplers": ["top_k", "temperature", "top_p"], "seed": 0 if seed is None else seed,
            "ignore_eos": bool(ignore_eos), "cache_prompt": bool(cache_prompt),
            "return_tokens": True, "stream": False,
        }
        req = urllib.request.Request(f"{self.base}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=self.config.request_timeout_s) as r:
                out = json.loads(r.read())
        except urllib.error.HTTPError as e:  # the server answered: a refused request
            msg = e.read().decode(errors="replace")[:300]
            raise LlamaCppError(f"llama-server refused the request (HTTP {e.code}): "
                                f"{msg}") from None
        except (urllib.error.URLError, OSError, json.JSONDecodeError) as e:
            if self._proc is not None:  # a dying server drops its connections first
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(5.0)
            self._check_alive()  # died: LlamaCppCrashed with how and its log's tail
            raise self._crashed(f"stopped answering ({type(e).__name__}: {e})") from None
        client_s = time.perf_counter() - t0
        timings = {str(k): float(v) for k, v in out.get("timings", {}).items()}
        return Completion([int(t) for t in out.get("tokens", [])], str(out.get("stop_type")),
                          timings, client_s, int(out.get("tokens_evaluated", len(prompt_ids))))


# ---- llama-bench --------------------------------------------------------------------------


def _csv(v: int | Sequence[int]) -> str:
    return str(v) if isinstance(v, int) else ",".join(str(int(x)) for x in v)


def llama_bench(gguf: str, threads: int, *, p: int | Sequence[int] = 0,
                n: int | Sequence[int] = 0, depth: int | Sequence[int] = 0, repeats: int = 5,
                timeout_s: float = 3600.0) -> list[dict[str, Any]]:
    """``llama-bench -o json -fa 1 -t T -p P -n N -d D -r R``: one row per test (tg:
    ``n`` > 0 and ``p`` = 0; pp: ``p`` > 0 and ``n`` = 0; ``depth`` tokens are evaluated
    first, untimed). Rows as llama-bench writes them: ``avg_ns``, ``stddev_ns``,
    ``avg_ts``, ``stddev_ts``, ``samples_ns``, ``n_prompt``, ``n_gen``, ``n_depth``,
    ``build_commit``, ``cpu_info``, ``n_threads``, ... A pp test computes logits for its
    last token only (a verification forward needs every row's)."""
    argv = [str(binary("llama-bench")), "-m", gguf, "-o", "json", "-fa", "1", "-t", str(threads),
            "-p", _csv(p), "-n", _csv(n), "-d", _csv(depth), "-r", str(repeats)]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise LlamaCppError(f"llama-bench did not finish in {timeout_s:.0f} s") from None
    if r.returncode != 0:
        how = (f"killed by {signal.Signals(-r.returncode).name}" if r.returncode < 0
               else f"exited with status {r.returncode}")
        tail = " | ".join(ln.strip() for ln in r.stderr.splitlines()[-_LOG_TAIL:] if ln.strip())
        raise LlamaCppError(f"llama-bench {how} ({tail})")
    try:
        rows = json.loads(r.stdout)
    except json.JSONDecodeError as e:
        raise LlamaCppError(f"llama-bench wrote no JSON ({e.msg})") from None
    return [dict(row) for row in rows]


def server_cost_curve(srv: LlamaServer, ks: tuple[int, ...], *, cached: int,
                      repeats: int) -> dict[str, float]:
    """{k: ms} of llama-server evaluating k new prompt tokens on ``cached`` tokens already
    in its prompt cache (median of ``repeats`` after a warm-up, its own ``prompt_ms``).
    Each request sends the cached random tokens plus k fresh ones (``cache_prompt``), so
    the server evaluates exactly those k in one batch (``prompt_n`` is checked); its
    prompt eval computes the last row's logits only, a lower bound of a verification
    that needs every row's. The server's context must hold cached + max(ks) + 1 tokens."""
    rng = random.Random(0)

    def rand(n: int) -> list[int]:
        return [rng.randrange(*_IDS) for _ in range(n)]

    prefix = rand(cached)
    srv.complete(prefix, 1, cache_prompt=True)  # the cached tokens, once
    cost: dict[str, float] = {}
    for k in ks:
        times = []
        for _ in range(repeats + 1):  # the first is a warm-up
            c = srv.complete(prefix + rand(k), 1, cache_prompt=True)
            if int(c.timings.get("prompt_n", -1)) != k:
                raise LlamaCppError(
                    f"llama-server evaluated {c.timings.get('prompt_n')} prompt tokens, "
                    f"expected {k} on top of its {cached} cached")
            times.append(c.timings["prompt_ms"])
        cost[str(k)] = statistics.median(times[1:])
    return cost
