"""Peer methods (``llamacpp-*``, ``hf-*``) in child processes.

A ``ServerMethod`` (``llamacpp-*``) owns one native ``llama-server`` child
(``bench/common/llamacpp.py``) and posts it one prompt's token ids at a time. A ``ChildMethod``
(``hf-*``) owns one child (``bench/peers/worker.py``) and sends it one prompt at a time
over a pipe. When the child dies (a native crash, killed for memory) or stops
answering, ``generate`` raises ``PeerCrashed`` with one line saying which method, how it
ended and the last lines it wrote to stderr or its log; the runner then drops that
method and the others go on (answers already written stay on disk).
"""

from __future__ import annotations

import collections
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from recallspec.bench.common.llamacpp import (
    LlamaCppCrashed,
    LlamaCppError,
    LlamaServer,
    ServerConfig,
)
from recallspec.bench.common.method import TurnOutput
from recallspec.decoding.sampling import SamplingParams
from recallspec.errors import RecallspecError

WORKER = Path(__file__).with_name("worker.py")
# Loading llama.cpp or building a transformers model takes seconds; a generous bound so
# that a child stuck at start is reported instead of hanging the benchmark.
START_TIMEOUT_S = 600.0


class PeerError(RecallspecError):
    """The peer failed on one prompt (its child reported an exception and goes on)."""


class PeerCrashed(PeerError):
    """The peer's child process died or broke the protocol: the method is finished."""


class ChildMethod:
    """A benchmark method answered by a child process."""

    def __init__(self, name: str, command: list[str], tokenizer: Any, baseline: str) -> None:
        self.name = name
        self.baseline = baseline
        self.tokenizer = tokenizer
        self.info: dict[str, Any] = {}
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=5)
        # The worker is started as a script, not ``-m recallspec...``: the llama.cpp
        # child must not import our package (and so torch) at all.
        self._proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1,
        )
        assert self._proc.stderr is not None
        threading.Thread(target=self._drain, args=(self._proc.stderr,), daemon=True).start()
        ready = self._read(START_TIMEOUT_S)
        if not ready.get("ready"):
            self.close()
            raise PeerCrashed(f"{name}: child did not start ({ready})")
        self.info = dict(ready.get("info", {}))

    def _drain(self, stream: IO[str]) -> None:
        for line in stream:
            if line.strip():
                self._stderr_tail.append(line.rstrip())

    def _died(self) -> PeerCrashed:
        try:
            rc = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            rc = None
        if rc is None:
            how = "stopped answering"
        elif rc < 0:
            how = f"killed by {signal.Signals(-rc).name}"
        else:
            how = f"exited with status {rc}"
        time.sleep(0.1)  # let the stderr reader catch the last lines
        tail = " | ".join(self._stderr_tail)
        return PeerCrashed(f"{self.name}: peer process {how}" + (f" ({tail})" if tail else ""))

    def _read(self, timeout: float) -> dict[str, Any]:
        assert self._proc.stdout is not None
        box: list[str] = []
        t = threading.Thread(target=lambda: box.append(self._proc.stdout.readline()),  # type: ignore[union-attr]
                             daemon=True)
        t.start()
        t.join(timeout)
        if not box or not box[0]:
            if t.is_alive():
                self._proc.kill()
            raise self._died()
        try:
            return dict(json.loads(box[0]))
        except json.JSONDecodeError:
            self._proc.kill()
            raise PeerCrashed(f"{self.name}: peer wrote a malformed line {box[0][:80]!r}") from None

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> TurnOutput:
        eos = sorted(self.tokenizer.eos_token_ids)
        req = {
            "prompt_ids": list(prompt_ids), "max_new_tokens": params.max_new_tokens,
            "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
            "seed": params.seed, "ignore_eos": params.ignore_eos, "eos": eos,
        }
        # A turn of our benchmarks takes seconds; an hour means the child hangs.
        out = self.request(req, 3600.0)
        ids = [int(t) for t in out["token_ids"]]
        return TurnOutput(
            ids, self.tokenizer.decode(ids), [int(a) for a in out["accept_lengths"]],
            float(out["wall_time"]), len(prompt_ids), str(out["finish_reason"]),
        )

    def request(self, req: dict[str, Any], timeout: float = 3600.0) -> dict[str, Any]:
        """One raw protocol request (e.g. ``{"op": "eval_cost", ...}``) and its answer."""
        if self._proc.poll() is not None:
            raise self._died()
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(req) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._died() from None
        out = self._read(timeout)
        if "error" in out:
            raise PeerError(f"{self.name}: {out['error']}")
        return out

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                if self._proc.stdin is not None:
                    self._proc.stdin.close()
                self._proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()


class ServerMethod:
    """A benchmark method answered by one native ``llama-server`` (``llamacpp-greedy``,
    ``llamacpp-<spec type>``): the same prompt token ids as ours, prompt cache off, one
    slot. A turn's ``wall_time`` is the server's own (prompt_ms + predicted_ms); the
    client-side time and the server's timings (draft counts included) go in ``peer``.
    Generation stops at our EOS ids: the server stops at its vocabulary's
    end-of-generation tokens (the token it stopped at is left out, as our EOS is) and an
    answer is cut at the first of our EOS ids (an id the server does not stop at costs
    it the tokens it generated past it; SmolLM2's EOS, <|im_end|>, is one of its own)."""

    def __init__(self, name: str, config: ServerConfig, tokenizer: Any, baseline: str) -> None:
        self.name = name
        self.baseline = baseline
        self.tokenizer = tokenizer
        self._server = LlamaServer(config)
        try:
            self._server.start()
        except LlamaCppCrashed as e:
            raise PeerCrashed(f"{name}: {e}") from None
        self.info = self._server.info

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> TurnOutput:
        try:
            c = self._server.complete(
                prompt_ids, params.max_new_tokens, temperature=params.temperature,
                top_k=params.top_k, top_p=params.top_p, seed=params.seed,
                ignore_eos=params.ignore_eos)
        except LlamaCppCrashed as e:
            raise PeerCrashed(f"{self.name}: {e}") from None
        except LlamaCppError as e:
            raise PeerError(f"{self.name}: {e}") from None
        # The server's ids end with the end-of-generation token it stopped at: excluded,
        # as our engine excludes EOS, whether or not it is one of our EOS ids.
        ids, finish = c.token_ids, "length"
        if c.stop_type == "eos":
            ids, finish = ids[:-1], "eos"
        if not params.ignore_eos:
            eos = set(self.tokenizer.eos_token_ids)
            cut = next((i for i, t in enumerate(ids) if t in eos), None)
            if cut is not None:
                ids, finish = ids[:cut], "eos"
        return TurnOutput(ids, self.tokenizer.decode(ids), [], c.server_s, len(prompt_ids),
                          finish, peer=c.record())

    def close(self) -> None:
        self._server.stop()


def peer_command(name: str, model: str | None, threads: int, dtype: str = "float32") -> list[str]:
    """The command line of the child that runs peer method ``name``."""
    return [sys.executable, str(WORKER), name, model or "-", str(threads), dtype]
