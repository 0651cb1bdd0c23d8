"""Convert a GGUF file into a cached model directory: HF-style ``config.json``,
``tokenizer.json`` and ``tokenizer_config.json``, and float32 dequantized weights already in
our internal layout (``recallspec.safetensors``: fused QKV / gate-up, effective norm scales),
so that a cached load is a memory map.

Tensors are first mapped to HF names and conventions (shared with HF directories through
``loader.internal_weights``), undoing two llama.cpp conventions exactly as transformers' own
GGUF import does (the tests check tensor equality against it):
  * llama.cpp permutes the Q/K rows of llama-arch models for its interleaved RoPE; we apply
    the inverse permutation so rotate-half RoPE is correct;
  * llama.cpp stores Gemma norm weights as ``1 + w``; HF stores ``w``, so we subtract 1.
The tokenizer is converted once (``gguf_tokenizer``: as transformers' GGUF converter does,
byte-level BPE vocabularies without importing it), fed from our own header reader
(``gguf_header``: the vocabulary and merges decoded in one pass, where gguf's and
transformers' readers take seconds); later loads use the saved ``tokenizer.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recallspec.errors import ModelLoadError
from recallspec.models.config import ARCHITECTURES, unsupported_architecture
from recallspec.models.gguf_header import Header, read_header
from recallspec.models.gguf_tokenizer import tokenizer_arrays, tokenizer_files

GGUF_MAGIC = b"GGUF"

# GGUF arch -> HF model_type.
_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}

# GGUF metadata key suffix -> HF config key.
_META_KEYS = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "attention.sliding_window": "sliding_window",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
}

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


def check_magic(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == GGUF_MAGIC


def open_reader(path: Path) -> Any:
    import gguf

    if not check_magic(path):
        raise ModelLoadError(f"{path} is not a GGUF file (bad magic)")
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # numpy/struct errors on truncated or corrupt files
        raise ModelLoadError(f"{path}: corrupt or truncated GGUF file ({e})") from None


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def gguf_architecture(reader: Any) -> str:
    return check_architecture(_field(reader, "general.architecture"))


def check_architecture(arch: object) -> str:
    """A GGUF's ``general.architecture`` value, refused unless we run it."""
    if not isinstance(arch, str):
        raise ModelLoadError("GGUF file has no general.architecture")
    if arch not in _MODEL_TYPES:
        supported = sorted(set(_MODEL_TYPES) | set(ARCHITECTURES))
        raise ModelLoadError(
            f"unsupported model architecture {arch!r} (supported: {', '.join(supported)})"
        )
    return arch


def hf_config_from_gguf(header: Header) -> dict[str, Any]:
    """The HF config of a GGUF from its header (``gguf_header.read_header``)."""
    meta = header.metadata
    arch = check_architecture(meta.get("general.architecture"))
    cfg: dict[str, Any] = {"model_type": _MODEL_TYPES[arch], "architectures": []}
    for suffix, key in _META_KEYS.items():
        v = meta.get(f"{arch}.{suffix}")
        if v is not None:
            cfg[key] = v
    names = {t.name for t in header.tensors}
    cfg["tie_word_embeddings"] = "output.weight" not in names
    if "vocab_size" not in cfg:
        if "tokenizer.ggml.tokens" not in header.array_counts:
            raise ModelLoadError("GGUF file has neither a vocab_size nor a token list")
        cfg["vocab_size"] = header.array_counts["tokenizer.ggml.tokens"]
    if meta.get(f"{arch}.rope.scaling.type") not in (None, "none"):
        raise ModelLoadError("GGUF uses RoPE scaling, which is not supported")
    for k in ("bos_token_id", "eos_token_id", "padding_token_id"):
        v = meta.get(f"tokenizer.ggml.{k}")
        if v is not None:
            cfg[k.replace("padding", "pad")] = int(v)
    if arch == "llama":
        cfg["architectures"] = ["LlamaForCausalLM"]
    elif arch == "qwen2":
        cfg["architectures"] = ["Qwen2ForCausalLM"]
    elif arch == "qwen3":
        cfg["architectures"] = ["Qwen3ForCausalLM"]
    elif arch == "gemma3":
        cfg["architectures"] = ["Gemma3ForCausalLM"]
        cfg["hidden_activation"] = "gelu_pytorch_tanh"
        cfg["query_pre_attn_scalar"] = cfg.get("head_dim", 256)
        cfg["rope_local_base_freq"] = 10000.0
        cfg["sliding_window_pattern"] = 6
        n = int(cfg["num_hidden_layers"])
        cfg["layer_types"] = [
            "sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)
        ]
    if arch in ("qwen2", "qwen3"):
        cfg["attention_bias"] = "blk.0.attn_q.bias" in names
    return cfg


def _hf_name(arch: str, gguf_name: str) -> str | None:
    base, _, kind = gguf_name.rpartition(".")  # kind: weight | bias
    if base == "token_embd":
        return "model.embed_tokens.weight"
    if base == "output":
        return f"lm_head.{kind}"
    if base == "output_norm":
        return "model.norm.weight"
    parts = base.split(".")
    if len(parts) != 3 or parts[0] != "blk":
        return None
    _, idx, t = parts
    if t == "ffn_norm":
        hf = "pre_feedforward_layernorm" if arch == "gemma3" else "post_attention_layernorm"
    else:
        mapped = _LAYER_NAMES.get(t)
        if mapped is None:
            return None
        hf = mapped
    return f"model.layers.{idx}.{hf}.{kind}"


def _unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's ``permute`` (interleaved -> rotate-half rows), per head."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequantized_state_dict(reader: Any, cfg: dict[str, Any]) -> dict[str, torch.Tensor]:
    """All tensors as float32 torch tensors with HF names and HF conventions."""
    import gguf

    arch = gguf_architecture(reader)
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads", heads))
    out: dict[str, torch.Tensor] = {}
    tensors = list(reader.tensors)
    show = sys.stderr.isatty() or os.environ.get("RECALLSPEC_PROGRESS") == "1"
    print(f"recallspec: dequantizing {len(tensors)} GGUF tensors (first load only)...",
          file=sys.stderr, flush=True)
    it: Any = tensors
    if show:
        from tqdm import tqdm

        it = tqdm(tensors, desc="dequantize", unit="tensor", file=sys.stderr)
    for t in it:
        name = _hf_name(arch, t.name)
        if name is None:
            if t.name.startswith("rope_"):
                continue  # precomputed rope factors; unsupported scaling was rejected above
            raise ModelLoadError(f"unexpected tensor {t.name!r} in {arch} GGUF")
        try:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
        except Exception as e:
            kind = t.tensor_type.name
            raise ModelLoadError(f"cannot dequantize {t.name} ({kind}): {e}") from None
        arr = np.asarray(arr, dtype=np.float32).reshape(tuple(int(d) for d in reversed(t.shape)))
        if arch == "llama" and t.name.endswith(("attn_q.weight", "attn_q.bias")):
            arr = _unpermute_qk(arr, heads)
        elif arch == "llama" and t.name.endswith(("attn_k.weight", "attn_k.bias")):
            arr = _unpermute_qk(arr, kv_heads)
        if arch == "gemma3" and t.name.endswith("norm.weight"):
            arr = arr - 1.0
        out[name] = torch.from_numpy(np.array(arr, dtype=np.float32, order="C", copy=True))
    return out


INTERNAL_WEIGHTS = "recallspec.safetensors"


def convert_gguf(path: Path, out_dir: Path) -> None:
    """Write the converted directory for ``path`` into ``out_dir`` (which must exist):
    HF-style ``config.json`` and the tokenizer files. Weights files are written on demand
    for the format a load asks for (``write_float_weights``, ``models/quantized.py``).
    """
    from recallspec.models.config import ModelConfig

    if not check_magic(path):
        raise ModelLoadError(f"{path} is not a GGUF file (bad magic)")
    header = read_header(path, arrays=tokenizer_arrays())
    cfg = hf_config_from_gguf(header)
    ModelConfig.from_hf_dict(cfg)  # an unsupported model fails before anything is written
    tokenizer_json, tok_cfg = tokenizer_files(path, header)
    (out_dir / "tokenizer.json").write_text(tokenizer_json)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))  # last: marks complete


def write_float_weights(path: Path, out: Path) -> None:
    """fp32 weights of GGUF ``path`` in our internal layout (fused QKV / gate-up, effective
    norm scales) into ``out``, so a cached load is a memory map with no copies; written to
    a temporary sibling and renamed, so a reader never sees a partial file."""
    import tempfile

    from safetensors.torch import save_file

    from recallspec.models.config import ModelConfig
    from recallspec.models.loader import internal_weights

    cfg = hf_config_from_gguf(read_header(path))
    reader = open_reader(path)
    weights = internal_weights(ModelConfig.from_hf_dict(cfg), dequantized_state_dict(reader, cfg))
    fd, tmp = tempfile.mkstemp(prefix=out.name + ".tmp-", dir=out.parent)
    os.close(fd)
    try:
        save_file(weights, tmp, metadata={"format": "recallspec"})
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)


__all__ = ["check_architecture", "check_magic", "convert_gguf", "gguf_architecture",
           "hf_config_from_gguf", "open_reader", "unsupported_architecture",
           "write_float_weights"]
