"""The benchmarks' server children: a free loopback port, and stopping a child with its
whole process group.

Every server a benchmark starts (llama-server, ``recallspec serve``, vLLM) runs in a
session of its own (``start_new_session=True``), so its process group holds its workers
too and stopping it leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM to the child's process group, up to ``grace_s`` seconds for it to exit,
    then SIGKILL to whatever of the group is left (the leader may exit before its
    workers do)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
