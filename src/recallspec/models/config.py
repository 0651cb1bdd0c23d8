"""Model hyper-parameters: one frozen dataclass for every supported decoder-only architecture.

Architectures differ only by switches (biases, q/k norms, sandwich norms, activation,
embedding, residual and logit scales, soft-caps, sliding windows, RoPE variants, layers
without RoPE, a mixture of experts in place of the MLP), so one ``CausalLM``
implementation serves all of them.
``from_hf_dict`` reads a Hugging Face ``config.json`` (both the transformers 4.x keys and
the 5.x ``rope_parameters`` / ``layer_types`` form, with each architecture's defaults
where a key is absent, as its transformers configuration class sets them); GGUF metadata
is first converted to that form by the GGUF loader (``models/gguf/convert.py``).

A feature this does not compute (a RoPE scaling type, a layer type, an MLP bias, ...) is
a ``ModelLoadError`` naming it, never ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from recallspec.errors import ModelLoadError

# HF ``model_type`` -> our architecture family. Module-level read-only registry.
ARCHITECTURES: dict[str, str] = {
    "llama": "llama",
    "mistral": "llama",
    "smollm3": "llama",
    "granite": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3",
    "phi3": "phi3",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
    "gemma3": "gemma3",
    "gpt_oss": "gpt_oss",
}
GEMMA = ("gemma2", "gemma3")

# The activations' one list (models/native.py maps those the C++ forward computes).
# "swiglu_oai": gpt-oss's clamped gate, min(g, L) * sigmoid(alpha * min(g, L)) *
# (clamp(u, -L, L) + 1) (``ModelConfig.swiglu_alpha`` / ``swiglu_limit``).
ACTIVATIONS = ("silu", "gelu_tanh", "swiglu_oai")
_ACT_NAMES = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}

# RoPE variants (``RopeSpec.type``): the transformers ``rope_type`` names we compute
# (models/rope.py, in transformers' own float steps), plus "freq_factors": a GGUF's
# precomputed divisors of the frequencies (llama.cpp's ``rope_freqs`` tensor, how its
# converter stores Llama 3's scaling).
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "freq_factors")
_ROPE_ALIASES = {"su": "longrope"}  # Phi-3's first configs
LAYER_TYPES = ("full_attention", "sliding_attention")


def unsupported_architecture(name: str, where: str = "") -> ModelLoadError:
    supported = ", ".join(sorted(ARCHITECTURES))
    at = f"{where}: " if where else ""
    return ModelLoadError(f"{at}unsupported model architecture {name!r} (supported: {supported})")


@dataclass(frozen=True)
class RopeSpec:
    """The rotary embedding of one kind of layer, as transformers' ``rope_parameters``
    state it (models/rope.py computes the frequencies). Fields a type does not use stay
    None; ``__post_init__`` checks that a type has what it needs."""

    theta: float
    type: str = "default"
    factor: float | None = None  # linear, llama3, yarn, longrope (resolved where defaulted)
    original_context: int | None = None  # llama3, yarn, longrope
    low_freq_factor: float | None = None  # llama3
    high_freq_factor: float | None = None  # llama3
    beta_fast: float | None = None  # yarn (None: 32)
    beta_slow: float | None = None  # yarn (None: 1)
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool = True  # yarn: correction range rounded to whole dims
    attention_factor: float | None = None  # yarn, longrope: cos/sin scale (None: the default)
    short_factor: tuple[float, ...] = ()  # longrope
    long_factor: tuple[float, ...] = ()  # longrope
    freq_factors: tuple[float, ...] = ()  # freq_factors

    def __post_init__(self) -> None:
        t = self.type
        if t not in ROPE_TYPES:
            raise ModelLoadError(f"unsupported RoPE scaling type {t!r} "
                                 f"(supported: {', '.join(ROPE_TYPES)})")
        if not self.theta > 0:
            raise ModelLoadError(f"RoPE base must be positive, got {self.theta}")
        need: dict[str, tuple[str, ...]] = {
            "linear": ("factor",), "llama3": ("factor", "original_context", "low_freq_factor",
                                              "high_freq_factor"),
            "yarn": ("factor", "original_context"),
            "longrope": ("original_context", "short_factor", "long_factor"),
            "freq_factors": ("freq_factors",),
        }
        missing = [f for f in need.get(t, ()) if getattr(self, f) in (None, ())]
        if missing:
            raise ModelLoadError(f"RoPE scaling {t!r} lacks {', '.join(missing)}")
        if t == "llama3" and self.low_freq_factor == self.high_freq_factor:
            raise ModelLoadError("llama3 RoPE scaling needs low_freq_factor != high_freq_factor")

    @property
    def scaled(self) -> bool:
        return self.type != "default"

    def pairs_needed(self) -> int | None:
        """The number of frequency pairs a per-pair list states (None: no list)."""
        lists = [x for x in (self.short_factor, self.long_factor, self.freq_factors) if x]
        if not lists:
            return None
        if len({len(x) for x in lists}) > 1:
            raise ModelLoadError("RoPE factor lists of different lengths")
        return len(lists[0])

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RopeSpec:
        kw = dict(d)
        for k in ("short_factor", "long_factor", "freq_factors"):
            kw[k] = tuple(float(x) for x in kw.get(k, ()))
        return cls(**kw)


@dataclass(frozen=True)
class ModelConfig:
    arch: str  # family: "llama" | "qwen2" | "qwen3" | "phi3" | "gemma2" | "gemma3" | "gpt_oss"
    # (Qwen3-MoE is the qwen3 family with experts: the switches below.)
    model_type: str  # HF model_type it was read from (e.g. "mistral", "gemma3_text")
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope: RopeSpec  # RoPE of global-attention layers (and of every layer unless rope_local)
    rms_norm_eps: float
    max_position: int
    # RoPE of sliding-window layers where it differs (Gemma 3: base 10k, no scaling).
    rope_local: RopeSpec | None = None
    rotary_dim: int = 0  # dims of a head that rotate (partial rotary: Phi-4-mini); 0 = all
    nope_layers: tuple[int, ...] = ()  # layers without RoPE (SmolLM3's every 4th)
    tie_embeddings: bool = True
    attention_bias: bool = False  # Qwen2: biases on q/k/v projections
    qk_norm: bool = False  # Qwen3 / Gemma3: RMSNorm over head_dim on q and k
    norm_offset_one: bool = False  # Gemma: HF stores norm weights w, the scale is (1 + w)
    sandwich_norms: bool = False  # Gemma 2/3: post-attention and pre/post-FFN norms
    embed_scale: float = 1.0  # Gemma: sqrt(hidden_size) in the weight dtype; Granite's multiplier
    # Granite: the residual branch's multiplier (h + m * out) and the divisor of the logits.
    residual_scale: float = 1.0
    logit_divisor: float = 1.0
    activation: str = "silu"
    sliding_window: int | None = None
    layer_windows: tuple[int | None, ...] = ()  # per layer: window or None (global)
    query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5 (else head_dim)
    attention_multiplier: float | None = None  # Granite: the attention scale itself
    attn_logit_softcap: float | None = None  # Gemma 2: scores = tanh(s / cap) * cap
    final_logit_softcap: float | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # A mixture of experts in every layer's place of the MLP (0 experts: a dense MLP of
    # intermediate_size). Each row's router logits pick its experts_per_token largest
    # (ties: the lower index); their softmax weights, over the chosen ones only when
    # norm_topk_prob (Qwen3-MoE: the top-k renormalised, which is that), else over all,
    # weight the chosen experts' gated MLPs of expert_intermediate_size.
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    # gpt-oss: a learned logit per attention head that joins each softmax's denominator
    # (the "sink": it takes probability mass and adds no value), and biases on the
    # router's logits and on every expert's gate, up and down products.
    attention_sinks: bool = False
    expert_bias: bool = False
    # The "swiglu_oai" activation's slope and clamp (gpt-oss: 1.702, 7).
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    # Where the config was read (a file path), for error messages only.
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        at = f"{self.source}: " if self.source else ""
        if self.activation not in ACTIVATIONS:
            raise ModelLoadError(f"{at}unsupported activation {self.activation!r}")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"{at}{self.num_heads} attention heads not a multiple of {self.num_kv_heads} "
                "kv heads")
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise ModelLoadError(f"{at}layer_windows must have one entry per layer")
        rd = self.rotary_dims
        if rd % 2 or not 0 < rd <= self.head_dim:
            raise ModelLoadError(f"{at}rotary dims {rd} must be even and within head_dim "
                                 f"{self.head_dim}")
        for spec in (self.rope, self.rope_local):
            pairs = None if spec is None else spec.pairs_needed()
            if pairs is not None and pairs != rd // 2:
                raise ModelLoadError(f"{at}RoPE {spec.type} lists {pairs} factors for "  # type: ignore[union-attr]
                                     f"{rd // 2} frequency pairs")
        if any(not 0 <= i < self.num_layers for i in self.nope_layers):
            raise ModelLoadError(f"{at}nope_layers outside the {self.num_layers} layers")
        for name in ("embed_scale", "residual_scale", "logit_divisor"):
            if not math.isfinite(getattr(self, name)) or getattr(self, name) == 0:
                raise ModelLoadError(f"{at}{name} must be finite and non-zero")
        for name in ("attn_logit_softcap", "final_logit_softcap"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ModelLoadError(f"{at}{name} must be positive, got {v}")
        if self.num_experts and not (
                0 < self.experts_per_token <= self.num_experts
                and self.expert_intermediate_size > 0):
            raise ModelLoadError(
                f"{at}a mixture of {self.num_experts} experts needs 0 < experts per token "
                f"({self.experts_per_token}) <= experts and an expert intermediate size "
                f"({self.expert_intermediate_size})")
        if not self.num_experts and (self.experts_per_token or self.expert_intermediate_size):
            raise ModelLoadError(f"{at}experts per token or an expert size without experts")
        if self.expert_bias and not self.num_experts:
            raise ModelLoadError(f"{at}expert biases without experts")
        if self.activation == "swiglu_oai" and not (
                self.swiglu_limit > 0 and math.isfinite(self.swiglu_alpha)):
            raise ModelLoadError(f"{at}swiglu_oai needs a positive limit and a finite slope, "
                                 f"got limit {self.swiglu_limit}, alpha {self.swiglu_alpha}")

    @property
    def moe(self) -> bool:
        """Whether the layers' MLPs are mixtures of experts."""
        return self.num_experts > 0

    @property
    def mlp_size(self) -> int:
        """The intermediate size of one layer's (or one expert's) gated MLP."""
        return self.expert_intermediate_size if self.moe else self.intermediate_size

    @property
    def rotary_dims(self) -> int:
        return self.rotary_dim or self.head_dim

    @property
    def attn_scale(self) -> float:
        if self.attention_multiplier is not None:
            return self.attention_multiplier
        base = self.query_pre_attn_scalar or self.head_dim
        return 1.0 / math.sqrt(base)

    def window(self, layer: int) -> int | None:
        return self.layer_windows[layer] if self.layer_windows else None

    def layer_rope(self, layer: int) -> RopeSpec | None:
        """The RoPE of a layer; None for a layer without (NoPE)."""
        if layer in self.nope_layers:
            return None
        if self.rope_local is not None and self.window(layer) is not None:
            return self.rope_local
        return self.rope

    @property
    def windows(self) -> set[int]:
        return {w for w in self.layer_windows if w is not None}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelConfig:
        kw = {k: v for k, v in d.items() if k in {f.name for f in fields(cls)}}
        kw["rope"] = RopeSpec.from_dict(kw["rope"])
        if kw.get("rope_local") is not None:
            kw["rope_local"] = RopeSpec.from_dict(kw["rope_local"])
        for k in ("layer_windows", "eos_token_ids", "nope_layers"):
            kw[k] = tuple(kw.get(k, ()))
        return cls(**kw)

    @classmethod
    def from_hf_dict(cls, hf: Mapping[str, Any], source: str = "") -> ModelConfig:
        """Build from a Hugging Face ``config.json`` dictionary (``source``: its path, named
        in errors)."""
        model_type = str(hf.get("model_type", ""))
        if model_type == "gemma3" and "text_config" in hf:
            return cls.from_hf_dict({"model_type": "gemma3_text", **hf["text_config"]}, source)
        arch = ARCHITECTURES.get(model_type)
        if arch is None:
            raise unsupported_architecture(model_type or "<missing model_type>", source)
        try:
            return _from_hf(arch, model_type, hf, source)
        except KeyError as e:
            at = f"{source}: " if source else ""
            raise ModelLoadError(f"{at}config.json for {model_type!r} lacks field {e}") from None
        except ModelLoadError as e:
            if source and not str(e).startswith(source):
                raise ModelLoadError(f"{source} ({model_type}): {e}") from None
            raise


# ---- reading a transformers config ---------------------------------------------------


def _rope_dicts(hf: Mapping[str, Any], gemma3: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """(full-attention, sliding-attention) rope parameter dicts as transformers 5.x
    standardizes them (``standardize_rope_params``): the nested per-layer-type form, the
    flat form, or 4.x's ``rope_scaling`` + ``rope_theta`` keys."""
    rp = hf.get("rope_parameters")
    if not isinstance(rp, Mapping):
        rp = hf.get("rope_scaling")
    rp = dict(rp) if isinstance(rp, Mapping) else {}
    if "full_attention" in rp or "sliding_attention" in rp:
        full = dict(rp.get("full_attention") or {})
        local = dict(rp.get("sliding_attention") or {})
    else:
        full, local = rp, {}
    theta_default = 1e6 if gemma3 else 1e4
    if hf.get("model_type") == "gpt_oss":
        theta_default = 150000.0
        if not rp:  # (GptOssConfig's default: YaRN over the 4k pretraining context)
            full = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                    "truncate": False, "original_max_position_embeddings": 4096}
    full.setdefault("rope_theta", hf.get("rope_theta", theta_default))
    if gemma3:
        local.setdefault("rope_theta", hf.get("rope_local_base_freq", 1e4))
    if "partial_rotary_factor" in hf:
        full.setdefault("partial_rotary_factor", hf["partial_rotary_factor"])
    return full, local


def _rope_spec(p: Mapping[str, Any], hf: Mapping[str, Any]) -> RopeSpec:
    """One rope parameter dict -> RopeSpec, with transformers' defaults resolved."""
    kind = str(p.get("rope_type", p.get("type", "default")) or "default")
    kind = _ROPE_ALIASES.get(kind, kind)
    if hf.get("model_type") == "phi3" and kind == "yarn":
        kind = "longrope"  # (Phi3Config renames a "yarn" type so: its lists are LongRoPE's)
    if kind == "dynamic":
        raise ModelLoadError(
            "unsupported RoPE scaling type 'dynamic' (dynamic NTK: its frequencies change "
            "with the sequence's length, so a position's keys would depend on later tokens)")
    if kind not in ROPE_TYPES or (kind == "freq_factors" and "freq_factors" not in p):
        raise ModelLoadError(f"unsupported RoPE scaling type {kind!r} "
                             f"(supported: {', '.join(ROPE_TYPES[:-1])})")
    theta = float(p["rope_theta"])
    if kind == "default":
        return RopeSpec(theta=theta)
    max_pos = int(hf.get("max_position_embeddings", 0) or 0)
    # Phi-3 keeps the pretraining length outside rope_parameters, and transformers gives
    # that one priority; the rest fall back to max_position_embeddings.
    orig = (hf.get("original_max_position_embeddings")
            or p.get("original_max_position_embeddings") or max_pos or None)
    factor = p.get("factor")
    if factor is None and kind in ("yarn", "longrope") and orig:
        factor = max_pos / int(orig)
    return RopeSpec(
        theta=theta, type=kind, factor=None if factor is None else float(factor),
        original_context=None if orig is None else int(orig),
        low_freq_factor=_opt_float(p.get("low_freq_factor")),
        high_freq_factor=_opt_float(p.get("high_freq_factor")),
        beta_fast=_opt_float(p.get("beta_fast")), beta_slow=_opt_float(p.get("beta_slow")),
        mscale=_opt_float(p.get("mscale")), mscale_all_dim=_opt_float(p.get("mscale_all_dim")),
        truncate=bool(p.get("truncate", True)),
        attention_factor=_opt_float(p.get("attention_factor", p.get("attn_factor"))),
        short_factor=tuple(float(x) for x in p.get("short_factor") or ()),
        long_factor=tuple(float(x) for x in p.get("long_factor") or ()),
        freq_factors=tuple(float(x) for x in p.get("freq_factors") or ()),
    )


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _eos_ids(hf: Mapping[str, Any]) -> tuple[int, ...]:
    eos = hf.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(int(e) for e in eos) if isinstance(eos, list) else (int(eos),)


def _default_layer_types(model_type: str, hf: Mapping[str, Any], layers: int,
                         window: int | None, nope: Sequence[int]) -> list[str]:
    """Each layer's attention type where config.json does not list ``layer_types``: the
    rule of that architecture's transformers configuration class."""
    sliding, full = "sliding_attention", "full_attention"
    if model_type in ("gemma3_text", "gemma3"):
        pattern = int(hf.get("sliding_window_pattern", 6))
        return [sliding if (i + 1) % pattern else full for i in range(layers)]
    if model_type in ("gemma2", "gpt_oss"):
        return [sliding if (i + 1) % 2 else full for i in range(layers)]
    if window is None:
        return [full] * layers
    if model_type in ("mistral", "phi3"):
        return [sliding] * layers
    if model_type == "qwen2" and hf.get("use_sliding_window"):
        first = int(hf.get("max_window_layers", layers))
        return [sliding if i >= first else full for i in range(layers)]
    if model_type == "smollm3" and hf.get("use_sliding_window"):
        return [sliding if i in nope else full for i in range(layers)]
    return [full] * layers


def _nope_layers(model_type: str, hf: Mapping[str, Any], layers: int) -> tuple[int, ...]:
    """SmolLM3's layers without RoPE: ``no_rope_layers[i]`` is 1 where layer i uses RoPE
    and 0 where it does not (default: every ``no_rope_layer_interval``-th layer, 4)."""
    if model_type != "smollm3":
        return ()
    flags = hf.get("no_rope_layers")
    if flags is None:
        interval = int(hf.get("no_rope_layer_interval", 4))
        flags = [int((i + 1) % interval != 0) for i in range(layers)]
    if len(flags) != layers:
        raise ModelLoadError(f"no_rope_layers has {len(flags)} entries for {layers} layers")
    return tuple(i for i, f in enumerate(flags) if not int(f))


def _from_hf(arch: str, model_type: str, hf: Mapping[str, Any], source: str) -> ModelConfig:
    hidden = int(hf["hidden_size"])
    heads = int(hf["num_attention_heads"])
    layers = int(hf["num_hidden_layers"])
    head_dim = int(hf.get("head_dim") or hidden // heads)
    gemma = arch in GEMMA
    for flag in ("mlp_bias",):
        if hf.get(flag):
            raise ModelLoadError(f"unsupported feature {flag}=true")
    if hf.get("use_bidirectional_attention"):
        raise ModelLoadError("unsupported feature use_bidirectional_attention=true")
    experts = _experts(model_type, hf)
    raw_window = hf.get("sliding_window", 128 if model_type == "gpt_oss" else None)
    if model_type in ("qwen2", "smollm3") and not hf.get("use_sliding_window"):
        raw_window = None
    window = int(raw_window) if raw_window else None
    nope = _nope_layers(model_type, hf, layers)
    layer_types = hf.get("layer_types") or _default_layer_types(model_type, hf, layers,
                                                                 window, nope)
    unknown = sorted({str(t) for t in layer_types} - set(LAYER_TYPES))
    if unknown:
        raise ModelLoadError(f"unsupported layer types {', '.join(unknown)}")
    if len(layer_types) != layers:
        raise ModelLoadError(f"layer_types has {len(layer_types)} entries for {layers} layers")
    windows: tuple[int | None, ...] = ()
    if window and "sliding_attention" in layer_types:
        windows = tuple(window if t == "sliding_attention" else None for t in layer_types)
    full_p, local_p = _rope_dicts(hf, arch == "gemma3")
    partial = float(full_p.get("partial_rotary_factor", 1.0))
    if partial != 1.0 and arch != "phi3":
        # (transformers' own default RoPE of these models ignores it while its scaled
        # ones honour it: no one computation to follow.)
        raise ModelLoadError(f"unsupported feature partial_rotary_factor={partial} in a "
                             f"{model_type} config")
    rotary = int(head_dim * partial)
    rope = _rope_spec(full_p, hf)
    rope_local = _rope_spec(local_p, hf) if arch == "gemma3" else None
    act = str(hf.get("hidden_activation") or hf.get("hidden_act") or "silu")
    activation = _ACT_NAMES.get(act)
    if activation is None:
        raise ModelLoadError(f"unsupported activation {act!r}")
    gpt_oss = model_type == "gpt_oss"
    if gpt_oss:  # (its hidden_act says "silu"; GptOssExperts computes the clamped gate)
        activation = "swiglu_oai"
    granite = model_type == "granite"
    embed_scale = (math.sqrt(hidden) if gemma
                   else float(hf.get("embedding_multiplier", 1.0)) if granite else 1.0)
    softcap = hf.get("final_logit_softcapping") if gemma else None
    attn_softcap = hf.get("attn_logit_softcapping") if arch == "gemma2" else None
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
        rope=rope,
        rope_local=rope_local,
        rotary_dim=0 if rotary == head_dim else rotary,
        nope_layers=nope,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_position=int(hf.get("max_position_embeddings", 8192)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        attention_bias=bool(hf.get("attention_bias", arch in ("qwen2", "gpt_oss"))),
        qk_norm=arch in ("qwen3", "gemma3"),
        norm_offset_one=gemma,
        sandwich_norms=gemma,
        embed_scale=embed_scale,
        residual_scale=float(hf.get("residual_multiplier", 1.0)) if granite else 1.0,
        logit_divisor=float(hf.get("logits_scaling", 1.0)) if granite else 1.0,
        activation=activation,
        sliding_window=window if windows else None,
        layer_windows=windows,
        query_pre_attn_scalar=(
            float(hf.get("query_pre_attn_scalar", 256)) if gemma else None
        ),
        attention_multiplier=float(hf.get("attention_multiplier", 1.0)) if granite else None,
        attn_logit_softcap=float(attn_softcap) if attn_softcap else None,
        final_logit_softcap=float(softcap) if softcap else None,
        bos_token_id=None if hf.get("bos_token_id") is None else int(hf["bos_token_id"]),
        eos_token_ids=_eos_ids(hf),
        **experts,
        attention_sinks=gpt_oss,
        expert_bias=gpt_oss,
        swiglu_alpha=float(hf.get("swiglu_alpha", 1.702)) if gpt_oss else 1.702,
        swiglu_limit=float(hf.get("swiglu_limit", 7.0)) if gpt_oss else 7.0,
        source=source,
    )


def _experts(model_type: str, hf: Mapping[str, Any]) -> dict[str, Any]:
    """A Qwen3-MoE or gpt-oss config's experts as ``ModelConfig`` fields ({} for a dense
    model). Every layer must be sparse (the published ones are: ``decoder_sparse_step`` 1,
    no ``mlp_only_layers``); a dense layer among them is refused, not computed as sparse."""
    if model_type == "gpt_oss":
        # (GptOssTopKRouter: top-k of the raw logits, then a softmax over those k, which
        # is the renormalised top-k softmax; every expert of intermediate_size.)
        return {"num_experts": int(hf.get("num_local_experts") or hf["num_experts"]),
                "experts_per_token": int(hf["num_experts_per_tok"]),
                "expert_intermediate_size": int(hf["intermediate_size"]),
                "norm_topk_prob": True}
    if model_type != "qwen3_moe":
        for key in ("num_experts", "num_local_experts", "num_experts_per_tok"):
            if hf.get(key):
                raise ModelLoadError(f"a mixture of experts ({key}={hf[key]}) in a "
                                     f"{model_type} config, which we do not run")
        return {}
    step = int(hf.get("decoder_sparse_step", 1) or 1)
    dense = [int(i) for i in hf.get("mlp_only_layers") or []]
    if step != 1 or dense:
        raise ModelLoadError(
            f"dense MLP layers among the experts (decoder_sparse_step={step}, "
            f"mlp_only_layers={dense}), which we do not run")
    if hf.get("shared_expert_intermediate_size"):
        raise ModelLoadError("a shared expert, which qwen3_moe does not have")
    return {
        "num_experts": int(hf.get("num_experts") or hf["num_local_experts"]),
        "experts_per_token": int(hf["num_experts_per_tok"]),
        "expert_intermediate_size": int(hf["moe_intermediate_size"]),
        # (Qwen3MoeConfig's default is false; the published configs state true.)
        "norm_topk_prob": bool(hf.get("norm_topk_prob", False)),
    }
