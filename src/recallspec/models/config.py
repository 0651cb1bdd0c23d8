"""Model hyper-parameters: one frozen dataclass for every supported decoder-only architecture.

Architectures differ only by switches (biases, q/k norms, sandwich norms, activation,
embedding scale, sliding windows), so one ``CausalLM`` implementation serves all of them.
``from_hf_dict`` reads a Hugging Face ``config.json`` (both the transformers 4.x keys and the
5.x ``rope_parameters`` form); GGUF metadata is first converted to that form by the GGUF loader.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from recallspec.errors import ModelLoadError

# HF ``model_type`` -> our architecture family. Module-level read-only registry.
ARCHITECTURES: dict[str, str] = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3_text": "gemma3",
    "gemma3": "gemma3",
}

ACTIVATIONS = ("silu", "gelu_tanh")
_ACT_NAMES = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


def unsupported_architecture(name: str) -> ModelLoadError:
    supported = ", ".join(sorted(ARCHITECTURES))
    return ModelLoadError(f"unsupported model architecture {name!r} (supported: {supported})")


@dataclass(frozen=True)
class ModelConfig:
    arch: str  # family: "llama" | "qwen2" | "qwen3" | "gemma3"
    model_type: str  # HF model_type it was read from (e.g. "mistral", "gemma3_text")
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float  # RoPE base of global-attention layers
    rope_local_theta: float  # RoPE base of sliding-window layers (== rope_theta if none differ)
    rms_norm_eps: float
    max_position: int
    tie_embeddings: bool = True
    attention_bias: bool = False  # Qwen2: biases on q/k/v projections
    qk_norm: bool = False  # Qwen3 / Gemma3: RMSNorm over head_dim on q and k
    norm_offset_one: bool = False  # Gemma: HF stores norm weights w, the scale is (1 + w)
    sandwich_norms: bool = False  # Gemma3: post-attention and pre/post-FFN norms
    embed_scale: float = 1.0  # Gemma: sqrt(hidden_size), applied in the weight dtype
    activation: str = "silu"
    sliding_window: int | None = None
    layer_windows: tuple[int | None, ...] = ()  # per layer: window or None (global)
    query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5 (else head_dim)
    final_logit_softcap: float | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ModelLoadError(f"unsupported activation {self.activation!r}")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"{self.num_heads} attention heads not a multiple of {self.num_kv_heads} kv heads"
            )
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise ModelLoadError("layer_windows must have one entry per layer")

    @property
    def attn_scale(self) -> float:
        base = self.query_pre_attn_scalar or self.head_dim
        return 1.0 / math.sqrt(base)

    def window(self, layer: int) -> int | None:
        return self.layer_windows[layer] if self.layer_windows else None

    def rope_base(self, layer: int) -> float:
        return self.rope_theta if self.window(layer) is None else self.rope_local_theta

    @property
    def windows(self) -> set[int]:
        return {w for w in self.layer_windows if w is not None}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelConfig:
        kw = dict(d)
        kw["layer_windows"] = tuple(kw.get("layer_windows", ()))
        kw["eos_token_ids"] = tuple(kw.get("eos_token_ids", ()))
        return cls(**kw)

    @classmethod
    def from_hf_dict(cls, hf: Mapping[str, Any]) -> ModelConfig:
        """Build from a Hugging Face ``config.json`` dictionary."""
        model_type = str(hf.get("model_type", ""))
        if model_type == "gemma3" and "text_config" in hf:
            return cls.from_hf_dict({"model_type": "gemma3_text", **hf["text_config"]})
        arch = ARCHITECTURES.get(model_type)
        if arch is None:
            raise unsupported_architecture(model_type or "<missing model_type>")
        try:
            return _from_hf(arch, model_type, hf)
        except KeyError as e:
            raise ModelLoadError(f"config.json for {model_type!r} lacks field {e}") from None


def _rope_theta(hf: Mapping[str, Any], layer_type: str, legacy: str, default: float) -> float:
    rp = hf.get("rope_parameters")
    if isinstance(rp, Mapping):
        sub = rp.get(layer_type, rp)  # per-layer-type dict (gemma3) or flat dict
        if isinstance(sub, Mapping) and "rope_theta" in sub:
            rope_type = sub.get("rope_type", "default")
            if rope_type not in ("default", None):
                raise ModelLoadError(f"unsupported RoPE scaling type {rope_type!r}")
            return float(sub["rope_theta"])
    scaling = hf.get("rope_scaling")
    if isinstance(scaling, Mapping) and layer_type == "full_attention":
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type != "default":
            raise ModelLoadError(f"unsupported RoPE scaling type {rope_type!r}")
    return float(hf.get(legacy, default))


def _eos_ids(hf: Mapping[str, Any]) -> tuple[int, ...]:
    eos = hf.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(int(e) for e in eos) if isinstance(eos, list) else (int(eos),)


def _from_hf(arch: str, model_type: str, hf: Mapping[str, Any]) -> ModelConfig:
    hidden = int(hf["hidden_size"])
    heads = int(hf["num_attention_heads"])
    layers = int(hf["num_hidden_layers"])
    head_dim = int(hf.get("head_dim") or hidden // heads)
    gemma = arch == "gemma3"
    window = hf.get("sliding_window")
    layer_types = hf.get("layer_types")
    if gemma and layer_types is None:
        pattern = int(hf.get("sliding_window_pattern", 6))
        layer_types = [
            "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
        ]
    windows: tuple[int | None, ...] = ()
    if layer_types is not None and window:
        windows = tuple(int(window) if t == "sliding_attention" else None for t in layer_types)
    elif window and (model_type == "mistral" or hf.get("use_sliding_window")):
        windows = (int(window),) * layers
    if windows and all(w is None for w in windows):
        windows = ()
    theta = _rope_theta(hf, "full_attention", "rope_theta", 1e6 if gemma else 1e4)
    local = _rope_theta(hf, "sliding_attention", "rope_local_base_freq", 1e4) if gemma else theta
    act = str(hf.get("hidden_activation") or hf.get("hidden_act") or "silu")
    activation = _ACT_NAMES.get(act)
    if activation is None:
        raise ModelLoadError(f"unsupported activation {act!r}")
    return ModelConfig(
        arch=arch,
        model_type=model_type,
        vocab_size=int(hf["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        rope_theta=theta,
        rope_local_theta=local,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_position=int(hf.get("max_position_embeddings", 8192)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        attention_bias=bool(hf.get("attention_bias", arch == "qwen2")),
        qk_norm=arch in ("qwen3", "gemma3"),
        norm_offset_one=gemma,
        sandwich_norms=gemma,
        embed_scale=math.sqrt(hidden) if gemma else 1.0,
        activation=activation,
        sliding_window=int(window) if windows and window else None,
        layer_windows=windows,
        query_pre_attn_scalar=(
            float(hf.get("query_pre_attn_scalar", 256)) if gemma else None
        ),
        final_logit_softcap=(
            float(hf["final_logit_softcapping"]) if hf.get("final_logit_softcapping") else None
        ),
        bos_token_id=None if hf.get("bos_token_id") is None else int(hf["bos_token_id"]),
        eos_token_ids=_eos_ids(hf),
    )
