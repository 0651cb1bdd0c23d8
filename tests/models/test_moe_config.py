"""A mixture of experts' configuration: what a Qwen3-MoE config.json means to us, what is
refused (dense layers among the sparse ones, experts in an architecture we run dense),
and the un-renormalised top-k (``norm_topk_prob`` false, transformers' default, which no
published Qwen3-MoE states) computed as transformers computes it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.conformance import built, reference

from recallspec.conformance import checks
from recallspec.conformance.checks import FP32_REL
from recallspec.errors import ModelLoadError
from recallspec.models import ModelConfig

BASE: dict[str, Any] = {
    "model_type": "qwen3_moe", "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "vocab_size": 1000, "num_experts": 16, "num_experts_per_tok": 4,
    "moe_intermediate_size": 256, "norm_topk_prob": True,
}


def test_qwen3_moe_config_read() -> None:
    c = ModelConfig.from_hf_dict(BASE)
    assert (c.arch, c.moe, c.num_experts, c.experts_per_token, c.expert_intermediate_size,
            c.norm_topk_prob, c.qk_norm, c.mlp_size) == ("qwen3", True, 16, 4, 256, True,
                                                         True, 256)
    # transformers 5.x writes num_local_experts; Qwen3MoeConfig's default is no renorm.
    cfg = {k: v for k, v in BASE.items() if k not in ("num_experts", "norm_topk_prob")}
    c = ModelConfig.from_hf_dict({**cfg, "num_local_experts": 8})
    assert (c.num_experts, c.norm_topk_prob) == (8, False)
    dense = {k: v for k, v in BASE.items() if "experts" not in k and "moe" not in k}
    assert not ModelConfig.from_hf_dict({**dense, "model_type": "qwen3", "num_experts": 0}).moe


@pytest.mark.parametrize("change, words", [
    ({"mlp_only_layers": [1]}, "dense MLP layers"),
    ({"decoder_sparse_step": 2}, "dense MLP layers"),
    ({"num_experts_per_tok": 17}, "experts per token"),
    ({"shared_expert_intermediate_size": 512}, "shared expert"),
    ({"model_type": "qwen2"}, "mixture of experts"),
])
def test_qwen3_moe_config_refused(change: dict[str, Any], words: str) -> None:
    with pytest.raises(ModelLoadError, match=words):
        ModelConfig.from_hf_dict({**BASE, **change})


def test_unrenormalised_top_k_matches_transformers(tmp_path: Path) -> None:
    """The variant's checkpoint with norm_topk_prob false: its chosen experts' weights are
    their softmax over all experts; ours (fp32, from the directory) against transformers
    on the same directory, bound as for every variant (``checks.FP32_REL``)."""
    src = built("qwen3-moe").hf_dir
    d = tmp_path / "unnormed"
    shutil.copytree(src, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["norm_topk_prob"] = False
    (d / "config.json").write_text(json.dumps(cfg))
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    ref = reference("qwen3-moe")
    want = checks.hf_logits(hf, ref.ids)
    ours = checks.ours_logits(checks.load_ours(d, "float32"), ref.ids, ref.variant.context)
    a = checks.agreement(want, ours)
    assert a.max_rel <= FP32_REL, a
    # (and the switch matters: the renormalised model's logits are far from these)
    assert checks.agreement(ref.logits, want).max_rel > 10 * FP32_REL
