"""Dense layers for decoding: ``y = x W^T (+ b)``.

Few-row products (decoding, verification of small drafts) go to the C++ kernel in
``recallspec._kernels``, which streams W once for all rows at close to memory
bandwidth and is batch-invariant: row m of the result is bit-identical whatever the
number of rows, so verifying a draft gives exactly the logits of one-at-a-time
decoding through these layers. fp32 runs on every path of ``kernels.isa`` (AVX-512,
AVX2, scalar: the same bits on each); bf16 needs AVX512_BF16. Larger products (prefill)
and other dtypes use ``torch.nn.functional.linear``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn.functional as F

from recallspec import _kernels
from recallspec.kernels import isa as _isa
from recallspec.kernels.threads import kernel_threads, torch_threads

# Up to this many rows the kernel beats MKL (fp32, SmolLM2's weights, one row and 16
# rows alike).
MAX_KERNEL_ROWS = 32

# The fp32 kernel runs on the chosen path (RECALLSPEC_KERNELS); bf16 only on
# AVX512_BF16, and not when the portable paths are forced.
_F32_ISA = _isa.code()
_HAS_BF16 = _isa.ISA in ("avx512", "avx512-amx") and bool(_kernels.has_avx512_bf16())


def forward_threads(rows: int, threads: int | None = None) -> AbstractContextManager[None]:
    """Thread set-up for one forward of ``rows`` rows inside a ``decode_threads`` block:
    as it is when the products run in the kernel; torch's team back on ``threads``
    (default: the kernel's) when they run in MKL (prefill chunks, large batched
    verifications), which would otherwise run single-threaded."""
    if rows <= MAX_KERNEL_ROWS:
        return nullcontext()
    return torch_threads(kernel_threads() if threads is None else threads)


def kernel_supports(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``linear(x, w)`` runs in the C++ kernel."""
    return (
        x.ndim == 2
        and w.ndim == 2
        and x.shape[0] <= MAX_KERNEL_ROWS
        and x.dtype == w.dtype
        and x.device.type == "cpu"
        and w.device.type == "cpu"
        and (
            x.dtype == torch.float32
            or (x.dtype == torch.bfloat16 and _HAS_BF16)
        )
    )


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: [M, K], w: [N, K] (contiguous, as stored), bias: [N] -> [M, N]."""
    if not kernel_supports(x, w):
        return F.linear(x, w, bias)
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"linear: x {tuple(x.shape)} and w {tuple(w.shape)} disagree on K")
    if not w.is_contiguous():
        raise ValueError("linear: weights must be contiguous (store them so at load time)")
    x = x.contiguous()
    out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype)
    threads = kernel_threads()
    if x.dtype == torch.float32:
        _kernels.linear_f32(x, w, out, threads, _F32_ISA)
    else:
        _kernels.linear_bf16(
            x.view(torch.int16), w.view(torch.int16), out.view(torch.int16), threads
        )
    if bias is not None:
        out += bias
    return out
