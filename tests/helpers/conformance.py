"""Shared set-up of the conformance tests (tests/conformance/): each variant's files,
built once per session (and cached on disk by recallspec.conformance), transformers'
reference logits on the variant's token sequence, and a GGUF rewriter for the tests that
feed the loader a file with a tensor or key changed."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from helpers.availability import unavailable

from recallspec.conformance import checks
from recallspec.conformance.checkpoints import Built, ConformanceSetupError, build
from recallspec.conformance.variants import VARIANTS, Variant

NAMES = list(VARIANTS)


@cache
def built(name: str) -> Built:
    try:
        return build(VARIANTS[name])
    except ConformanceSetupError as e:
        unavailable(str(e))


@dataclass(frozen=True)
class Reference:
    variant: Variant
    ids: list[int]  # the checked sequence
    logits: torch.Tensor  # transformers on the original checkpoint, every position
    model: Any  # the transformers model


@cache
def reference(name: str) -> Reference:
    b = built(name)
    model = checks.hf_model(b)
    ids = checks.token_ids(int(model.config.vocab_size))
    return Reference(b.variant, ids, checks.hf_logits(model, ids), model)


def rewrite_gguf(src: Path, dst: Path, *, drop: Callable[[str], bool] = lambda _: False,
                 keys: Mapping[str, tuple[Any, Any]] | None = None,
                 drop_keys: tuple[str, ...] = (),
                 tensors: Mapping[str, np.ndarray] | None = None) -> Path:
    """A copy of GGUF ``src`` at ``dst`` without the tensors ``drop`` names and the keys
    in ``drop_keys``, with ``keys`` (name -> (value, gguf.GGUFValueType)) set and float32
    ``tensors`` added, written by gguf-py (the library llama.cpp's converter writes with)."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture",
                                                              *drop_keys):
            continue
        if keys and field.name in keys:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for name, (value, vtype) in (keys or {}).items():
        writer.add_key_value(name, value, vtype)
    for t in reader.tensors:
        if drop(t.name):
            continue
        writer.add_tensor(t.name, t.data, raw_shape=list(reversed(t.shape.tolist())),
                          raw_dtype=t.tensor_type)
    for name, arr in (tensors or {}).items():
        writer.add_tensor(name, np.asarray(arr, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
