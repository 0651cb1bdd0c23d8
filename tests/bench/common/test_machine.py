"""The machine's streaming bandwidth probe (``bench/common/machine.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from recallspec import _kernels
from recallspec.bench.common.machine import read_bandwidth, stream_bandwidth


def test_stream_bandwidth_is_sane() -> None:
    bw = stream_bandwidth(64, 2)
    assert all(0.1 < bw[k] < 1000 for k in ("read_gb_s", "sum_gb_s", "copy_gb_s"))
    assert 0.1 < read_bandwidth(64, 2) < 1000


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_prefetching_read_reads_every_whole_line_once(threads: int) -> None:
    # The XOR of the words it loads is the buffer's (every whole line read, by one part
    # only: a line read twice would cancel out); a tail shorter than a line is not read.
    rng = np.random.default_rng(threads)
    buf = rng.integers(0, 256, size=64 * 1001 + 37, dtype=np.uint8)
    want = np.bitwise_xor.reduce(buf[: 64 * 1001].view(np.uint64))
    assert _kernels.stream_read(buf, threads) == int(want)
    buf[64 * 1001 :] = 255  # the tail changes nothing
    assert _kernels.stream_read(buf, threads) == int(want)
