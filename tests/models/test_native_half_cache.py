"""The 16-bit KV cache (``kv_dtype="float16"``): the native forward's binary16 conversions
bit for bit against torch's on every kernel path; the tight parity oracle (dense fp32
weights) with both sides on a float16 cache; a decode row (keys converted as attention
loads them) against the same rows in a verification chain or a prefill (tiles of keys
and values widened once for all the rows of a block), across batches, threads and
paths; and greedy decoding with drafts token-identical to plain decoding on such a cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.native_forward import (
    _check,
    _forward_with,
    _fresh,
    _other_settings,
    _steps_smol,
    prompt_ids,
    smol,
    smol_dense,
)

from recallspec import _kernels
from recallspec.decoding.sampling import SamplingParams
from recallspec.engine import Engine
from recallspec.kernels import isa
from recallspec.models import CausalLM
from recallspec.runtime.batch import SequenceInput, build_batch
from recallspec.runtime.kv_cache import KVCache

__all__ = ["prompt_ids", "smol", "smol_dense"]  # (fixtures: native_forward_helpers)
F16 = torch.float16


def _special_values() -> torch.Tensor:
    """Zeros, halves' subnormals and their rounding ties, the largest half and the edges of
    overflow, infinities, exact ties between normal halves, and random values over the
    whole exponent range."""
    g = torch.Generator().manual_seed(0)
    tiny = 2.0**-24
    vals = [0.0, -0.0, tiny, -tiny, tiny / 2, 3 * tiny / 2, tiny * 0.49, 2.0**-14,
            2.0**-14 - tiny / 2, 65504.0, 65519.0, 65520.0, -65520.0, 1e10, float("inf"),
            float("-inf"), 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 1e-30, -1e-40]
    rand = torch.randn(1004, generator=g) * torch.exp2(torch.randint(-30, 20, (1004,), generator=g))
    x = torch.cat([torch.tensor(vals), rand])
    return x[: len(x) // 16 * 16].contiguous()


@pytest.mark.parametrize("variant", isa.variants())
def test_conversions_are_torchs_on_every_path(variant: str) -> None:
    x = _special_values()
    bits = np.empty(len(x), dtype=np.uint16)
    back = np.empty(len(x), dtype=np.float32)
    _kernels.half_convert(x.numpy(), bits, back, isa.code(variant))
    want = x.half()
    assert np.array_equal(bits, want.view(torch.int16).numpy().view(np.uint16))
    assert torch.equal(torch.from_numpy(back), want.float())
    nan = torch.tensor([float("nan")] * 16)
    _kernels.half_convert(nan.numpy(), bits[:16], back[:16], isa.code(variant))
    assert torch.isnan(torch.from_numpy(back[:16])).all()  # a NaN stays a NaN


# The dense oracle's bound on a 16-bit cache. Both sides round keys and values to binary16
# and attend on what they stored, but a key whose float32 values differ in the last bit
# (the sides' orders of operations differ: REL_DENSE) can round to neighbouring binary16
# values, 2^-11 apart relatively; such flips show up as deviations of ~2^-12 of the
# logits' scale here (vs ~1e-6 on a float32 cache). 2^-10 leaves a 3-4x margin and is
# still ~100x tighter than the quantized oracle.
REL_HALF = 2.0**-10


def test_dense_parity_on_a_half_cache(smol_dense: CausalLM, prompt_ids: list[int]) -> None:
    """The fp32-weights oracle with both sides on a float16 cache (argmax / top-5 equal
    outside near-ties, logits within REL_HALF)."""
    steps = list(_steps_smol(prompt_ids))
    ca = smol_dense.new_cache(3, 256, dtype=F16)
    cb = smol_dense.new_cache(3, 256, dtype=F16)
    ours = [smol_dense.forward(build_batch(s), ca) for s in steps]
    ref = [smol_dense.forward_reference(build_batch(s), cb) for s in steps]
    for i, (o, r) in enumerate(zip(ours, ref, strict=True)):
        _check(o, r, REL_HALF, f"step {i}")
    assert ca.k.dtype == cb.k.dtype == F16


def test_half_cache_rows_same_bits_every_way(smol: CausalLM, prompt_ids: list[int]) -> None:
    """A decode row reads binary16 directly, rows of a chain, a tree or a prefill read
    tiles of them widened once per block: one token at a time equals the chain (the lossless
    property), a tree's rows equal the same rows beside other sequences, and every step
    equals itself on two threads and on the other vector paths."""
    ids, n = prompt_ids, len(prompt_ids)
    prefix = [SequenceInput(0, 0, ids), SequenceInput(1, 0, ids[:11])]

    def fresh() -> KVCache:
        return _fresh(smol, prefix, dtype=F16)

    ca, cb = fresh(), fresh()
    steps = [smol(build_batch([SequenceInput(0, n + i, [ids[i]])]), ca) for i in range(4)]
    chain = smol(build_batch([SequenceInput(0, n, ids[:4])]), cb)
    assert torch.equal(torch.cat(steps), chain)
    assert torch.equal(ca.k[:, 0, :, : n + 4], cb.k[:, 0, :, : n + 4])
    alone = smol(build_batch([SequenceInput(0, n, ids[:3], [-1, 0, 0])]), fresh())
    mixed = smol(build_batch([SequenceInput(1, 11, ids[11:16]),
                              SequenceInput(0, n, ids[:3] + ids[20:24], [-1, 0, 0, 1, 2, 3, 0]),
                              SequenceInput(2, 0, ids[:30])]), fresh())
    assert torch.equal(mixed[5:8], alone)
    plan = list(_steps_smol(ids))
    base = _forward_with(smol, plan, cache=smol.new_cache(3, 256, dtype=F16), threads=1)
    for kw in _other_settings():
        other = _forward_with(smol, plan, cache=smol.new_cache(3, 256, dtype=F16), **kw)
        assert all(torch.equal(a, b) for a, b in zip(base, other, strict=True)), kw


def test_long_context_decode_equals_chain_on_a_half_cache(
        smol: CausalLM, prompt_ids: list[int]) -> None:
    """Past 512 cached keys (the streaming split): decode rows one at a time, on one and
    two threads, equal a 4-row chain over the same keys."""
    ids = (prompt_ids * (700 // len(prompt_ids) + 1))[:700]
    n = 600

    def fresh() -> KVCache:
        return _fresh(smol, [SequenceInput(0, 0, ids[:n])], 704, F16)

    chain = smol(build_batch([SequenceInput(0, n, ids[n : n + 4])]), fresh())
    for threads in (1, 2):
        cache = fresh()
        rows = [_forward_with(smol, [[SequenceInput(0, n + i, ids[n + i : n + i + 1])]],
                              cache=cache, threads=threads)[0] for i in range(4)]
        assert torch.equal(torch.cat(rows), chain), threads


def test_engine_drafts_token_identical_on_a_half_cache() -> None:
    """Greedy answers with drafts (alone and batched) equal plain decoding on the same
    16-bit cache; the cache really is float16."""
    eng = Engine.load(kv_dtype="float16", max_batch_size=3, mode="fixed")
    assert eng.cache.k.dtype == F16
    prompts = ["Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat",
               "List the numbers from 1 to 20 separated by commas.",
               "Write a Python function that returns the sum of a list."]
    params = SamplingParams(max_new_tokens=40)
    ar = [eng.generate(p, params, chat=True, drafter="none").token_ids for p in prompts]
    for drafter in ("llma", "pld"):
        got = eng.generate(prompts, params, chat=True, drafter=drafter)
        assert [r.token_ids for r in got] == ar, drafter


def test_kv_dtype_is_validated() -> None:
    with pytest.raises(ValueError, match="kv_dtype"):
        Engine.load(kv_dtype="int8")
