"""Peer methods (``llamacpp-*``, ``hf-*``) in child processes.

A ``ChildMethod`` owns one child (``bench/peer_worker.py``) and sends it one prompt at a
time over a pipe. When the child dies (a native crash, killed for memory) or stops
answering, ``generate`` raises ``PeerCrashed`` with one line saying which method, how it
ended and the last lines it wrote to stderr; the runner then drops that method and the
others go on (answers already written stay on disk).
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

from recallspec.bench.methods import TurnOutput
from recallspec.errors import RecallspecError
from recallspec.spec.sampling import SamplingParams

WORKER = Path(__file__).with_name("peer_worker.py")
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


def peer_command(name: str, model: str | None, threads: int, dtype: str = "float32") -> list[str]:
    """The command line of the child that runs peer method ``name``."""
    return [sys.executable, str(WORKER), name, model or "-", str(threads), dtype]
