"""The GGML tensor types recallspec reads, by their GGUF ids, without the ``gguf`` package.

Importing ``gguf`` (for its ``GGMLQuantizationType``) builds every enum of its constants
and imports its reader, writer, vocabulary and YAML modules: a cost to every process
that loads a model, and a visible share of a later run's time to the first token
(issue 37 item 4). The loads that convert or repack a GGUF import it all the same
(float tensors go through ``gguf.quants``); a load from the repack cache now does not.

``gguf`` stays the reference: tests/kernels/test_ggml_types.py checks every id and block
size here against it, and a type outside this table is named through it
(``type_name``), so a GGUF of, say, Q3_K tensors still gets its type in the error.
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import gguf


class GGMLType(IntEnum):
    """The ids of the GGML types a load reads (the float ones and those of
    ``kernels.qformats``), as a GGUF's tensor directory stores them."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    BF16 = 30
    MXFP4 = 39


# (elements per block, bytes per block), as gguf.GGML_QUANT_SIZES has them.
BLOCK_SIZES: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4), GGMLType.F16: (1, 2), GGMLType.BF16: (1, 2),
    GGMLType.Q4_0: (32, 18), GGMLType.Q4_1: (32, 20), GGMLType.Q5_0: (32, 22),
    GGMLType.Q5_1: (32, 24), GGMLType.Q8_0: (32, 34), GGMLType.Q4_K: (256, 144),
    GGMLType.Q5_K: (256, 176), GGMLType.Q6_K: (256, 210), GGMLType.MXFP4: (32, 17),
}

_KNOWN = frozenset(int(t) for t in GGMLType)


def known(value: int) -> bool:
    """Whether ``value`` is the id of a type in ``GGMLType``."""
    return int(value) in _KNOWN


def type_name(value: int) -> str:
    """The GGML name of type id ``value`` (gguf's, for types outside ``GGMLType``), or
    ``"type <id>"`` where gguf does not know it either."""
    if known(value):
        return GGMLType(int(value)).name
    from gguf import GGMLQuantizationType  # only to name a type we do not read

    try:
        return GGMLQuantizationType(int(value)).name
    except ValueError:
        return f"type {int(value)}"


def block_size(value: int) -> tuple[int, int] | None:
    """(elements, bytes) of one block of type id ``value``: ours, else gguf's; None where
    neither knows the type."""
    if known(value):
        return BLOCK_SIZES[GGMLType(int(value))]
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        return GGML_QUANT_SIZES.get(GGMLQuantizationType(int(value)))
    except ValueError:
        return None


def to_gguf(t: GGMLType) -> gguf.GGMLQuantizationType:
    """gguf's member for ``t`` (for ``gguf.quants``: the float tensors a first load reads,
    the reference quantization); imports gguf."""
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType(int(t))
