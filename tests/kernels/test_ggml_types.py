"""kernels/ggml_types.py against the gguf package it stands in for."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from helpers.imports import loaded_after

from recallspec.kernels import ggml_types as gt
from recallspec.kernels import qformats as qf


def test_ids_and_sizes_are_gguf_s() -> None:
    for t in gt.GGMLType:
        ref = gguf.GGMLQuantizationType[t.name]
        assert int(t) == int(ref)
        assert gt.BLOCK_SIZES[t] == gguf.GGML_QUANT_SIZES[ref]
        assert gt.block_size(int(t)) == gguf.GGML_QUANT_SIZES[ref]
        assert gt.type_name(int(t)) == ref.name
        assert gt.to_gguf(t) is ref
    # every quantized format the kernels read is in the table
    assert set(qf.BLOCKS) <= set(gt.GGMLType)
    # gguf's members and ours are interchangeable as keys (IntEnum: an int's hash and ==)
    assert qf.BLOCKS[gguf.GGMLQuantizationType.Q4_K] == (256, 144)


@pytest.mark.parametrize("name", ["Q3_K", "Q2_K", "IQ4_XS", "I8"])
def test_types_we_do_not_read_are_named_by_gguf(name: str) -> None:
    ref = gguf.GGMLQuantizationType[name]
    assert not gt.known(int(ref))
    assert gt.type_name(int(ref)) == name
    assert gt.block_size(int(ref)) == gguf.GGML_QUANT_SIZES[ref]


def test_an_id_nobody_knows() -> None:
    assert gt.type_name(999) == "type 999"
    assert gt.block_size(999) is None


def test_a_cached_load_does_not_import_gguf() -> None:
    """The modules a load from the repack cache imports leave gguf out (its import is
    ~0.17 s of the start: the reason for this module)."""
    code = ("import recallspec.models.gguf.quantized, recallspec.models.gguf.header\n"
            "import recallspec.kernels.qlinear, recallspec.engine")
    assert loaded_after(code, ("gguf",)) == []


def test_mxfp4_tables_are_ggmls() -> None:
    """MXFP4's code table and E8M0 scale as gguf-py (ggml's reference) has them: the
    doubled e2m1 values, and 2^(e - 128) for every byte, bit for bit (e = 0, 1: the fp32
    subnormals 2^-128, 2^-127; e = 255: 2^127, not NaN)."""
    ref = gguf.quants.MXFP4
    assert tuple(ref.kvalues) == qf.MXFP4_KVALUES
    e = np.arange(256, dtype=np.uint8)
    got = qf.e8m0_half(e)
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), ref.e8m0_to_fp32_half(e).view(np.uint32))
    assert np.array_equal(got, np.ldexp(1.0, e.astype(np.int64) - 128).astype(np.float32))
    assert got[0] == 2.0**-128 and got[1] == 2.0**-127 and got[255] == 2.0**127
    assert qf.BLOCKS[gt.GGMLType.MXFP4] == (32, 17) and gt.GGMLType.MXFP4 in qf.LAYOUTS
    assert gt.GGMLType.MXFP4 in qf.BELOW_64
