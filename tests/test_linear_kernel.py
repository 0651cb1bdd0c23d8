"""The small-M linear kernel: accuracy, batch invariance, fallbacks."""

from __future__ import annotations

import pytest
import torch

from recallspec.runtime import linear as lin


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [576, 100, 7])
def test_matches_torch_and_is_batch_invariant(dtype: torch.dtype, k: int) -> None:
    if not lin.kernel_supports(torch.zeros(1, k, dtype=dtype), torch.zeros(1, k, dtype=dtype)):
        pytest.skip("CPU lacks the kernel's instruction set")
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
    from recallspec import _kernels

    with pytest.raises(TypeError):
        _kernels.linear_f32(torch.zeros(2, 4, dtype=torch.float64), torch.zeros(3, 4),
                            torch.zeros(2, 3))
    with pytest.raises(ValueError):
        _kernels.linear_f32(torch.zeros(2, 4), torch.zeros(3, 5), torch.zeros(2, 3))
