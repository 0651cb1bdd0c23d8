"""The small-M linear kernel: accuracy, batch invariance, ISA invariance, fallbacks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recallspec import _kernels
from recallspec.kernels import isa
from recallspec.kernels import linear as lin

# fp32 paths this CPU runs (the fp32 kernel has no VNNI variant).
F32_PATHS = isa.available_isas()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [576, 100, 7])
def test_matches_torch_and_is_batch_invariant(dtype: torch.dtype, k: int) -> None:
    if not lin.kernel_supports(torch.zeros(1, k, dtype=dtype), torch.zeros(1, k, dtype=dtype)):
        pytest.skip("bf16 kernel needs AVX512_BF16 and the avx512 path (RECALLSPEC_KERNELS)")
    g = torch.Generator().manual_seed(0)
    w = torch.randn(203, k, generator=g).to(dtype)
    x = torch.randn(lin.MAX_KERNEL_ROWS, k, generator=g).to(dtype)
    b = torch.randn(203, generator=g).to(dtype)
    full = lin.linear(x, w, b)
    ref = torch.nn.functional.linear(x.double(), w.double(), b.double())
    tol = 1e-4 if dtype == torch.float32 else 0.5
    assert (full.double() - ref).abs().max().item() < tol * max(1.0, k / 100)
    for m in (1, 2, 3, 5, 17):
        # bit-identical rows whatever the number of rows
        assert torch.equal(lin.linear(x[:m], w, b), full[:m])


def test_large_m_and_other_dtypes_fall_back() -> None:
    w = torch.randn(8, 16)
    x = torch.randn(lin.MAX_KERNEL_ROWS + 1, 16)
    assert not lin.kernel_supports(x, w)
    torch.testing.assert_close(lin.linear(x, w), torch.nn.functional.linear(x, w))
    xd = torch.randn(2, 16, dtype=torch.float64)
    assert not lin.kernel_supports(xd, w.double())


def test_kernel_rejects_wrong_arrays() -> None:
    with pytest.raises(TypeError):
        _kernels.linear_f32(torch.zeros(2, 4, dtype=torch.float64), torch.zeros(3, 4),
                            torch.zeros(2, 3), 1, 0)
    with pytest.raises(ValueError):
        _kernels.linear_f32(torch.zeros(2, 4), torch.zeros(3, 5), torch.zeros(2, 3), 1, 0)
    with pytest.raises(ValueError, match="isa"):
        _kernels.linear_f32(torch.zeros(2, 4), torch.zeros(3, 4), torch.zeros(2, 3), 1, 9)


def f32(x: torch.Tensor, w: torch.Tensor, path: str, threads: int = 1) -> np.ndarray:
    out = torch.empty(x.shape[0], w.shape[0])
    _kernels.linear_f32(x, w, out, threads, isa.code(path))
    return out.numpy().view(np.uint32)  # bit patterns: tells -0.0 from 0.0


@pytest.mark.parametrize("k", [577, 100, 16, 7])  # tails of 1, 4, 0 and 7 lanes
@pytest.mark.parametrize("n", [203, 17, 1])
def test_f32_paths_are_bit_identical(k: int, n: int) -> None:
    """AVX-512, AVX2 and scalar emulate the same 16-lane accumulator and reduction tree,
    so every row is the same bits on every path, for any M and thread count."""
    g = torch.Generator().manual_seed(k * 1000 + n)
    w = torch.randn(n, k, generator=g)
    x = torch.randn(32, k, generator=g) * torch.logspace(-2, 2, 32).unsqueeze(1)
    x[5] = 0.0
    x[6] = -0.0
    ref = f32(x, w, F32_PATHS[0], threads=2)
    for path in F32_PATHS:
        assert np.array_equal(f32(x, w, path, threads=2), ref), path
        for m in (1, 2, 3, 7, 16, 32):
            got = np.concatenate([f32(x[i:i + m], w, path) for i in range(0, 32, m)])
            assert np.array_equal(got, ref), (path, m)
