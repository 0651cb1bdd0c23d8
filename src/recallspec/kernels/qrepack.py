"""GGUF block bytes straight into the kernel layout, in C++ (``_kernels.qrepack``).

``kernels.qformats`` defines the layout in numpy (``pack(decode(raw))``) and stays the
reference; this module is the fast path that loads use: the arrays of a segment are
allocated once, zeroed (the zero padding rows of ``pack``), and the GGUF rows are
written into them chunk by chunk, at any row offset, in one pass over the bytes with no
canonical temporaries. Every byte equals the reference's (tests/kernels/test_qrepack.py).
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from recallspec import _kernels
from recallspec.kernels import qformats as qf
from recallspec.kernels.ggml_types import GGMLType as T
from recallspec.kernels.threads import kernel_threads


@dataclass(frozen=True)
class Packed:
    """The flat arrays of one segment of n rows in the kernel layout (qkernels.h)."""

    qs: torch.Tensor  # uint8
    scale: torch.Tensor  # float16, float32 (MXFP4's values), uint8 (K-quant tiles, E8M0)
    mins: torch.Tensor | None
    zero: torch.Tensor | None  # int32


_LAZY = 2 << 20  # from here up, an anonymous mapping of its own


def zeros(count: int, dtype: torch.dtype) -> torch.Tensor:
    """A flat tensor of zeros. From 2 MiB up, in an anonymous mapping of its own: the
    kernel zeroes its pages as they are first written (no memset pass). Not advised to
    use transparent huge pages: on VMs that return free memory to their host (virtio
    free page reporting, our Firecracker measuring VMs) a huge page comes from the
    reported blocks and faults back in from the host, 4 KiB pages mostly from memory
    freed recently: with the advice a first repack spent several times the system time
    it spends without, at the 1.7B and 8B shapes alike. The price: this process decodes
    from 4 KiB pages (somewhat slower at 8B; within noise at 1.7B); later runs map the
    repack cache file, whose page cache this kernel maps in 2 MiB folios anyway.
    The mapping lives as long as the tensor (``torch.frombuffer`` holds it)."""
    nbytes = count * torch.empty(0, dtype=dtype).element_size()
    if nbytes < _LAZY:
        return torch.zeros(count, dtype=dtype)
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(m, dtype=dtype, count=count)


def allocate(qtype: T, n: int, k: int, bits: int) -> Packed:
    """Zeroed arrays for n rows of ``qtype`` in ``bits`` storage (zero is what ``pack``
    pads rows with)."""
    lay = qf.LAYOUTS[qtype]
    g, nsb = (n + 15) // 16, k // lay.sb
    sfmt, _ = qf.storage_format(qtype, bits)
    if sfmt == qf.SFMT_KS:
        sdt, count = torch.uint8, g * (k // 256) * qf.ks_tile_bytes(lay.sb)
    else:  # one scale per (row, sub-block) (Segment.sfmt: the dtype, or E8M0 with lut)
        sdt = {qf.SFMT_F32: torch.float32, qf.SFMT_F16: torch.float16,
               qf.SFMT_E8: torch.uint8}[sfmt]
        count = g * nsb * 16
    return Packed(
        qs=zeros(g * nsb * qf.storage_bytes(bits, lay.sb), torch.uint8),
        scale=zeros(count, sdt),
        mins=zeros(count, sdt) if lay.mins else None,
        zero=zeros(g * 16, torch.int32) if lay.zero else None,
    )


_NONE_U8 = torch.empty(0, dtype=torch.uint8)
_NONE_I32 = torch.empty(0, dtype=torch.int32)


def write_rows(out: Packed, qtype: T, n: int, k: int, row_off: int, raw: np.ndarray,
               bits: int, threads: int | None = None) -> None:
    """Rows [row_off, row_off + len(raw)) of an [n, k] weight in ``bits`` storage,
    from their GGUF block bytes (uint8 [rows, bytes per row], or any array of those
    bytes in row order)."""
    rows = np.ascontiguousarray(raw).view(np.uint8).reshape(len(raw), -1)
    mins = _NONE_U8 if out.mins is None else out.mins.view(torch.uint8)
    zero = _NONE_I32 if out.zero is None else out.zero
    _kernels.qrepack(rows, int(qtype), n, k, row_off, out.qs, out.scale.view(torch.uint8),
                     mins, zero, bits, kernel_threads() if threads is None else threads)


def repack(qtype: T, n: int, k: int, chunks: Iterable[tuple[int, np.ndarray]],
           bits: int | None = None, into: tuple[Packed, int, int] | None = None) -> Packed:
    """An [n, k] weight from (first row, block bytes of consecutive rows) chunks that
    cover its rows once each, in ``bits`` storage (default: the type's own).
    ``into``: (the arrays of an [N, k] weight of this type and storage, N, this weight's
    first row there, a multiple of 16) writes the rows into those arrays and returns
    views of its groups of rows: the parts of a fused matrix written where the fused
    arrays have them, which ``Segment.stack`` then joins without a copy."""
    if qtype not in qf.LAYOUTS:
        raise ValueError(f"no kernel layout for GGUF type {qtype.name}")
    bits = qf.LAYOUTS[qtype].bits if bits is None else bits
    if bits not in qf.storages(qtype):
        raise ValueError(f"{qtype.name} cannot be stored in {bits} bits")
    out, total, first = (allocate(qtype, n, k, bits), n, 0) if into is None else into
    if first % 16 or not 0 <= first <= total - n:
        raise ValueError(f"repack: rows [{first}, {first + n}) do not start a group of 16 "
                         f"rows inside the {total} of the arrays given")
    covered = 0
    for row_off, raw in chunks:
        write_rows(out, qtype, total, k, first + row_off, raw, bits)
        covered += len(raw)
    if covered != n:
        raise ValueError(f"repack: chunks hold {covered} rows, the weight {n}")
    return out if into is None else groups(out, total, first, n)


def groups(p: Packed, total: int, first: int, n: int) -> Packed:
    """Views of the arrays of rows [first, first + n) of a weight of ``total`` rows
    (first a multiple of 16): each array holds its groups of 16 rows one after another,
    the same number of elements per group."""
    g_total, g0, g1 = (total + 15) // 16, first // 16, (first + n + 15) // 16

    def cut(t: torch.Tensor) -> torch.Tensor:
        per = t.numel() // g_total
        return t[g0 * per:g1 * per]

    return Packed(cut(p.qs), cut(p.scale), None if p.mins is None else cut(p.mins),
                  None if p.zero is None else cut(p.zero))
