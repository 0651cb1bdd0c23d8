"""RoPE frequencies and tables (models/rope.py) against transformers' own: for every
scaling type we compute, the cos and sin our tables hold are exactly (bit for bit) what
transformers' rotary embedding module of that model type returns for the same
positions, so a model loaded from a checkpoint directory rotates by transformers' angles;
LongRoPE at both factor sets (transformers switches by the forward's longest position,
we by the KV cache's length: see models/rope.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from recallspec.errors import ModelLoadError
from recallspec.models.config import ModelConfig, RopeSpec
from recallspec.models.rope import RopeTables

transformers = pytest.importorskip("transformers")

_SMALL = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
          "intermediate_size": 512, "num_hidden_layers": 2, "vocab_size": 1000,
          "max_position_embeddings": 8192}
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "default": ("llama", {"rope_theta": 500000.0}),
    "linear": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 8.0}}),
    "llama3": ("llama", {"rope_theta": 500000.0, "rope_scaling": {
        "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 512}}),
    "yarn": ("qwen2", {"rope_theta": 1e6, "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}}),
    "yarn-betas-attention": ("qwen2", {"rope_theta": 1e6, "rope_scaling": {
        "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 1024,
        "beta_fast": 16.0, "beta_slow": 2.0, "attention_factor": 1.25}}),
    "yarn-untruncated": ("qwen2", {"rope_theta": 1e6, "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048,
        "truncate": False}}),
    "longrope-partial": ("phi3", {
        "head_dim": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
        "partial_rotary_factor": 0.75, "original_max_position_embeddings": 256,
        "rope_scaling": {"rope_type": "longrope",
                         "short_factor": [1.0 + 0.01 * i for i in range(48)],
                         "long_factor": [1.0 + 0.5 * i for i in range(48)]}}),
}


def _hf_cos_sin(model_type: str, config: Any, positions: torch.Tensor) -> tuple[Any, Any]:
    mod = {"llama": transformers.models.llama.modeling_llama.LlamaRotaryEmbedding,
           "qwen2": transformers.models.qwen2.modeling_qwen2.Qwen2RotaryEmbedding,
           "phi3": transformers.models.phi3.modeling_phi3.Phi3RotaryEmbedding}[model_type]
    rotary = mod(config=config)
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions[None, :])
    return cos[0], sin[0]


@pytest.mark.parametrize("case", list(CASES))
def test_tables_equal_transformers(case: str) -> None:
    model_type, kw = CASES[case]
    hf = transformers.AutoConfig.for_model(model_type, **{**_SMALL, **kw})
    ours = ModelConfig.from_hf_dict(hf.to_dict())
    tables = RopeTables(ours)
    spec = ours.rope
    assert spec.type == case.split("-")[0]
    orig = spec.original_context or 0
    # (LongRoPE: a forward up to the original context is short in transformers, one
    # past it long; our caches of those lengths choose the same.)
    for last in ([orig, 3 * orig] if spec.type == "longrope" else [2000]):
        positions = torch.arange(last)
        cos, sin = _hf_cos_sin(model_type, hf, positions)
        ours_cos, ours_sin = tables.table(0, last, cache_len=last)
        assert torch.equal(ours_cos[:last], cos) and torch.equal(ours_sin[:last], sin), last


def test_gguf_freq_factors_are_llama3_within_an_ulp() -> None:
    """A GGUF's Llama 3 scaling comes as llama.cpp's converter writes it: divisors of the
    frequencies (rope_freqs, float32); dividing by them lands within 2 ulps of
    transformers' own llama3 frequencies."""
    import math

    model_type, kw = CASES["llama3"]
    hf = transformers.AutoConfig.for_model(model_type, **{**_SMALL, **kw})
    exact = RopeTables(ModelConfig.from_hf_dict(hf.to_dict()))
    from recallspec.models.rope import inv_freq

    inv, _ = inv_freq(exact.specs[0], 64)
    # The converter's formula (conversion/llama.py generate_extra_tensors), in Python floats.
    sc = kw["rope_scaling"]
    factors = []
    for f in (1.0 / (500000.0 ** (i / 64)) for i in range(0, 64, 2)):
        wavelen = 2 * math.pi / f
        lo, hi = sc["original_max_position_embeddings"] / sc["low_freq_factor"], (
            sc["original_max_position_embeddings"] / sc["high_freq_factor"])
        if wavelen < hi:
            factors.append(1.0)
        elif wavelen > lo:
            factors.append(sc["factor"])
        else:
            s = (sc["original_max_position_embeddings"] / wavelen - sc["low_freq_factor"]) / (
                sc["high_freq_factor"] - sc["low_freq_factor"])
            factors.append(1 / ((1 - s) / sc["factor"] + s))
    spec = RopeSpec(theta=500000.0, type="freq_factors",
                    freq_factors=tuple(float(torch.tensor(x)) for x in factors))
    got, _ = inv_freq(spec, 64)
    ulps = ((got - inv).abs() / torch.finfo(torch.float32).eps / inv.abs()).max()
    assert float(ulps) <= 2.0


def test_rope_spec_checks() -> None:
    with pytest.raises(ModelLoadError, match="lacks factor"):
        RopeSpec(theta=1e4, type="linear")
    with pytest.raises(ModelLoadError, match="unsupported RoPE scaling type 'ntk'"):
        RopeSpec(theta=1e4, type="ntk")
    with pytest.raises(ModelLoadError, match="dynamic"):
        ModelConfig.from_hf_dict({**_SMALL, "model_type": "llama", "rope_scaling": {
            "rope_type": "dynamic", "factor": 2.0}})
    with pytest.raises(ModelLoadError, match="factors for"):
        ModelConfig.from_hf_dict({**_SMALL, "model_type": "phi3", "rope_scaling": {
            "rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 3},
            "original_max_position_embeddings": 256})
