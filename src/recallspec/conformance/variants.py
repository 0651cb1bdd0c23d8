"""The conformance suite's variants: tiny random checkpoints with the features of the
published configs people run.

Each variant is a transformers config at a tiny size (hidden 256, 2-6 layers) that keeps
every feature of the named published configs that changes what is computed: RoPE
scaling type and parameters, partial rotary, layers without RoPE, biases, q/k norms,
sandwich norms, soft-caps, sliding windows and their layer pattern, multipliers, tied or
untied heads, head_dim unlike hidden / heads. Lengths that matter for a feature are
scaled down with the size so that the checks reach them: every original context (the
length past which RoPE scaling acts) is 256 and every window 256-512, so the 600-token
sequence crosses both. Each ``config`` states only what differs from ``BASE`` and from
transformers' own defaults for that ``model_type``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from recallspec.errors import UnknownNameError

# The size every variant starts from.
BASE: Mapping[str, Any] = {
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
}
# Every variant's scaled original context (RoPE scaling acts past it) and the sequence
# the logit checks run over (past it, and past the windows below).
ORIGINAL_CONTEXT = 256
SEQ_LEN = 600

# LongRoPE's per-pair factors for the Phi-4-mini variant (48 pairs of a 96-dim rotary
# span): a short set near 1 and a long set rising from 1 to ~ the scale factor, the shape
# of the published lists (short_factor ~1.0-1.1, long_factor 1-~50), not their values.
_PHI_PAIRS = 48
_SHORT = [round(1.0 + 0.05 * (i / _PHI_PAIRS) ** 2, 6) for i in range(_PHI_PAIRS)]
_LONG = [round(1.0 + 31.0 * (i / (_PHI_PAIRS - 1)) ** 1.5, 6) for i in range(_PHI_PAIRS)]


@dataclass(frozen=True)
class Variant:
    name: str
    follows: str  # the published configs whose features it has
    model_type: str  # transformers' model_type
    config: Mapping[str, Any] = field(default_factory=dict)  # over BASE
    # "bpe": our default model's byte-level BPE tokenizer.json; "spm": a sentencepiece
    # model trained at build time (the converter reads only tokenizer.model for Gemma 2
    # and Phi-3; and for Qwen2, transformers 5.x replaces a tokenizer.json's own class
    # with Qwen2Tokenizer, whose regex the converter's pre-tokenizer hash does not know).
    tokenizer: str = "bpe"
    tokenizer_class: str = "PreTrainedTokenizerFast"
    # The family's chat template: a file of the llama.cpp source's models/templates/.
    template: str | None = None
    # Our KV cache's positions per sequence and llama.cpp's context in the checks.
    context: int = 1024
    # Matrices are scaled by this after transformers' init (std 0.02 -> 0.08) so the
    # activations and logits spread as a trained model's do; every 1-D tensor (norms,
    # biases) gets N(0, 0.2) noise so none is all ones or zeros and a misread one shows.
    scale: float = 4.0
    # Parameters (by name suffix) scaled further: gpt-oss's experts, so that its clamps
    # act (at the common scale no gate reaches the limit of 7).
    scales: Mapping[str, float] = field(default_factory=dict)
    # llama-quantize types the quantized checks run beside the common ones.
    extra_quants: tuple[str, ...] = ()
    seed: int = 0

    def hf_config(self, vocab_size: int, bos: int, eos: int, pad: int) -> dict[str, Any]:
        return {**BASE, "vocab_size": vocab_size, "bos_token_id": bos,
                "eos_token_id": eos, "pad_token_id": pad, **self.config}


_LLAMA3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": ORIGINAL_CONTEXT}

VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("llama3.2-tied", "Llama 3.2 1B/3B (llama3 RoPE, factor 32; tied head)", "llama",
            {"rope_theta": 500000.0, "rope_scaling": _LLAMA3, "tie_word_embeddings": True},
            template="meta-llama-Llama-3.2-3B-Instruct.jinja"),
    Variant("llama3.1-untied", "Llama 3.1 8B (llama3 RoPE, factor 8; untied head)", "llama",
            {"rope_theta": 500000.0, "rope_scaling": {**_LLAMA3, "factor": 8.0},
             "tie_word_embeddings": False, "num_key_value_heads": 1},
            template="meta-llama-Llama-3.1-8B-Instruct.jinja"),
    Variant("mistral-nemo", "Mistral 7B v0.3 / Nemo (no window; head_dim != hidden / heads)",
            "mistral", {"rope_theta": 1e6, "sliding_window": None, "num_attention_heads": 8,
                        "tie_word_embeddings": False},
            template="mistralai-Mistral-Nemo-Instruct-2407.jinja"),
    Variant("ministral-8b", "Ministral 8B (a window as long as the context)", "mistral",
            {"rope_theta": 1e8, "sliding_window": 4096, "tie_word_embeddings": False}),
    Variant("qwen2.5", "Qwen2.5 0.5-3B (q/k/v biases; tied head)", "qwen2",
            {"rope_theta": 1e6, "tie_word_embeddings": True}, tokenizer="spm",
            template="Qwen-Qwen2.5-7B-Instruct.jinja"),
    Variant("qwen2.5-yarn", "Qwen2.5 7B+ long context (YaRN factor 4)", "qwen2",
            {"rope_theta": 1e6, "tie_word_embeddings": False,
             "max_position_embeddings": 4 * ORIGINAL_CONTEXT,
             "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                              "original_max_position_embeddings": ORIGINAL_CONTEXT}},
            tokenizer="spm"),
    Variant("qwen3", "Qwen3 0.6-4B dense (q/k norms; head_dim != hidden / heads)", "qwen3",
            {"rope_theta": 1e6, "num_attention_heads": 8, "tie_word_embeddings": True},
            template="Qwen-Qwen3-0.6B.jinja"),
    Variant("qwen3-moe", "Qwen3-30B-A3B / 235B-A22B (128 experts, top-8 renormalised; here "
            "16 experts, top-4, every layer sparse; q/k norms; untied head)", "qwen3_moe",
            {"rope_theta": 1e6, "num_attention_heads": 8, "tie_word_embeddings": False,
             "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 256,
             "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []},
            template="Qwen-Qwen3-0.6B.jinja"),
    Variant("gpt-oss", "gpt-oss-20b / 120b (32 / 128 experts, top-4, router and expert biases, "
            "the clamped SwiGLU; attention sinks; window 128 on every other layer from the "
            "first; YaRN factor 32 untruncated; q/k/v/o biases; untied head; MXFP4 "
            "experts; here 16 experts, 4 layers)", "gpt_oss",
            {"num_hidden_layers": 4, "intermediate_size": 256, "num_local_experts": 16,
             "max_position_embeddings": 32 * ORIGINAL_CONTEXT,
             "num_experts_per_tok": 4, "sliding_window": 256, "tie_word_embeddings": False,
             "attention_bias": True,
             "rope_parameters": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                 "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0,
                                 "original_max_position_embeddings": ORIGINAL_CONTEXT}},
            template="openai-gpt-oss-120b.jinja",
            scale=2.0, scales={"mlp.experts.gate_up_proj": 4.0}, extra_quants=("MXFP4_MOE",)),
    Variant("gemma3-1b", "Gemma 3 1B (sliding window 512, 5 local : 1 global, q/k norms)",
            "gemma3_text",
            {"num_hidden_layers": 6, "num_key_value_heads": 1, "sliding_window": 512,
             "query_pre_attn_scalar": 64, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
             "tie_word_embeddings": True, "final_logit_softcapping": None,
             "hidden_activation": "gelu_pytorch_tanh"}),
    Variant("gemma3-4b", "Gemma 3 4B/12B/27B (linear RoPE factor 8 on global layers)",
            "gemma3_text",
            {"num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 4,
             "sliding_window": 256, "query_pre_attn_scalar": 64,
             "rope_parameters": {
                 "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                 "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
             "tie_word_embeddings": True, "final_logit_softcapping": None,
             "hidden_activation": "gelu_pytorch_tanh"}),
    Variant("gemma2-2b", "Gemma 2 2B/9B (attention and final soft-caps, alternating windows)",
            "gemma2",
            {"sliding_window": 256, "query_pre_attn_scalar": 64, "attn_logit_softcapping": 50.0,
             "final_logit_softcapping": 30.0, "tie_word_embeddings": True,
             "hidden_activation": "gelu_pytorch_tanh"},
            tokenizer="spm", template="google-gemma-2-2b-it.jinja"),
    Variant("phi4-mini", "Phi-4-mini (partial rotary 0.75, LongRoPE factor 32; tied head)",
            "phi3",
            {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128,
             "partial_rotary_factor": 0.75, "max_position_embeddings": 8192,
             "original_max_position_embeddings": ORIGINAL_CONTEXT,
             "rope_scaling": {"rope_type": "longrope", "short_factor": _SHORT,
                              "long_factor": _LONG},
             "rope_theta": 10000.0, "sliding_window": 16384, "tie_word_embeddings": True},
            tokenizer_class="GPT2Tokenizer"),
    Variant("phi3-mini-4k", "Phi-3-mini-4k (window 2047 in every layer; untied head)", "phi3",
            {"num_key_value_heads": 4, "sliding_window": 2047, "rope_theta": 10000.0,
             "tie_word_embeddings": False},
            tokenizer="spm", template="microsoft-Phi-3.5-mini-instruct.jinja"),
    Variant("smollm3-3b", "SmolLM3 3B (no RoPE in every 4th layer)", "smollm3",
            {"num_hidden_layers": 4, "num_key_value_heads": 1, "rope_theta": 5e6,
             "no_rope_layer_interval": 4, "tie_word_embeddings": True},
            template="HuggingFaceTB-SmolLM3-3B.jinja"),
    Variant("granite3-2b", "Granite 3.x 2B dense (embedding, attention, residual and logit "
            "multipliers)", "granite",
            {"embedding_multiplier": 12.0, "attention_multiplier": 0.015625,
             "residual_multiplier": 0.22, "logits_scaling": 8.0, "tie_word_embeddings": True},
            template="ibm-granite-granite-3.3-2B-Instruct.jinja"),
)}


def get_variant(name: str) -> Variant:
    v = VARIANTS.get(name)
    if v is None:
        raise UnknownNameError(f"unknown conformance variant {name!r} "
                               f"(known: {', '.join(VARIANTS)})")
    return v
