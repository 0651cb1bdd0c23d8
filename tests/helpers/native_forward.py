"""The native forward's test set-up, shared by tests/models/test_native_forward.py and
test_native_half_cache.py: SmolLM2 loaded with a native forward (fixtures ``smol``,
``smol_dense``, ``prompt_ids``: a test module imports them by name), the step plan every
parity and invariance check runs, the dense oracle's row check, and drivers of the native
forward with explicit threads and kernel paths."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pytest
import torch

from recallspec.kernels import isa
from recallspec.models import CausalLM, load_model, load_tokenizer
from recallspec.models.native import NativeModel
from recallspec.runtime.batch import SequenceInput, build_batch
from recallspec.runtime.kv_cache import KVCache

PROMPT = (
    "The history of the printing press begins in 1440, when Johannes Gutenberg combined "
    "movable metal type with an oil-based ink and a screw press."
)
TREE = [-1, 0, 0, 1, 1, 2, 2]
Steps = Sequence[Sequence[SequenceInput]]


def _load(name: str | None, dtype: str) -> CausalLM:
    model, _ = load_model(name, dtype=dtype)
    if model.native is None:  # a float32 model: the dense native path, for the oracle
        model.native = NativeModel(model)
    return model


@pytest.fixture(scope="module")
def smol() -> CausalLM:
    return _load(None, "auto")


@pytest.fixture(scope="module")
def smol_dense() -> CausalLM:
    return _load(None, "float32")


@pytest.fixture(scope="module")
def prompt_ids() -> list[int]:
    return list(load_tokenizer(None).encode(PROMPT))


def _steps_smol(ids: list[int]) -> Iterator[list[SequenceInput]]:
    """Prefill, decode steps, a draft tree, a ragged batch (decode + prefill + tree) and
    padded-KV rows (holes in the cached prefix, logical positions)."""
    n = len(ids)
    yield [SequenceInput(0, 0, ids)]
    for i in range(3):
        yield [SequenceInput(0, n + i, [ids[i]])]
    yield [SequenceInput(0, n + 3, ids[3:10], TREE)]
    yield [SequenceInput(0, n + 3, ids[3:5]), SequenceInput(1, 0, ids[:20]),
           SequenceInput(2, 0, ids[:7], TREE)]
    valid = torch.ones(24, dtype=torch.bool)
    valid[20:] = False  # slot 1 holds 20 real keys, then 4 padding entries
    yield [SequenceInput(1, 24, ids[20:23], cache_valid=valid, start_pos=20),
           SequenceInput(2, 7, ids[:5], TREE[:5])]


def _check(ours: torch.Tensor, ref: torch.Tensor, rel: float, what: str) -> float:
    """Dense oracle, per row: |ours - ref| <= rel * max|ref|; argmax and top-5 equal unless
    the reference has a near-tie (gap <= 2 * bound). Returns the worst relative deviation."""
    worst = 0.0
    for r in range(ref.shape[0]):
        bound = rel * float(ref[r].abs().max())
        dev = float((ours[r] - ref[r]).abs().max())
        worst = max(worst, dev / (bound / rel))
        assert dev <= bound, f"{what} row {r}: |diff| {dev:.3g} > {bound:.3g}"
        top = ref[r].topk(6).values
        if float(top[0] - top[1]) > 2 * bound:
            assert int(ours[r].argmax()) == int(ref[r].argmax()), f"{what} row {r}: argmax"
        if float(top[4] - top[5]) > 2 * bound:
            assert set(ours[r].topk(5).indices.tolist()) == set(ref[r].topk(5).indices.tolist()), (
                f"{what} row {r}: top-5")
    return worst


def _fresh(model: CausalLM, prefix: Sequence[SequenceInput], max_len: int = 256,
           dtype: torch.dtype | None = None) -> KVCache:
    cache = model.new_cache(4, max_len, dtype=dtype)
    model(build_batch(prefix), cache)
    return cache


def _forward_with(model: CausalLM, steps: Steps, max_len: int = 256,
                  cache: KVCache | None = None, **kw: object) -> list[torch.Tensor]:
    """The native forward over `steps` with explicit threads / isa (on `cache`, else on a
    fresh one of `max_len` positions)."""
    assert model.native is not None
    cache = model.new_cache(3, max_len) if cache is None else cache
    out: list[torch.Tensor] = []
    for s in steps:
        meta = build_batch(s)
        n_layers, max_pos = model._check_batch(meta, cache, None)
        rope = model.rope.for_cache(max_pos, cache.max_len)
        out.append(model.native.forward(meta, cache, n_layers, rope, **kw))  # type: ignore[arg-type]
    return out


def _other_settings() -> list[dict[str, object]]:
    """Forward settings whose results must equal one thread on this machine's path: two
    threads, and two threads on every other vector path it can run (the scalar path is
    too slow for whole steps; the tests check it on a short case)."""
    return [{"threads": 2}, *({"isa": v, "threads": 2} for v in isa.variants()
                              if v not in ("scalar", isa.ISA))]


# The oracles' bounds (tests/models/test_native_forward.py's docstring says why).
REL_DENSE = 2.0**-16
REL_QUANT = 2.0**-3
Forward = Callable[..., torch.Tensor]


def _run(model: CausalLM, fwd: Forward, steps: Steps, cache: KVCache) -> list[torch.Tensor]:
    return [fwd(build_batch(s), cache) for s in steps]


def _check_quantized(ours: Sequence[torch.Tensor], ref: Sequence[torch.Tensor]) -> str:
    """Quantized oracle over all rows of all steps (module docstring)."""
    a, b = torch.cat(list(ours)), torch.cat(list(ref))
    dev = (a - b).abs().amax(-1) / b.abs().amax(-1)
    in_top5 = [int(a[r].argmax()) in b[r].topk(5).indices.tolist() and
               int(b[r].argmax()) in a[r].topk(5).indices.tolist() for r in range(b.shape[0])]
    summary = (f"median deviation {float(dev.median()):.3f}, max {float(dev.max()):.3f}, "
               f"argmax in top-5 {sum(in_top5)}/{len(in_top5)}")
    assert float(dev.median()) <= REL_QUANT and float(dev.max()) <= 0.5, summary
    assert sum(in_top5) >= 0.95 * len(in_top5), summary
    return summary


def _parity(model: CausalLM, steps: Steps, rel: float | None, max_len: int = 256) -> str:
    """Native vs reference over `steps`: the dense oracle with bound `rel`, or (None) the
    quantized one."""
    ca, cb = model.new_cache(3, max_len), model.new_cache(3, max_len)
    ours = _run(model, model.forward, steps, ca)
    ref = _run(model, model.forward_reference, steps, cb)
    if rel is None:
        return _check_quantized(ours, ref)
    pairs = enumerate(zip(ours, ref, strict=True))
    worst = max(_check(o, r, rel, f"step {i}") for i, (o, r) in pairs)
    return f"worst deviation {worst:.2e}"
