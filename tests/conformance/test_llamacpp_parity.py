"""Our quantized path against native llama.cpp on the same quantized file, every variant
and format: the same quantized model computed another way (llama-logits,
tools/llama_logits.cpp, over llama.cpp's own libraries; an f32 KV cache as ours).

The f32 GGUF llama.cpp's converter made is quantized by llama-quantize to each format;
both sides run the 600-token sequence with the same context (which picks LongRoPE's long
factors on both). Bounds: ``checks.LLAMACPP_BOUNDS`` (why: there)."""

from __future__ import annotations

import pytest
from helpers.availability import native_peer_or_unavailable
from helpers.conformance import NAMES, built, reference

from recallspec.conformance import checks
from recallspec.conformance.checkpoints import QUANTS, quantized

pytestmark = pytest.mark.peer


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("name", NAMES)
def test_quantized_matches_llamacpp(name: str, quant: str) -> None:
    native_peer_or_unavailable()
    ref = reference(name)
    gguf = quantized(built(name), quant)
    ctx = ref.variant.context
    ours = checks.ours_logits(checks.load_ours(gguf, "auto"), ref.ids, ctx)
    a = checks.agreement(checks.llamacpp_logits(gguf, ref.ids, ctx), ours)
    print(f"{name} {quant}: {a}")
    bound = checks.LLAMACPP_BOUNDS[quant]
    assert a.top1 >= bound.top1 and a.mean_kl <= bound.mean_kl, (a, bound)
