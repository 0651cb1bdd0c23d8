"""What a GGUF file's architecture means, for every architecture we run: each metadata key
and tensor kind its files carry (as llama.cpp's converter, ``convert_hf_to_gguf.py``,
writes them), mapped to a transformers ``config.json`` and tensor names, or ignored with a
stated reason. A key or tensor outside these tables, or a value we do not compute (a RoPE
scaling type, experts in an architecture we run dense), is a ``ModelLoadError`` naming the file, the
architecture and the feature: nothing in a file is skipped silently (a Llama 3.x file's
RoPE scaling lives in its ``rope_freqs`` tensor, which a silent skip had turned into
plain RoPE).

Where llama.cpp derives a value the file does not state, we derive it as llama.cpp does
(named per case below: Gemma's attention scale, SmolLM3's layers without RoPE, Gemma 2's
soft-cap defaults), so a file means the same model to both. Where llama.cpp leaves out a
feature the file does state, we compute the feature as transformers does (Phi-3's
sliding window, SmolLM3 with Llama 3 RoPE scaling), the model's own maths; and where the
two compute a feature differently, as transformers does (gpt-oss's YaRN, whose correction
range llama.cpp rounds and the model's config does not).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recallspec.errors import ModelLoadError
from recallspec.kernels.ggml_types import GGMLType
from recallspec.models.gguf.header import Header, TensorInfo

# Metadata keys outside the ``{arch}.`` namespace that describe the file, not the model:
# general.* (name, license, file type, alignment), tokenizer.* (read by the tokenizer's
# conversion, models/gguf/tokenizer.py), quantize.* (llama-quantize's notes: the
# importance matrix a file was quantized with).
INFORMATIONAL_PREFIXES = ("general.", "tokenizer.", "quantize.")

# ``{arch}.`` keys every architecture reads: GGUF key suffix -> transformers config key.
COMMON_KEYS: dict[str, str] = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
}
# ``{arch}.`` keys read by the code below rather than copied.
HANDLED_KEYS = (
    "attention.value_length", "rope.dimension_count", "rope.scaling.type",
    "rope.scaling.factor", "rope.scaling.original_context_length",
    "rope.scaling.attn_factor", "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow",
    "rope.scaling.yarn_attn_factor", "rope.scaling.yarn_ext_factor", "rope.scale_linear",
    "expert_count", "expert_used_count",
)
# Per-layer tensor kinds of a mixture of experts that hold every expert's matrix in one
# [experts, rows, cols] tensor: their transformers name has ``{e}`` for the expert
# (``expert_names``), the checkpoints' own per-expert tensors.
EXPERT_PLACEHOLDER = "{e}"
# ``{arch}.`` keys that change nothing we compute, with the reason.
IGNORED_KEYS: dict[str, str] = {
    "rope.scaling.finetuned": "a note on training; llama.cpp computes nothing from it",
}

# Tensors outside the layers: GGUF name -> transformers name (None: read by the config).
GLOBAL_TENSORS: dict[str, str | None] = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": None,  # Llama 3's RoPE scaling: the config's freq_factors
    "rope_factors_long.weight": None,  # LongRoPE's factors (Phi-3)
    "rope_factors_short.weight": None,
}
CONFIG_TENSORS = tuple(k for k, v in GLOBAL_TENSORS.items() if v is None)

# Per-layer tensor kinds (``blk.N.<kind>.weight|bias``) -> transformers module name.
_LLAMA_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_QK_NORM = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
# Qwen3-MoE: the router (``ffn_gate_inp``, kept in float by llama-quantize) and the
# experts' gate, up and down matrices, stacked.
_QWEN3MOE_LAYER = {
    **{k: v for k, v in _LLAMA_LAYER.items() if not k.startswith(("ffn_gate", "ffn_up",
                                                                 "ffn_down"))},
    **_QK_NORM,
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.{e}.gate_proj",
    "ffn_up_exps": "mlp.experts.{e}.up_proj",
    "ffn_down_exps": "mlp.experts.{e}.down_proj",
}
# gpt-oss: q, k, v and o with biases, each head's sink logit, the pre-FFN norm under
# the name of a post-attention norm (its converter maps HF's post_attention_layernorm so:
# GPT_OSS has no FFN_NORM), a router with a bias, and stacked experts whose gate, up and
# down matrices and biases are stored apart.
_GPTOSS_LAYER = {
    **{k: v for k, v in _LLAMA_LAYER.items() if not k.startswith(("ffn_", ))},
    "post_attention_norm": "post_attention_layernorm",
    "attn_sinks": "self_attn.sinks",
    "ffn_gate_inp": "mlp.router",
    "ffn_gate_exps": "mlp.experts.{e}.gate_proj",
    "ffn_up_exps": "mlp.experts.{e}.up_proj",
    "ffn_down_exps": "mlp.experts.{e}.down_proj",
}
_GEMMA_LAYER = {
    **_LLAMA_LAYER,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# Phi-3: q, k and v in one matrix, gate and up in one (gate rows first), as transformers
# stores them.
_PHI3_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_up": "mlp.gate_up_proj",
    "ffn_down": "mlp.down_proj",
}

Config = dict[str, Any]


@dataclass(frozen=True)
class Arch:
    """One GGUF architecture."""

    model_type: str  # transformers' model_type of the config it becomes
    hf_class: str
    layer: Mapping[str, str]  # per-layer tensor kinds
    # llama.cpp's converter permutes the q/k rows of these archs for its interleaved
    # RoPE; we apply the inverse (rotate-half, transformers' layout).
    permute_qk: bool = False
    # Gemma's converter stores every norm weight as 1 + w; transformers stores w.
    norm_plus_one: bool = False
    keys: Mapping[str, str] = field(default_factory=dict)  # arch-specific: suffix -> HF key
    # Whether its layers are mixtures of experts (expert_count and expert_used_count are
    # refused in a file of any other architecture).
    moe: bool = False
    # The arch's own derivations, after the common keys: (config, metadata by suffix).
    finish: Callable[[Config, Mapping[str, Any]], None] | None = None

    def tensor_name(self, gguf_name: str) -> str | None:
        """The transformers name of a GGUF tensor; None for a tensor the config reads
        (``CONFIG_TENSORS``); KeyError for one this architecture does not have."""
        if gguf_name in GLOBAL_TENSORS:
            return GLOBAL_TENSORS[gguf_name]
        base, _, kind = gguf_name.rpartition(".")
        parts = base.split(".")
        if len(parts) != 3 or parts[0] != "blk" or not parts[1].isdigit() or kind not in (
                "weight", "bias") or parts[2] not in self.layer:
            raise KeyError(gguf_name)
        return f"model.layers.{parts[1]}.{self.layer[parts[2]]}.{kind}"


def expert_names(name: str, experts: int) -> list[str]:
    """The per-expert transformers names of a stacked expert tensor's name (one with
    ``EXPERT_PLACEHOLDER``)."""
    return [name.replace(EXPERT_PLACEHOLDER, str(e)) for e in range(experts)]


def _finish_qwen3moe(cfg: Config, meta: Mapping[str, Any]) -> None:
    if "moe_intermediate_size" not in cfg:
        raise ModelLoadError("qwen3moe file lacks qwen3moe.expert_feed_forward_length")
    # llama.cpp renormalises the chosen experts' weights of every qwen3moe file
    # (src/models/qwen3moe.cpp: build_moe_ffn(..., norm_w = true, ...)), and every layer
    # is sparse.
    cfg["norm_topk_prob"] = True
    cfg["decoder_sparse_step"] = 1
    cfg["mlp_only_layers"] = []


def _finish_gptoss(cfg: Config, meta: Mapping[str, Any]) -> None:
    size = int(cfg.pop("moe_intermediate_size", None) or cfg["intermediate_size"])
    if size != int(cfg["intermediate_size"]):
        raise ModelLoadError("gpt-oss file whose expert_feed_forward_length differs from its "
                             "feed_forward_length (GptOssConfig has one size)")
    cfg["attention_bias"] = True
    n = int(cfg["num_hidden_layers"])
    # Every other layer slides, from the first (llama.cpp's load_swa_pattern(2), and
    # GptOssConfig's default layer_types); the file states only the window.
    if cfg.get("sliding_window"):
        cfg["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention"
                              for i in range(n)]
    else:
        cfg["layer_types"] = ["full_attention"] * n
        cfg["sliding_window"] = None
    # No file states the clamped SwiGLU's constants: llama.cpp fixes them at gpt-oss's
    # (llama-graph.cpp: alpha 1.702, limit 7), which GptOssConfig's defaults are.
    cfg["swiglu_alpha"], cfg["swiglu_limit"] = 1.702, 7.0
    scaling = cfg.get("rope_scaling")
    if isinstance(scaling, dict) and scaling.get("rope_type") == "yarn":
        # The model's own maths departs from llama.cpp here: gpt-oss's YaRN correction
        # range is not rounded to whole dims (its config's truncate: false, the OpenAI
        # reference, and vLLM's and SGLang's fixes), where llama.cpp always rounds it.
        scaling["truncate"] = False
    elif scaling is None:
        cfg["rope_scaling"] = {"rope_type": "default"}


def _finish_gemma2(cfg: Config, meta: Mapping[str, Any]) -> None:
    cfg["hidden_activation"] = "gelu_pytorch_tanh"
    cfg.setdefault("rope_theta", 10000.0)  # (the converter writes no freq_base: its default)
    # llama.cpp's defaults where the file states no soft-cap (llama-hparams.h).
    cfg["attn_logit_softcapping"] = float(meta.get("attn_logit_softcapping", 50.0))
    cfg["final_logit_softcapping"] = float(meta.get("final_logit_softcapping", 30.0))
    cfg["query_pre_attn_scalar"] = _gemma_attention_scalar(cfg, big_layers=46)
    n = int(cfg["num_hidden_layers"])
    # Every other layer slides, from the first (llama.cpp's load_swa_pattern(2)).
    cfg["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention"
                          for i in range(n)]
    cfg["tie_word_embeddings"] = True  # (Gemma 2 files never hold an output matrix)


def _finish_gemma3(cfg: Config, meta: Mapping[str, Any]) -> None:
    cfg["hidden_activation"] = "gelu_pytorch_tanh"
    cfg["query_pre_attn_scalar"] = _gemma_attention_scalar(cfg, big_layers=62)
    n = int(cfg["num_hidden_layers"])
    window = cfg.get("sliding_window")
    # Five sliding layers, then a global one (llama.cpp's load_swa_pattern(6): the
    # converter writes no pattern); none slide where the file states no window.
    cfg["layer_types"] = ["sliding_attention" if window and (i + 1) % 6 else "full_attention"
                          for i in range(n)]
    full = cfg.pop("rope_scaling", None) or {"rope_type": "default"}
    cfg["rope_parameters"] = {
        "full_attention": {**full, "rope_theta": cfg.pop("rope_theta", 1e6)},
        # Sliding layers: their own base, never scaled (llama.cpp's freq_scale_swa is 1).
        "sliding_attention": {"rope_type": "default",
                              "rope_theta": float(meta.get("rope.freq_base_swa", 1e4))},
    }
    if meta.get("final_logit_softcapping"):
        cfg["final_logit_softcapping"] = float(meta["final_logit_softcapping"])


def _gemma_attention_scalar(cfg: Config, big_layers: int) -> float:
    """Gemma's query_pre_attn_scalar, which no file states: llama.cpp takes head_dim, but
    hidden / heads for the layer count of the 27B models (46 layers for Gemma 2, 62 for
    Gemma 3), which is what those checkpoints' configs say."""
    heads, hidden = int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
    if int(cfg["num_hidden_layers"]) == big_layers:
        return float(hidden // heads)
    return float(cfg.get("head_dim") or hidden // heads)


def _finish_phi3(cfg: Config, meta: Mapping[str, Any]) -> None:
    window = int(meta.get("attention.sliding_window", 0) or 0)
    # (llama.cpp disables Phi-3's window; transformers applies it to every layer.)
    cfg["sliding_window"] = window or None


def _finish_smollm3(cfg: Config, meta: Mapping[str, Any]) -> None:
    # No file states SmolLM3's layers without RoPE: llama.cpp fixes them at every 4th
    # (src/models/smollm3.cpp), the published models' no_rope_layer_interval.
    cfg["no_rope_layer_interval"] = 4


def _finish_granite(cfg: Config, meta: Mapping[str, Any]) -> None:
    if "logit_scale" not in meta:  # (llama.cpp refuses such a file too)
        raise ModelLoadError("granite file lacks granite.logit_scale")
    cfg["logits_scaling"] = float(meta["logit_scale"])
    cfg["embedding_multiplier"] = float(meta.get("embedding_scale", 1.0))
    cfg["residual_multiplier"] = float(meta.get("residual_scale", 1.0))
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // int(
        cfg["num_attention_heads"]))
    # A scale of 0 or none: llama.cpp's 1 / sqrt(head_dim).
    cfg["attention_multiplier"] = float(meta.get("attention.scale") or 1 / math.sqrt(head_dim))


ARCHS: dict[str, Arch] = {
    "llama": Arch("llama", "LlamaForCausalLM", _LLAMA_LAYER, permute_qk=True),
    "smollm3": Arch("smollm3", "SmolLM3ForCausalLM", _LLAMA_LAYER, permute_qk=True,
                    finish=_finish_smollm3),
    "granite": Arch("granite", "GraniteForCausalLM", _LLAMA_LAYER, permute_qk=True,
                    keys={"attention.scale": "", "embedding_scale": "", "residual_scale": "",
                          "logit_scale": ""}, finish=_finish_granite),
    "qwen2": Arch("qwen2", "Qwen2ForCausalLM", _LLAMA_LAYER),
    "qwen3": Arch("qwen3", "Qwen3ForCausalLM", {**_LLAMA_LAYER, **_QK_NORM}),
    "qwen3moe": Arch("qwen3_moe", "Qwen3MoeForCausalLM", _QWEN3MOE_LAYER, moe=True,
                     keys={"expert_count": "num_experts",
                           "expert_used_count": "num_experts_per_tok",
                           "expert_feed_forward_length": "moe_intermediate_size"},
                     finish=_finish_qwen3moe),
    "gpt-oss": Arch("gpt_oss", "GptOssForCausalLM", _GPTOSS_LAYER, moe=True,
                    keys={"expert_count": "num_local_experts",
                          "expert_used_count": "num_experts_per_tok",
                          "expert_feed_forward_length": "moe_intermediate_size",
                          "attention.sliding_window": "sliding_window"},
                    finish=_finish_gptoss),
    "phi3": Arch("phi3", "Phi3ForCausalLM", _PHI3_LAYER,
                 keys={"attention.sliding_window": ""}, finish=_finish_phi3),
    "gemma2": Arch("gemma2", "Gemma2ForCausalLM", _GEMMA_LAYER, norm_plus_one=True,
                   keys={"attention.sliding_window": "sliding_window",
                         "attn_logit_softcapping": "", "final_logit_softcapping": ""},
                   finish=_finish_gemma2),
    "gemma3": Arch("gemma3_text", "Gemma3ForCausalLM", {**_GEMMA_LAYER, **_QK_NORM},
                   norm_plus_one=True,
                   keys={"attention.sliding_window": "sliding_window",
                         "rope.freq_base_swa": "", "final_logit_softcapping": ""},
                   finish=_finish_gemma3),
}


def arch_of(meta: Mapping[str, Any], where: str = "") -> tuple[str, Arch]:
    """A file's ``general.architecture`` and its ``Arch``; refused unless we run it."""
    name = meta.get("general.architecture")
    at = f"{where}: " if where else ""
    if not isinstance(name, str):
        raise ModelLoadError(f"{at}GGUF file has no general.architecture")
    if name not in ARCHS:
        raise ModelLoadError(f"{at}unsupported model architecture {name!r} "
                             f"(supported: {', '.join(sorted(ARCHS))})")
    return name, ARCHS[name]


def _arch_keys(name: str, header: Header, where: str) -> dict[str, Any]:
    """The file's ``{arch}.`` metadata by suffix; any key outside the tables (or in
    another architecture's namespace) is refused."""
    arch = ARCHS[name]
    known = set(COMMON_KEYS) | set(HANDLED_KEYS) | set(IGNORED_KEYS) | set(arch.keys)
    out: dict[str, Any] = {}
    for key in [*header.metadata, *header.array_counts]:
        if key.startswith(INFORMATIONAL_PREFIXES):
            continue
        if key.startswith("split."):
            raise ModelLoadError(f"{where}: a split GGUF ({key}); merge it with "
                                 "llama-gguf-split --merge first")
        suffix = key[len(name) + 1:] if key.startswith(name + ".") else None
        if suffix is None or suffix not in known:
            raise ModelLoadError(f"{where} ({name}): unsupported metadata key {key!r}")
        if key in header.array_counts:
            raise ModelLoadError(f"{where} ({name}): metadata key {key!r} holds per-layer "
                                 "values, which we do not compute")
        out[suffix] = header.metadata[key]
    return out


def read_vector(path: Path, info: TensorInfo) -> list[float]:
    """A small float tensor's values (RoPE factors), read from the file."""
    dtypes = {GGMLType.F32: np.float32, GGMLType.F16: np.float16}
    dtype = dtypes.get(info.ggml_type) if isinstance(info.ggml_type, GGMLType) else None
    if dtype is None or len(info.shape) != 1:
        raise ModelLoadError(f"{path}: tensor {info.name} must be a float32 or float16 vector")
    arr = np.fromfile(path, dtype=dtype, count=info.shape[0], offset=info.offset)
    return [float(x) for x in arr.astype(np.float32)]


def hf_config(header: Header, path: Path | None = None) -> Config:
    """The transformers config of a GGUF file from its header (and, for RoPE factors
    stored as tensors, from the file at ``path``)."""
    where = str(path) if path is not None else "GGUF file"
    name, arch = arch_of(header.metadata, where)
    meta = _arch_keys(name, header, where)
    try:
        return _config(name, arch, meta, header, path, where)
    except ModelLoadError as e:
        if str(e).startswith(where):
            raise
        raise ModelLoadError(f"{where} ({name}): {e}") from None


def _config(name: str, arch: Arch, meta: Mapping[str, Any], header: Header,
            path: Path | None, where: str) -> Config:
    cfg: Config = {"model_type": arch.model_type, "architectures": [arch.hf_class]}
    for suffix, key in COMMON_KEYS.items():
        if suffix in meta:
            cfg[key] = meta[suffix]
    for suffix, key in arch.keys.items():
        if key and suffix in meta:
            cfg[key] = meta[suffix]
    for k in ("expert_count", "expert_used_count"):
        if int(meta.get(k, 0) or 0) and not arch.moe:
            raise ModelLoadError(f"a mixture of experts ({name}.{k} = {meta[k]}), which we "
                                 "do not run")
    tensors = {t.name: t for t in header.tensors}
    cfg["tie_word_embeddings"] = "output.weight" not in tensors
    if "vocab_size" not in cfg:
        if "tokenizer.ggml.tokens" not in header.array_counts:
            raise ModelLoadError("GGUF file has neither a vocab_size nor a token list")
        cfg["vocab_size"] = header.array_counts["tokenizer.ggml.tokens"]
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    value = meta.get("attention.value_length")
    if value is not None and int(value) != head_dim:
        raise ModelLoadError(f"value heads of {value} dims beside key heads of {head_dim}")
    rot = int(meta.get("rope.dimension_count") or head_dim)
    if rot != head_dim:
        if name != "phi3":
            raise ModelLoadError(f"RoPE over {rot} of {head_dim} dims (partial rotary) in a "
                                 f"{name} file")
        cfg["partial_rotary_factor"] = rot / head_dim
    scaling = _rope_scaling(meta, tensors, path, cfg)
    if scaling is not None:
        cfg["rope_scaling"] = scaling
    for k in ("bos_token_id", "eos_token_id", "padding_token_id"):
        v = header.metadata.get(f"tokenizer.ggml.{k}")
        if v is not None:
            cfg[k.replace("padding", "pad")] = int(v)
    if name == "qwen2":  # (Qwen2's q/k/v always carry biases in transformers)
        cfg["attention_bias"] = "blk.0.attn_q.bias" in tensors
    if name == "llama" and "blk.0.attn_q.bias" in tensors:
        cfg["attention_bias"] = True
    if arch.finish is not None:
        arch.finish(cfg, meta)
    return cfg


def _rope_scaling(meta: Mapping[str, Any], tensors: Mapping[str, TensorInfo],
                  path: Path | None, cfg: Config) -> dict[str, Any] | None:
    """The file's RoPE scaling as a transformers rope dict (None: plain RoPE)."""
    kind = meta.get("rope.scaling.type")
    factor = meta.get("rope.scaling.factor", meta.get("rope.scale_linear"))
    if kind is None and factor not in (None, 0, 0.0, 1, 1.0):
        kind = "linear"  # (llama.cpp reads a factor without a type as linear)
    orig = meta.get("rope.scaling.original_context_length")
    freqs = tensors.get("rope_freqs.weight")
    long_t, short_t = tensors.get("rope_factors_long.weight"), tensors.get(
        "rope_factors_short.weight")

    def vector(info: TensorInfo) -> list[float]:
        if path is None:
            raise ModelLoadError(f"{info.name} needs the file's data")
        return read_vector(path, info)

    if (long_t is None) != (short_t is None):
        raise ModelLoadError("LongRoPE needs both rope_factors_long and rope_factors_short")
    given = [x for x in (kind not in (None, "none") and kind, freqs is not None and
                         "rope_freqs", long_t is not None and "rope_factors") if x]
    if len(given) > 1 and not (kind == "longrope" and long_t is not None):
        raise ModelLoadError(f"RoPE scaling stated twice ({', '.join(map(str, given))})")
    if freqs is not None:
        return {"rope_type": "freq_factors", "freq_factors": vector(freqs)}
    if long_t is not None and short_t is not None:
        if orig is None:
            raise ModelLoadError("LongRoPE without rope.scaling.original_context_length")
        out: dict[str, Any] = {
            "rope_type": "longrope", "long_factor": vector(long_t),
            "short_factor": vector(short_t), "original_max_position_embeddings": int(orig)}
        if "rope.scaling.attn_factor" in meta:
            out["attention_factor"] = float(meta["rope.scaling.attn_factor"])
        cfg["original_max_position_embeddings"] = int(orig)
        return out
    if kind in (None, "none"):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor or 1.0)}
    if kind == "yarn":
        ext = meta.get("rope.scaling.yarn_ext_factor")
        if ext is not None and float(ext) not in (-1.0, 1.0):
            raise ModelLoadError(f"YaRN with extrapolation factor {ext}, which we do not "
                                 "compute")
        if orig is None or not factor:
            raise ModelLoadError("YaRN needs rope.scaling.factor and "
                                 "rope.scaling.original_context_length")
        out = {"rope_type": "yarn", "factor": float(factor),
               "original_max_position_embeddings": int(orig)}
        for suffix, key in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow"),
                            ("yarn_attn_factor", "attention_factor")):
            if f"rope.scaling.{suffix}" in meta:
                out[key] = float(meta[f"rope.scaling.{suffix}"])
        return out
    raise ModelLoadError(f"unsupported RoPE scaling type {kind!r}")
