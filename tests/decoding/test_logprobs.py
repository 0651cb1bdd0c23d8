"""Token log-probabilities (``decoding/logprobs.py``): the raw log-softmax, the top
alternatives in order with canonical ties, and the same value for one row however it is
handed in."""

from __future__ import annotations

import math

import numpy as np
import torch

from recallspec.decoding.logprobs import token_logprob


def test_log_softmax_of_the_raw_row() -> None:
    x = torch.randn(49_152, generator=torch.Generator().manual_seed(0)) * 4
    ref = torch.log_softmax(x.double(), -1)
    for t in (0, 7, int(x.argmax()), 49_151):
        lp = token_logprob(x, t, 0)
        assert lp.token == t and lp.top == ()
        assert math.isclose(lp.logprob, float(ref[t]), rel_tol=1e-12, abs_tol=1e-12)
    lp = token_logprob(x, 3, 5)
    want = torch.topk(ref, 5)
    assert [t for t, _ in lp.top] == want.indices.tolist()
    for (_, got), w in zip(lp.top, want.values.tolist(), strict=True):
        assert math.isclose(got, w, rel_tol=1e-12)
    # the same bits from a tensor, a numpy row or a row of a larger tensor
    rows = torch.stack([x.flip(0), x])
    assert token_logprob(rows[1], 3, 5) == lp == token_logprob(x.numpy(), 3, 5)


def test_ties_go_to_the_lower_id_and_k_is_bounded() -> None:
    x = np.array([1.0, 3.0, 2.0, 3.0, 3.0, 0.0], dtype=np.float32)
    lp = token_logprob(x, 5, 4)
    assert [t for t, _ in lp.top] == [1, 3, 4, 2]
    assert lp.top[0][1] == lp.top[1][1] == lp.top[2][1] > lp.top[3][1] > lp.logprob
    assert [t for t, _ in token_logprob(x, 0, 10).top] == [1, 3, 4, 2, 0, 5]
    assert abs(sum(math.exp(v) for _, v in token_logprob(x, 0, 6).top) - 1.0) < 1e-12
