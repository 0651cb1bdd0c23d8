"""Compact weights: a GGUF's matrices kept in their own block formats.

``quantized_state_dict`` reads a GGUF (memory-mapped) into HF names and conventions, like
``gguf_loader.dequantized_state_dict``, but every matrix becomes a ``QuantizedWeight``
(``runtime/qlinear.py``) holding the file's own integers and scales, repacked once for
the batch-invariant kernel; 1-D tensors (norms, biases) stay float32. The two llama.cpp
conventions are undone exactly as for the fp32 path: Q/K rows of llama models are
un-permuted (a row permutation, exact on block rows), Gemma norms get ``- 1``.
Float matrices (F32/F16/BF16 GGUFs, HF safetensors) are quantized to Q8_0 at load.

The repacked weights of a converted model are cached next to its fp32 ones
(``save_quantized`` / ``load_quantized``), so a later load is one file read.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recallspec.errors import ModelLoadError
from recallspec.runtime.qlinear import QuantizedWeight

QUANTIZED_WEIGHTS = "recallspec-quantized.safetensors"
QUANT_FORMAT = 1  # bump when QuantizedWeight's state_dict layout changes
# Float matrices (no block format of their own) are quantized to this at load.
FLOAT_MATRIX_KIND = "Q8_0"

Weights = dict[str, "torch.Tensor | QuantizedWeight"]


def quantized_state_dict(reader: Any, cfg: dict[str, Any]) -> Weights:
    """Every tensor of a GGUF with HF names: matrices quantized, the rest float32."""
    import gguf

    from recallspec.models.gguf_loader import _hf_name, _unpermute_qk, gguf_architecture

    arch = gguf_architecture(reader)
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads", heads))
    float_types = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16,
                   gguf.GGMLQuantizationType.BF16}
    out: Weights = {}
    for t in reader.tensors:
        name = _hf_name(arch, t.name)
        if name is None:
            if t.name.startswith("rope_"):
                continue
            raise ModelLoadError(f"unexpected tensor {t.name!r} in {arch} GGUF")
        shape = tuple(int(d) for d in reversed(t.shape))  # [rows, cols] as numpy sees it
        permute = (
            heads if arch == "llama" and t.name.endswith(("attn_q.weight", "attn_q.bias"))
            else kv_heads if arch == "llama" and t.name.endswith(("attn_k.weight", "attn_k.bias"))
            else 0
        )
        if len(shape) == 1 or t.tensor_type in float_types:
            try:
                arr = gguf.quants.dequantize(t.data, t.tensor_type)
            except Exception as e:
                raise ModelLoadError(f"cannot read {t.name} ({t.tensor_type.name}): {e}") from None
            arr = np.asarray(arr, dtype=np.float32).reshape(shape)
            if permute:
                arr = _unpermute_qk(arr, permute)
            if arch == "gemma3" and t.name.endswith("norm.weight"):
                arr = arr - 1.0
            tensor = torch.from_numpy(np.array(arr, dtype=np.float32, order="C", copy=True))
            out[name] = (
                tensor if tensor.ndim == 1
                else QuantizedWeight.from_float(tensor, FLOAT_MATRIX_KIND)
            )
            continue
        raw = np.asarray(t.data)  # [rows, bytes per row], uint8, memory-mapped
        if permute:
            raw = _unpermute_qk(raw, permute)
        try:
            out[name] = QuantizedWeight.from_gguf(
                np.ascontiguousarray(raw), t.tensor_type, shape[0], shape[1]
            )
        except (ValueError, NotImplementedError) as e:
            raise ModelLoadError(
                f"{t.name}: block type {t.tensor_type.name} is not supported by the quantized "
                f"path ({e}); load with dtype='float32'"
            ) from None
    return out


def quantize_floats(weights: Mapping[str, torch.Tensor]) -> Weights:
    """Internal-layout fp32 weights (HF safetensors) -> matrices quantized to Q8_0."""
    return {
        k: QuantizedWeight.from_float(v.float().contiguous(), FLOAT_MATRIX_KIND)
        if v.ndim == 2 else v.float()
        for k, v in weights.items()
    }


def save_quantized(weights: Mapping[str, torch.Tensor | QuantizedWeight], path: Path) -> None:
    """One safetensors file; written to a temporary sibling and renamed into place, so a
    reader never sees a partial file."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    kinds: dict[str, str] = {}
    for name, w in weights.items():
        if isinstance(w, QuantizedWeight):
            tensors.update(w.state_dict(name + "."))
            kinds[name] = "q"
        else:
            tensors[name] = w.contiguous()
            kinds[name] = "t"
    meta = {"format": "recallspec-quantized", "version": str(QUANT_FORMAT),
            "kinds": json.dumps(kinds)}
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".tmp-", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=meta)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def load_quantized(path: Path) -> Weights | None:
    """The cached weights, or None when the file is missing or of another format."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        if meta.get("version") != str(QUANT_FORMAT):
            return None
        kinds: dict[str, str] = json.loads(meta["kinds"])
        tensors = load_file(str(path))
    except Exception:
        return None  # corrupt or stale: the caller rebuilds it from the GGUF
    out: Weights = {}
    for name, kind in kinds.items():
        out[name] = (
            QuantizedWeight.from_state_dict(tensors, name + ".") if kind == "q" else tensors[name]
        )
    return out
