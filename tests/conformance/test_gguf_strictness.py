"""Nothing in a GGUF is skipped silently (models/gguf/arch.py).

* Every tensor kind a variant's file holds is needed: a copy of the file without that
  kind either fails to load (a ``ModelLoadError`` naming it) or computes logits that fail
  the conformance bound against transformers (test_transformers_parity.py's check). So
  a loader that ignored a kind (as ours once ignored ``rope_freqs``, computing Llama 3.x
  with plain RoPE) fails this test and the parity tests.
* A tensor, metadata key or RoPE scaling type outside the tables is a ``ModelLoadError``
  naming the file, the architecture and the feature; so are features we do not compute
  (mixtures of experts, partial rotary in a Llama file, split files), and, in a
  checkpoint directory, unknown RoPE types and tensors nothing uses.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from helpers.conformance import built, reference, rewrite_gguf

from recallspec.conformance import checks
from recallspec.conformance.checks import FP32_REL
from recallspec.errors import ModelLoadError
from recallspec.models import load_model

# Each tensor kind (a GGUF name without its layer) with a variant whose file holds it.
KINDS = {
    "token_embd.weight": "llama3.1-untied", "output.weight": "llama3.1-untied",
    "output_norm.weight": "llama3.1-untied", "rope_freqs.weight": "llama3.1-untied",
    "attn_norm.weight": "llama3.1-untied", "attn_q.weight": "llama3.1-untied",
    "attn_k.weight": "llama3.1-untied", "attn_v.weight": "llama3.1-untied",
    "attn_output.weight": "llama3.1-untied", "ffn_norm.weight": "llama3.1-untied",
    "ffn_gate.weight": "llama3.1-untied", "ffn_up.weight": "llama3.1-untied",
    "ffn_down.weight": "llama3.1-untied",
    "attn_q.bias": "qwen2.5", "attn_k.bias": "qwen2.5", "attn_v.bias": "qwen2.5",
    "attn_q_norm.weight": "qwen3", "attn_k_norm.weight": "qwen3",
    "post_attention_norm.weight": "gemma2-2b", "post_ffw_norm.weight": "gemma2-2b",
    "attn_qkv.weight": "phi4-mini", "rope_factors_long.weight": "phi4-mini",
    "rope_factors_short.weight": "phi4-mini",
    "ffn_gate_inp.weight": "qwen3-moe", "ffn_gate_exps.weight": "qwen3-moe",
    "ffn_up_exps.weight": "qwen3-moe", "ffn_down_exps.weight": "qwen3-moe",
    "attn_sinks.weight": "gpt-oss", "attn_output.bias": "gpt-oss",
    "ffn_gate_inp.bias": "gpt-oss", "ffn_gate_exps.bias": "gpt-oss",
    "ffn_up_exps.bias": "gpt-oss", "ffn_down_exps.bias": "gpt-oss",
}


def _kind(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[2:]) if parts[0] == "blk" else name


@pytest.fixture
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache of its own for the rewritten files' conversions (the variants' own files
    are built, and remembered, before it is set)."""
    for name in set(KINDS.values()):
        built(name)
    monkeypatch.setenv("RECALLSPEC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_every_kind_of_every_variant_is_listed() -> None:
    """KINDS covers every tensor kind any variant's file holds (the test below then
    drops each)."""
    from helpers.conformance import NAMES

    from recallspec.models.gguf.header import read_header

    kinds = {_kind(t.name) for n in NAMES for t in read_header(built(n).f32_gguf).tensors}
    assert kinds <= set(KINDS) | {"ffn_up.weight"}, sorted(kinds - set(KINDS))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_dropping_a_tensor_kind_fails(kind: str, isolated_cache: Path) -> None:
    name = KINDS[kind]
    ref = reference(name)
    path = rewrite_gguf(built(name).f32_gguf, isolated_cache / "dropped.gguf",
                        drop=lambda t: _kind(t) == kind)
    try:
        model = checks.load_ours(path, "float32")
    except ModelLoadError as e:
        print(f"{kind}: refused: {e}")
        return
    a = checks.agreement(ref.logits, checks.ours_logits(model, ref.ids, ref.variant.context))
    print(f"{kind}: loads, then {a}")
    assert a.max_rel > 10 * FP32_REL, a


def _refused(path: Path, *words: str) -> str:
    with pytest.raises(ModelLoadError) as e:
        load_model(path, dtype="float32", repack_cache=False)
    msg = str(e.value)
    for w in (str(path), *words):
        assert w in msg, msg
    return msg


def test_unknown_tensor_refused(isolated_cache: Path) -> None:
    path = rewrite_gguf(built("llama3.2-tied").f32_gguf, isolated_cache / "extra.gguf",
                        tensors={"blk.0.attn_mystery.weight": np.ones(256, np.float32)})
    _refused(path, "llama", "blk.0.attn_mystery.weight")


def test_unknown_key_refused(isolated_cache: Path) -> None:
    path = rewrite_gguf(built("qwen3").f32_gguf, isolated_cache / "key.gguf",
                        keys={"qwen3.attention.mystery": (1, gguf.GGUFValueType.UINT32)})
    _refused(path, "qwen3", "qwen3.attention.mystery")


@pytest.mark.parametrize("kind", ["xpos", "dynamic"])
def test_unknown_scaling_type_refused(kind: str, isolated_cache: Path) -> None:
    path = rewrite_gguf(
        built("mistral-nemo").f32_gguf, isolated_cache / "scaling.gguf",
        keys={"llama.rope.scaling.type": (kind, gguf.GGUFValueType.STRING),
              "llama.rope.scaling.factor": (4.0, gguf.GGUFValueType.FLOAT32)})
    _refused(path, "llama", "RoPE scaling type", kind)


def test_mixture_of_experts_refused(isolated_cache: Path) -> None:
    path = rewrite_gguf(built("qwen2.5").f32_gguf, isolated_cache / "moe.gguf",
                        keys={"qwen2.expert_count": (8, gguf.GGUFValueType.UINT32)})
    _refused(path, "qwen2", "mixture of experts")


def test_mixture_of_experts_without_its_expert_size_refused(isolated_cache: Path) -> None:
    path = rewrite_gguf(built("qwen3-moe").f32_gguf, isolated_cache / "moe-size.gguf",
                        drop_keys=("qwen3moe.expert_feed_forward_length",))
    _refused(path, "qwen3moe", "expert_feed_forward_length")


def test_dense_mlp_tensor_in_a_mixture_of_experts_refused(isolated_cache: Path) -> None:
    """A qwen3moe file whose layer also holds a dense MLP matrix: not ours to guess."""
    path = rewrite_gguf(built("qwen3-moe").f32_gguf, isolated_cache / "moe-dense.gguf",
                        tensors={"blk.0.ffn_gate.weight": np.ones((256, 256), np.float32)})
    _refused(path, "qwen3_moe", "blk.0.ffn_gate.weight")


def test_partial_rotary_in_a_llama_file_refused(isolated_cache: Path) -> None:
    path = rewrite_gguf(built("llama3.2-tied").f32_gguf, isolated_cache / "rot.gguf",
                        keys={"llama.rope.dimension_count": (32, gguf.GGUFValueType.UINT32)})
    _refused(path, "llama", "partial rotary")


def test_rope_scaling_stated_twice_refused(isolated_cache: Path) -> None:
    """A llama3 file (rope_freqs) that also says linear: which one is meant is unknown."""
    path = rewrite_gguf(
        built("llama3.2-tied").f32_gguf, isolated_cache / "twice.gguf",
        keys={"llama.rope.scaling.type": ("linear", gguf.GGUFValueType.STRING),
              "llama.rope.scaling.factor": (8.0, gguf.GGUFValueType.FLOAT32)})
    _refused(path, "llama", "stated twice")


def _hf_copy(name: str, tmp: Path, edit_config: dict[str, object]) -> Path:
    src = built(name).hf_dir
    dst = tmp / "hf"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(edit_config)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize(("edit", "words"), [
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 5e5}},
     ("dynamic",)),
    ({"rope_parameters": {"rope_type": "proportional", "rope_theta": 5e5}},
     ("RoPE scaling type", "proportional")),
    ({"mlp_bias": True}, ("mlp_bias",)),
    ({"layer_types": ["chunked_attention", "full_attention"]}, ("chunked_attention",)),
])
def test_hf_directory_features_refused(edit: dict[str, object], words: tuple[str, ...],
                                       isolated_cache: Path) -> None:
    path = _hf_copy("llama3.2-tied", isolated_cache, edit)
    with pytest.raises(ModelLoadError) as e:
        load_model(path, dtype="float32")
    assert all(w in str(e.value) for w in words), str(e.value)
    assert str(path) in str(e.value)


def test_hf_directory_unused_tensor_refused(isolated_cache: Path) -> None:
    from safetensors.torch import load_file, save_file

    path = _hf_copy("qwen3", isolated_cache, {})
    (f,) = path.glob("*.safetensors")
    tensors = load_file(str(f))
    bias = tensors["model.layers.0.mlp.down_proj.weight"][0].clone()
    tensors["model.layers.0.mlp.gate_proj.bias"] = bias
    save_file(tensors, str(f), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"gate_proj\.bias"):
        load_model(path, dtype="float32")


def test_gptoss_yarn_is_not_truncated() -> None:
    """gpt-oss's YaRN correction range as its config states it (truncate: false), which
    no GGUF key carries and llama.cpp rounds: the fp32 check against transformers holds
    only so (the same file with the range rounded, llama.cpp's way, is far off)."""
    from recallspec.models.config import ModelConfig
    from recallspec.models.gguf.arch import hf_config
    from recallspec.models.gguf.header import read_header

    path = built("gpt-oss").f32_gguf
    cfg = ModelConfig.from_hf_dict(hf_config(read_header(path), path))
    assert cfg.rope.type == "yarn" and not cfg.rope.truncate
    ref = reference("gpt-oss")
    rounded = checks.with_llamacpp_rope(checks.load_ours(path, "float32"))
    assert rounded.config.rope.truncate
    a = checks.agreement(ref.logits, checks.ours_logits(rounded, ref.ids, ref.variant.context))
    assert a.max_rel > 10 * FP32_REL, a


def test_gptoss_expert_size_other_than_the_ffn_refused(isolated_cache: Path) -> None:
    path = rewrite_gguf(built("gpt-oss").f32_gguf, isolated_cache / "oss-size.gguf",
                        keys={"gpt-oss.expert_feed_forward_length":
                              (128, gguf.GGUFValueType.UINT32)})
    _refused(path, "gpt-oss", "expert_feed_forward_length")
