"""GGUF block bytes for the quantized-weight tests (test_qlinear, test_qrepack)."""

from __future__ import annotations

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

from recallspec.kernels import qformats as qf

# Every GGUF type the quantized kernels take.
TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]

# (type, storage bits): each type in its own storage, and the types whose values are
# below 64 also in 6 bits (loads choose it per kernel path: qlinear.default_bits), so
# every machine tests both.
STORAGES = [(t, qf.LAYOUTS[t].bits) for t in TYPES] + [(t, 6) for t in TYPES if t in qf.BELOW_64]


# Test ids of STORAGES: the type's name, with "-6bit" where that is not its own storage.
STORAGE_IDS = [t.name if b == qf.LAYOUTS[t].bits else f"{t.name}-{b}bit" for t, b in STORAGES]


# Where each type's fp16 fields sit in its block (the rest: quantized values and scales).
FP16_BYTES = {T.Q4_0: slice(0, 2), T.Q4_1: slice(0, 4), T.Q5_0: slice(0, 2),
              T.Q5_1: slice(0, 4), T.Q8_0: slice(0, 2), T.Q4_K: slice(0, 4),
              T.Q5_K: slice(0, 4), T.Q6_K: slice(208, 210)}


def random_raw(qtype: T, n: int, k: int, seed: int = 0) -> np.ndarray:
    """GGUF block bytes: ggml's own quantizer where gguf-py has it, else random bytes
    with finite fp16 fields (every other byte pattern of a K-quant block is valid)."""
    rng = np.random.default_rng(seed)
    if qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
        return gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)
    bs, ts = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n, k // bs, ts), dtype=np.uint8)
    halves = (rng.standard_normal((n, k // bs, 2)) * 0.01).astype(np.float16)
    fields = halves.view(np.uint8).reshape(n, k // bs, 4)
    at = FP16_BYTES[qtype]
    raw[..., at] = fields[..., : at.stop - at.start]
    return raw.reshape(n, -1)
