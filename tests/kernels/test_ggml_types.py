"""kernels/ggml_types.py against the gguf package it stands in for."""

from __future__ import annotations

import gguf
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
