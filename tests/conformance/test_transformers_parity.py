"""Our fp32 path against transformers on the original checkpoint, every variant.

The GGUF is the one llama.cpp's converter made of the checkpoint: our loader reads its
metadata and tensors (RoPE scaling from keys or from rope_freqs / rope_factors tensors,
un-permuted q/k, Gemma's norms), and we compute the model at float32, prefilling the
600-token sequence in three chunks through the KV cache; transformers computes the
checkpoint it came from in one forward. The same from the checkpoint directory itself
(our reading of its config.json). Bound: ``checks.FP32_REL`` (why: there).
"""

from __future__ import annotations

import pytest
from helpers.conformance import NAMES, built, reference

from recallspec.conformance import checks
from recallspec.conformance.checks import FP32_REL


def _check(name: str, source: str) -> None:
    ref = reference(name)
    path = built(name).f32_gguf if source == "gguf" else built(name).hf_dir
    ours = checks.ours_logits(checks.load_ours(path, "float32"), ref.ids, ref.variant.context)
    a = checks.agreement(ref.logits, ours)
    print(f"{name} ({source}): {a}")
    assert a.max_rel <= FP32_REL, a
    assert not checks.near_tie_mismatches(ref.logits, ours, 2 * FP32_REL), a


@pytest.mark.parametrize("name", NAMES)
def test_fp32_gguf_logits_match_transformers(name: str) -> None:
    _check(name, "gguf")


@pytest.mark.parametrize("name", NAMES)
def test_fp32_hf_directory_logits_match_transformers(name: str) -> None:
    _check(name, "hf")


@pytest.mark.parametrize("name", NAMES)
def test_fp32_greedy_matches_transformers(name: str) -> None:
    """64 greedy tokens after a 536-token prompt (past every original context and
    window), ours one decode step at a time, transformers through its own KV cache."""
    ref = reference(name)
    prompt = ref.ids[:536]
    model = checks.load_ours(built(name).f32_gguf, "float32")
    ours = checks.ours_greedy(model, prompt, ref.variant.context)
    assert ours == checks.hf_greedy(ref.model, prompt)
