"""The machine's streaming bandwidth probe (``bench/common/machine.py``)."""

from __future__ import annotations

from recallspec.bench.common.machine import stream_bandwidth


def test_stream_bandwidth_is_sane() -> None:
    bw = stream_bandwidth(64, 2)
    assert 0.1 < bw["read_gb_s"] < 1000 and 0.1 < bw["copy_gb_s"] < 1000
