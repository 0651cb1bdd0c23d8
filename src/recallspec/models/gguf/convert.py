"""Convert a GGUF file into a cached model directory: HF-style ``config.json``,
``tokenizer.json`` and ``tokenizer_config.json``, and float32 dequantized weights already in
our internal layout (``recallspec.safetensors``: fused QKV / gate-up, effective norm scales),
so that a cached load is a memory map.

Tensors are first mapped to HF names and conventions (shared with HF directories through
``weights.internal_weights``), undoing two llama.cpp conventions exactly as transformers' own
GGUF import does (the tests check tensor equality against it):
  * llama.cpp permutes the Q/K rows of llama-arch models for its interleaved RoPE; we apply
    the inverse permutation so rotate-half RoPE is correct;
  * llama.cpp stores Gemma norm weights as ``1 + w``; HF stores ``w``, so we subtract 1.
The tokenizer is converted once (``models/gguf/tokenizer.py``: as transformers' GGUF
converter does, byte-level BPE vocabularies without importing it), fed from our own
header reader (``models/gguf/header.py``: the vocabulary and merges decoded in one pass,
where gguf's and transformers' readers take seconds); later loads use the saved ``tokenizer.json``.
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
from recallspec.models.config import ModelConfig
from recallspec.models.gguf import arch as gguf_arch
from recallspec.models.gguf.header import Header, read_header
from recallspec.models.gguf.tokenizer import tokenizer_arrays, tokenizer_files
from recallspec.models.weights import internal_weights

GGUF_MAGIC = b"GGUF"


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


def hf_config_from_gguf(header: Header, path: Path | None = None) -> dict[str, Any]:
    """The HF config of a GGUF from its header (``header.read_header``) and, for
    RoPE factors stored as tensors, its file (``models/gguf/arch.py``)."""
    return gguf_arch.hf_config(header, path)


def tensor_target(arch: gguf_arch.Arch, name: str, path: Path) -> str | None:
    """The HF name a GGUF tensor loads as (None: the config read it); a tensor the
    architecture does not have is refused."""
    try:
        return arch.tensor_name(name)
    except KeyError:
        raise ModelLoadError(f"{path} ({arch.model_type}): unexpected tensor {name!r}") from None


def qk_heads(arch: gguf_arch.Arch, name: str, heads: int, kv_heads: int) -> int:
    """The heads whose rows llama.cpp permuted in tensor ``name`` (0: not permuted)."""
    if not arch.permute_qk:
        return 0
    if name.endswith(("attn_q.weight", "attn_q.bias")):
        return heads
    if name.endswith(("attn_k.weight", "attn_k.bias")):
        return kv_heads
    return 0


def norm_offset(arch: gguf_arch.Arch, name: str) -> float:
    """What to add to a GGUF tensor to get transformers' value: -1 for Gemma's norms."""
    return -1.0 if arch.norm_plus_one and name.endswith("norm.weight") else 0.0


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's ``permute`` (interleaved -> rotate-half rows), per head."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequantized_state_dict(reader: Any, cfg: dict[str, Any],
                           path: Path) -> dict[str, torch.Tensor]:
    """All tensors as float32 torch tensors with HF names and HF conventions."""
    import gguf

    arch = gguf_arch.ARCHS[str(reader.fields["general.architecture"].contents())]
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
        name = tensor_target(arch, t.name, path)
        if name is None:
            continue  # RoPE factors: the config holds them
        try:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
        except Exception as e:
            kind = t.tensor_type.name
            raise ModelLoadError(f"cannot dequantize {t.name} ({kind}): {e}") from None
        arr = np.asarray(arr, dtype=np.float32).reshape(tuple(int(d) for d in reversed(t.shape)))
        if gguf_arch.EXPERT_PLACEHOLDER in name:  # [experts, rows, cols]: one per expert
            for x, ename in enumerate(gguf_arch.expert_names(name, arr.shape[0])):
                out[ename] = torch.from_numpy(np.array(arr[x], dtype=np.float32, order="C"))
            continue
        permute = qk_heads(arch, t.name, heads, kv_heads)
        if permute:
            arr = unpermute_qk(arr, permute)
        if norm_offset(arch, t.name):
            arr = arr + norm_offset(arch, t.name)
        out[name] = torch.from_numpy(np.array(arr, dtype=np.float32, order="C", copy=True))
    return out


INTERNAL_WEIGHTS = "recallspec.safetensors"


def convert_gguf(path: Path, out_dir: Path) -> None:
    """Write the converted directory for ``path`` into ``out_dir`` (which must exist):
    HF-style ``config.json`` and the tokenizer files. Weights files are written on demand
    for the format a load asks for (``write_float_weights``, ``models/gguf/quantized.py``).
    """

    if not check_magic(path):
        raise ModelLoadError(f"{path} is not a GGUF file (bad magic)")
    header = read_header(path, arrays=tokenizer_arrays())
    cfg = hf_config_from_gguf(header, path)
    # An unsupported model fails before anything is written.
    ModelConfig.from_hf_dict(cfg, str(path))
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


    cfg = hf_config_from_gguf(read_header(path), path)
    reader = open_reader(path)
    weights = internal_weights(ModelConfig.from_hf_dict(cfg, str(path)),
                               dequantized_state_dict(reader, cfg, path))
    fd, tmp = tempfile.mkstemp(prefix=out.name + ".tmp-", dir=out.parent)
    os.close(fd)
    try:
        save_file(weights, tmp, metadata={"format": "recallspec"})
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)


__all__ = ["check_magic", "convert_gguf", "hf_config_from_gguf", "norm_offset", "open_reader",
           "qk_heads", "tensor_target", "write_float_weights"]
