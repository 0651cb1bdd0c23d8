"""Memory of the KV cache taken on demand and given back: pages, not slots.

The cache's tensors live in one anonymous private mapping each (``lazy_zeros``). The
kernel commits a page of it only when it is first written (4 KiB: 16 rows of one head at
float32 and head_dim 64), and a page never written reads as zeros, as ``torch.zeros``
would. So a slot of ``max_len`` positions occupies memory for the rows its sequences
have written, not for ``max_len``; ``give_back`` returns the pages of rows a slot no
longer needs (``madvise(MADV_DONTNEED)``: they read as zeros again, and are committed
again only when written). Reserving every slot's ``max_len`` up front (8 slots x 4,096
float32 positions of a 1.7B model: 12 GiB) is what this replaces.

Invariant: what a reader sees is unchanged by any of this: rows it may read (below a
slot's length) are never given back, and rows given back read as zeros exactly like
rows never written (the old ``torch.zeros`` cache).
"""

from __future__ import annotations

import mmap
import os
import sys

import torch

from recallspec.errors import ResourceError

PAGE = mmap.PAGESIZE
# MAP_NORESERVE: the address space is not charged against the overcommit heuristic up
# front (a reservation larger than the machine's memory would otherwise be refused);
# memory is what ``KVCache.budget_rows`` and the scheduler keep within bounds.
# Python's mmap module names it only from 3.12; the value is Linux's on every arch.
_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform == "linux" else 0)


def available_memory() -> int | None:
    """Bytes the system can give a new allocation now: Linux's MemAvailable (free memory
    plus the page cache and other memory it can reclaim). Free pages alone
    (``SC_AVPHYS_PAGES``) are the fallback elsewhere: after reading or writing large files
    they are a small fraction of what is available (a small cache was once refused with
    plenty available but little free). None where neither can be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


class LazyTensor:
    """A zero-filled tensor over an anonymous mapping whose pages are committed as they
    are written. ``tensor`` shares the mapping's memory (it is page-aligned, contiguous);
    the mapping lives as long as this object."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        elem = torch.empty(0, dtype=dtype).element_size()
        count = 1
        for s in shape:
            count *= s
        self.nbytes = count * elem
        # mmap of length 0 is an error; a 1-byte map backs an empty tensor.
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _NORESERVE
        try:
            self._map = mmap.mmap(-1, max(self.nbytes, 1), flags=flags)
        except (OSError, OverflowError) as e:  # beyond the address space (or its limit)
            raise ResourceError(f"cannot reserve {self.nbytes / 2**30:.0f} GiB of address "
                                f"space for the KV cache ({e})") from None
        flat = (torch.frombuffer(self._map, dtype=dtype, count=count) if count
                else torch.empty(0, dtype=dtype))
        self.tensor = flat.view(shape)

    def give_back(self, start: int, end: int) -> int:
        """Return to the system the whole pages inside bytes [start, end) of the tensor;
        they read as zeros afterwards. Returns the bytes given back."""
        lo = -(-start // PAGE) * PAGE
        hi = (min(end, self.nbytes) // PAGE) * PAGE
        if hi <= lo:
            return 0
        self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        return hi - lo
