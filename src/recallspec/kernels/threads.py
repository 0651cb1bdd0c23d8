"""Thread use during decoding.

A decoding step is hundreds of tiny torch ops (norms, RoPE, attention over one row)
between large weight-streaming products. With torch's OpenMP team active, its idle
workers spin after every tiny op and take the cores the linear kernel needs (a token
then takes several times as long). So during decode steps torch runs on one thread and
the kernel in ``kernels/linear.py`` gets the cores; prefill keeps torch's threads for
its large matrix products. The setting is scoped: ``decode_threads`` restores torch's
thread count on exit.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

import torch

# Threads for the linear kernel inside a ``decode_threads`` block; None = torch's count.
_KERNEL_THREADS: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "recallspec_kernel_threads", default=None
)


def kernel_threads() -> int:
    n = _KERNEL_THREADS.get()
    return torch.get_num_threads() if n is None else n


@contextmanager
def decode_threads(threads: int) -> Iterator[None]:
    """Run torch single-threaded and the linear kernel on ``threads`` threads."""
    before = torch.get_num_threads()
    token = _KERNEL_THREADS.set(max(1, threads))
    if before != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if before != 1:
            torch.set_num_threads(before)
        _KERNEL_THREADS.reset(token)


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run torch on ``threads`` threads inside the block (e.g. a large product inside a
    ``decode_threads`` block), restoring the count on exit."""
    before = torch.get_num_threads()
    if before != threads:
        torch.set_num_threads(max(1, threads))
    try:
        yield
    finally:
        if before != threads:
            torch.set_num_threads(before)
