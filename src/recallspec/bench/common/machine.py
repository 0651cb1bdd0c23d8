"""The machine a benchmark runs on: what it is, whether it is busy, its streaming memory
bandwidth and a process's resident memory.

Every report records ``machine_info()`` at its start (and most at its end): a timing is
read against the CPU, the kernel path and the load it was taken under.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import torch

from recallspec import _kernels
from recallspec.cost.calibration import median_time
from recallspec.kernels import isa


def machine_info() -> dict[str, Any]:
    """CPU, CPU count, torch threads, kernel path, versions and the 1-minute load."""
    return {
        "cpu": isa.cpu_identity(), "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        # The kernel path and the instruction sets it uses (RECALLSPEC_KERNELS picks one).
        "kernels": isa.describe(),
        "torch": torch.__version__, "python": platform.python_version(),
        # Other processes make timings unreliable (OpenMP threads wait for descheduled peers).
        "loadavg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def busy_warning(machine: dict[str, Any]) -> str | None:
    """A warning when the machine (``machine_info``'s dict) was busy, else None."""
    load, cpus = machine.get("loadavg_1m"), machine.get("cpus") or 1
    if load is not None and load > 0.5 * cpus:
        return (f"warning: machine busy (1-min load {load:.1f} on {cpus} CPUs): "
                "timings are unreliable")
    return None


def _read_time(buf: torch.Tensor, repeats: int, threads: int) -> float:
    """Seconds of one prefetching read of ``buf`` (``_kernels.stream_read``), the median."""
    raw = buf.view(torch.uint8).numpy()
    return median_time(lambda: _kernels.stream_read(raw, threads), repeats)


def read_bandwidth(mib: int, repeats: int, threads: int | None = None) -> float:
    """``stream_bandwidth``'s ``read_gb_s`` alone (a paired round's, at its start)."""
    buf = torch.empty(mib * (1 << 20), dtype=torch.uint8)
    buf.fill_(1)  # (untouched pages would all map one zero page)
    return buf.numel() / _read_time(buf, repeats, threads or torch.get_num_threads()) / 1e9


def stream_bandwidth(mib: int, repeats: int, threads: int | None = None) -> dict[str, float]:
    """GB/s over ``mib`` MiB, each the median of ``repeats``: ``read_gb_s``, a full read the
    way the weight products read (``threads`` contiguous parts, default torch's thread
    count, with software prefetch: ``_kernels.stream_read``), the ceiling a decode's
    bytes are held against; ``sum_gb_s``, torch's sum over it (a plain read, which
    stays below the products on some CPUs: ~45 GB/s on the 2026-12-04 Zen 5 VM where the
    prefetching read and the products reached 57-73; runs before 2026-12-04 recorded
    this as ``read_gb_s``); ``copy_gb_s``, a copy (read + write). The buffer is written
    before timing: untouched pages all map one shared zero page and would fake a huge
    bandwidth."""
    n = mib * (1 << 20) // 4
    src = torch.empty(n, dtype=torch.float32)
    src.fill_(1.0)  # touch every page: fresh zero pages would all map one physical page
    dst = torch.empty_like(src)
    dst.fill_(0.0)
    parts = threads or torch.get_num_threads()
    t_read = _read_time(src, repeats, parts)
    t_sum = median_time(lambda: src.sum(), repeats)
    t_copy = median_time(lambda: dst.copy_(src), repeats)
    nbytes = n * 4
    return {"buffer_mib": float(mib), "read_gb_s": nbytes / t_read / 1e9,
            "sum_gb_s": nbytes / t_sum / 1e9, "copy_gb_s": 2 * nbytes / t_copy / 1e9,
            "read_threads": float(parts)}


def status_mb(field: str, pid: int | str = "self") -> float | None:
    """A memory field (VmRSS, VmHWM) of ``/proc/PID/status`` in MB; None where unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / 1e6
    except OSError:
        pass
    return None
