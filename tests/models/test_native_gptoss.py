"""The native forward's gpt-oss features against the Python reference, on a tiny random
gpt-oss model built in memory (no checkpoint): attention sinks (one learned logit per
head in each softmax's denominator), router and expert biases, and the clamped SwiGLU
("swiglu_oai"), with gpt-oss's other parts (q/k/v/o biases, a window on every other
layer, YaRN, top-4 of 8 experts renormalised, an untied head).

* the dense oracle: float32 weights through the native code vs ``forward_reference``,
  bound ``REL_DENSE`` as for the real models (tests/models/test_native_forward.py), and
  each feature shown to matter (the reference without it is far outside the bound), the
  clamps shown to act (gates above the limit, up values beyond it on both sides);
* the quantized oracle (Q8_0 matrices, float router), statistical as in
  test_native_forward.py;
* batch invariance on the quantized path, exact: 1 or 2 threads, every kernel path this
  CPU has (the portable one on a short case), a float16 KV cache too; a row's logits the
  same alone as inside a bigger draft tree in batches of 3 and 8 sequences, one token
  at a time as in a verification chain;
* each forward's own count of its experts (profiling off): the distinct experts its
  rows chose, as the reference's router chose them;
* a checkpoint without a tensor its config promises is refused, naming it; so is an
  ill-shaped one at the native forward's boundary, and an activation it lacks.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import cache

import pytest
import torch
from helpers.native_forward import (
    REL_DENSE,
    TREE,
    Steps,
    _check_quantized,
    _forward_with,
    _other_settings,
    _parity,
    _run,
)

from recallspec.errors import ModelLoadError
from recallspec.kernels.qlinear import QuantizedWeight
from recallspec.models import native, transformer
from recallspec.models.config import ACTIVATIONS, ModelConfig
from recallspec.models.layer import DecoderLayer, Weight
from recallspec.models.native import NativeModel
from recallspec.models.transformer import CausalLM
from recallspec.runtime.batch import SequenceInput, build_batch
from recallspec.runtime.kv_cache import KVCache

WINDOW = 16
MAX_LEN = 256


def _config() -> ModelConfig:
    """gpt-oss's shape in small: 12 query heads over 3 kv heads of 64 (kv groups of 4, as
    gpt-oss-20b's 64 / 8; on two threads a decode row's attention splits each group into
    pairs of heads, on one it keeps four: each block's sinks start at its own head),
    hidden 128, 8 experts of 64, top 4, 3 layers (window 16 on layers 0 and 2), YaRN over
    an original context of 128."""
    return ModelConfig.from_hf_dict({
        "model_type": "gpt_oss", "hidden_size": 128, "num_attention_heads": 12,
        "num_key_value_heads": 3, "head_dim": 64, "num_hidden_layers": 3,
        "intermediate_size": 64, "num_local_experts": 8, "num_experts_per_tok": 4,
        "vocab_size": 512, "sliding_window": WINDOW, "tie_word_embeddings": False,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                            "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0,
                            "original_max_position_embeddings": 128},
    })


def _weights(c: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights in the internal names. Sinks of the scores' size (std 2), so they
    take a real share of each softmax; gate-up weights and biases large enough that the
    clamps act (test_clamps_act)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int, std: float = 0.08) -> torch.Tensor:
        return std * torch.randn(*shape, generator=g)

    H, Hkv, D, hid = c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size
    inter, E = c.mlp_size, c.num_experts
    w = {"embed": r(c.vocab_size, hid, std=1.0), "lm_head": r(c.vocab_size, hid),
         "final_norm": 1 + r(hid, std=0.2)}
    for i in range(c.num_layers):
        p = f"layers.{i}."
        w |= {p + "qkv_w": r((H + 2 * Hkv) * D, hid), p + "qkv_b": r((H + 2 * Hkv) * D, std=0.2),
              p + "o_w": r(hid, H * D), p + "o_b": r(hid, std=0.2),
              p + "attn_norm": 1 + r(hid, std=0.2), p + "ffn_norm": 1 + r(hid, std=0.2),
              p + "sinks": r(H, std=2.0), p + "router_w": r(E, hid, std=0.3),
              p + "router_b": r(E, std=0.5)}
        for e in range(E):
            q = f"{p}experts.{e}."
            w |= {q + "gate_up_w": r(2 * inter, hid, std=0.5),
                  q + "gate_up_b": r(2 * inter, std=1.0),
                  q + "down_w": r(hid, inter), q + "down_b": r(hid, std=0.2)}
    return w


@cache
def _dense() -> CausalLM:
    c = _config()
    assert c.attention_sinks and c.expert_bias and c.activation == "swiglu_oai" and c.moe
    assert c.layer_windows == (WINDOW, None, WINDOW)
    return CausalLM(c, _weights(c), torch.float32, native=True)  # the dense native oracle


@cache
def _quantized() -> CausalLM:
    c = _config()
    w = {k: QuantizedWeight.from_float(v, "Q8_0") if v.ndim == 2 and ".router_w" not in k else v
         for k, v in _weights(c).items()}
    model = CausalLM(c, w, torch.float32, quantized=True)
    assert model.native is not None
    return model


def _ids(n: int = 200, seed: int = 1) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _steps(ids: list[int]) -> Iterator[list[SequenceInput]]:
    """A prefill in two chunks (past the window), decode steps, a draft tree beside another
    sequence's prefill, a ragged batch (a chain, a tree, a new prompt's tree) and
    padded-KV rows (holes in the cached prefix, logical positions)."""
    yield [SequenceInput(0, 0, ids[:30])]
    yield [SequenceInput(0, 30, ids[30:60], logits="last")]
    for i in range(2):
        yield [SequenceInput(0, 60 + i, [ids[60 + i]])]
    yield [SequenceInput(0, 62, ids[62:69], TREE), SequenceInput(1, 0, ids[:24])]
    yield [SequenceInput(0, 69, ids[69:71]), SequenceInput(1, 24, ids[24:29], TREE[:5]),
           SequenceInput(2, 0, ids[:7], TREE)]
    valid = torch.ones(33, dtype=torch.bool)
    valid[29:] = False  # slot 1 holds 29 real keys, then 4 padding entries
    yield [SequenceInput(1, 33, ids[29:32], cache_valid=valid, start_pos=29),
           SequenceInput(2, 7, ids[:5], TREE[:5])]


def test_dense_native_matches_reference() -> None:
    print("gpt-oss dense:", _parity(_dense(), list(_steps(_ids())), REL_DENSE, MAX_LEN))


def _deviation(ours: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    return max(float(((a - b).abs().amax(-1) / b.abs().amax(-1)).max())
               for a, b in zip(ours, ref, strict=True))


def _drop_sinks(layer: DecoderLayer) -> None:
    layer.sinks = None


def _roll_sinks(layer: DecoderLayer) -> None:  # (each head given its neighbour's sink)
    assert layer.sinks is not None
    layer.sinks = layer.sinks.roll(1)


def _drop_router_bias(layer: DecoderLayer) -> None:
    layer.router_b = None


def _zero_gate_up_bias(layer: DecoderLayer) -> None:
    layer.expert_gate_up_b = tuple(torch.zeros_like(b) for b in layer.expert_gate_up_b)


def _zero_down_bias(layer: DecoderLayer) -> None:
    layer.expert_down_b = tuple(torch.zeros_like(b) for b in layer.expert_down_b)


@pytest.mark.parametrize("change", [_drop_sinks, _roll_sinks, _drop_router_bias,
                                    _zero_gate_up_bias, _zero_down_bias, None],
                         ids=["sinks", "sinks_per_head", "router_bias", "gate_up_bias",
                              "down_bias", "clamp"])
def test_each_feature_matters(change: Callable[[DecoderLayer], None] | None) -> None:
    """The reference without one feature (None: without the clamps) is far from the
    native forward, which the dense oracle holds within 2^-16: the parity test checks
    each feature's wiring, not a model where it is inert."""
    model = _dense()
    steps = list(_steps(_ids()))[:5]
    ours = _run(model, model.forward, steps, model.new_cache(3, MAX_LEN))
    c = model.config
    saved = [(layer.sinks, layer.router_b, layer.expert_gate_up_b, layer.expert_down_b)
             for layer in model.layers]
    try:
        if change is None:
            model.config = replace(c, swiglu_limit=1e30)
        else:
            for layer in model.layers:
                change(layer)  # type: ignore[arg-type]
        ref = _run(model, model.forward_reference, steps, model.new_cache(3, MAX_LEN))
    finally:
        model.config = c
        for layer, (s, rb, gb, db) in zip(model.layers, saved, strict=True):
            layer.sinks, layer.router_b, layer.expert_gate_up_b, layer.expert_down_b = s, rb, gb, db
    assert _deviation(ours, ref) > 100 * REL_DENSE


def test_clamps_act(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the parity steps the expert gates exceed the limit and the up values pass it on
    both sides (so min(g, L) and clamp(u, -L, L) are both exercised), and many stay
    within it."""
    model = _dense()
    limit = model.config.swiglu_limit
    seen: list[torch.Tensor] = []
    mlp = CausalLM._mlp

    def recording(self: CausalLM, x: torch.Tensor, gate_up_w: Weight,
                  down_w: Weight, gate_up_b: torch.Tensor | None = None,
                  down_b: torch.Tensor | None = None) -> torch.Tensor:
        seen.append(transformer._matmul(x, gate_up_w, gate_up_b))
        return mlp(self, x, gate_up_w, down_w, gate_up_b, down_b)

    monkeypatch.setattr(CausalLM, "_mlp", recording)
    _run(model, model.forward_reference, list(_steps(_ids()))[:2], model.new_cache(3, MAX_LEN))
    gu = torch.cat([s.reshape(-1, s.shape[-1]) for s in seen])
    gate, up = gu.chunk(2, dim=-1)
    n = gate.numel()
    assert 0.01 * n < int((gate > limit).sum()) < 0.5 * n
    assert 0.01 * n < int((up > limit).sum()) and 0.01 * n < int((up < -limit).sum())
    assert int((up.abs() < limit).sum()) > 0.3 * n


def test_each_forward_counts_the_experts_its_rows_chose(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With profiling off, each native forward keeps its own counts (``last_experts``):
    its (layer, row) routings and, summed over its layers, the distinct experts its rows
    chose, as the reference's router chooses them on the same rows (the dense oracle:
    the same routing), through the parity steps (prompt chunks, trees, ragged batches);
    a forward of the first layer alone (a self-draft's) counts that layer's.
    ``profile``'s totals are their sums, its seconds untouched (no clock read)."""
    model = _dense()
    nm, layers = model.native, model.config.num_layers
    assert nm is not None
    nm.set_profiling(False)
    nm.profile(reset=True)
    chosen: list[torch.Tensor] = []  # each layer's [rows, experts_per_token] choices
    top = transformer._top_experts

    def recording(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        values, experts = top(logits, k)
        chosen.append(experts)
        return values, experts

    monkeypatch.setattr(transformer, "_top_experts", recording)
    cache = model.new_cache(3, MAX_LEN)
    steps = list(_steps(_ids()))
    runs_sum = rows_sum = 0
    for step in steps:
        meta = build_batch(step)
        for n in (1, layers):  # (each forward rewrites the step's rows; the prefix is shared)
            model.forward(meta, cache, num_layers=n)
            runs, rows = nm.last_experts()
            chosen.clear()
            model.forward_reference(meta, cache, num_layers=n)
            assert len(chosen) == n
            want = sum(len(set(e.reshape(-1).tolist())) for e in chosen)
            assert (runs, rows) == (want, meta.num_tokens * n)
            runs_sum, rows_sum = runs_sum + runs, rows_sum + rows
    p = nm.profile(reset=True)
    assert (p["calls"], p["expert_runs"], p["expert_rows"]) == (2 * len(steps), runs_sum,
                                                                rows_sum)
    assert p["total"] == 0.0
    # Rows shared experts: the count is not each row's experts_per_token summed.
    assert 0 < runs_sum < model.config.experts_per_token * rows_sum


def test_quantized_parity() -> None:
    model = _quantized()
    steps = list(_steps(_ids()))
    ours = _run(model, model.forward, steps, model.new_cache(3, MAX_LEN))
    ref = _run(model, model.forward_reference, steps, model.new_cache(3, MAX_LEN))
    print("gpt-oss quantized:", _check_quantized(ours, ref))


@pytest.mark.parametrize("kv", [torch.float32, torch.float16], ids=["f32", "f16"])
def test_threads_and_kernel_paths_same_bits(kv: torch.dtype) -> None:
    model, steps = _quantized(), list(_steps(_ids()))

    def run(**kw: object) -> list[torch.Tensor]:
        return _forward_with(model, steps, cache=model.new_cache(3, MAX_LEN, dtype=kv), **kw)

    base = run(threads=1)
    for kw in _other_settings():
        got = run(**kw)
        assert all(torch.equal(a, b) for a, b in zip(base, got, strict=True)), kw
    # The portable path (slow products): a short case.
    short: Steps = [[SequenceInput(0, 0, _ids()[:20])],
                    [SequenceInput(0, 20, _ids()[20:23], [-1, 0, 0])]]
    a = _forward_with(model, short, cache=model.new_cache(3, MAX_LEN, dtype=kv))
    b = _forward_with(model, short, cache=model.new_cache(3, MAX_LEN, dtype=kv), isa="scalar")
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_row_alone_equals_row_in_batches() -> None:
    """Seq 0's 3-row draft (past the window) alone; the same rows as the start of a bigger
    tree among 3 and among 8 sequences' rows (chains, trees, prefills, decode rows): the
    same bits. And one token at a time equals the verification chain (lossless)."""
    model, ids = _quantized(), _ids()
    prefix = [SequenceInput(0, 0, ids[:40]), SequenceInput(1, 0, ids[:11])]

    def fresh() -> KVCache:
        cache = model.new_cache(8, MAX_LEN)
        model(build_batch(prefix), cache)
        return cache

    alone = model(build_batch([SequenceInput(0, 40, ids[40:43], [-1, 0, 0])]), fresh())
    tree = SequenceInput(0, 40, ids[40:43] + ids[50:54], [-1, 0, 0, 1, 2, 3, 0])
    three = [SequenceInput(1, 11, ids[11:16]), tree, SequenceInput(2, 0, ids[:30])]
    assert torch.equal(model(build_batch(three), fresh())[5:8], alone)
    eight = [SequenceInput(3, 0, ids[100:104], [-1, 0, 1, 1]), SequenceInput(1, 11, [ids[11]]),
             SequenceInput(4, 0, ids[60:90], logits="last"), tree,
             SequenceInput(5, 0, ids[:7], TREE), SequenceInput(6, 0, ids[120:121]),
             SequenceInput(7, 0, ids[130:150]), SequenceInput(2, 0, ids[:30])]
    before = 4 + 1 + 1  # (seq 4's prefill returns its last row only)
    assert torch.equal(model(build_batch(eight), fresh())[before : before + 3], alone)
    steps_cache, chain_cache = fresh(), fresh()
    steps = [model(build_batch([SequenceInput(0, 40 + i, [ids[40 + i]])]), steps_cache)
             for i in range(4)]
    chain = model(build_batch([SequenceInput(0, 40, ids[40:44])]), chain_cache)
    assert torch.equal(torch.cat(steps), chain)


@pytest.mark.parametrize("name", ["layers.1.sinks", "layers.1.router_b",
                                  "layers.1.experts.7.gate_up_b", "layers.1.experts.0.down_b"])
def test_missing_gpt_oss_tensor_refused(name: str) -> None:
    """A checkpoint without one of the sinks or biases its config promises is refused,
    naming the tensor (computing without it would be another model)."""
    c = _config()
    w = _weights(c)
    del w[name]
    with pytest.raises(ModelLoadError, match=re.escape(repr(name))):
        CausalLM(c, w, torch.float32, native=True)


def test_native_refuses_ill_shaped_gpt_oss_vectors() -> None:
    """The native forward names a gpt-oss vector missing from a layer or of another
    shape than the config's (the C++ side would read None as the feature off)."""
    model = CausalLM(_config(), _weights(_config()), torch.float32, native=False)
    layer = model.layers[1]
    assert isinstance(layer, DecoderLayer) and layer.sinks is not None
    assert layer.router_b is not None
    NativeModel(model)  # (complete: accepted)
    gate_up = layer.expert_gate_up_b
    for attr, value, name in (
            ("sinks", None, "sinks"), ("sinks", layer.sinks[:-1], "sinks"),
            ("router_b", None, "router_b"), ("router_b", layer.router_b.repeat(2), "router_b"),
            ("expert_down_b", (), "experts.0.down_b"),
            ("expert_gate_up_b", gate_up[:-1], "experts.7.gate_up_b"),
            ("expert_gate_up_b", (gate_up[0][:-2], *gate_up[1:]), "experts.0.gate_up_b")):
        old = getattr(layer, attr)
        setattr(layer, attr, value)
        try:
            with pytest.raises(ModelLoadError, match=re.escape(repr("layers.1." + name))):
                NativeModel(model)
        finally:
            setattr(layer, attr, old)


def test_native_activations_are_the_configs() -> None:
    """The native forward's activations are names of ``config.ACTIVATIONS``, each its own
    switches (never both); one it lacks is refused, naming it."""
    table = native._NATIVE_ACTIVATIONS
    assert set(table) <= set(ACTIVATIONS)
    assert len(set(table.values())) == len(table) and (True, True) not in table.values()
    assert native._activation_switches("swiglu_oai") == (False, True)
    with pytest.raises(ModelLoadError, match="'relu'"):
        native._activation_switches("relu")
