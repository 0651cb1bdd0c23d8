"""Our quantized path against native llama.cpp on the same quantized file, every variant
and format: the same quantized model computed another way (llama-logits,
tools/llama_logits.cpp, over llama.cpp's own libraries; an f32 KV cache as ours).

The f32 GGUF llama.cpp's converter made is quantized by llama-quantize to each format;
both sides run the 600-token sequence with the same context (which picks LongRoPE's long
factors on both). Bounds: ``checks.LLAMACPP_BOUNDS`` (why: there); a mixture of experts'
mean KL is replaced as ``checks.MOE_TRUTH_RATIO`` states. Where llama.cpp computes RoPE
otherwise than the model's config says (gpt-oss's YaRN), ours computes it llama.cpp's
way here (``checks.with_llamacpp_rope``): this check is of the file's blocks, the fp32
one against transformers of the maths."""

from __future__ import annotations

import pytest
from helpers.availability import native_peer_or_unavailable
from helpers.conformance import NAMES, built, reference

from recallspec.conformance import checks
from recallspec.conformance.checkpoints import QUANTS, quantized
from recallspec.conformance.variants import VARIANTS

pytestmark = pytest.mark.peer


# Every variant in the common formats, and in its own (gpt-oss: MXFP4 experts).
CASES = [(n, q) for n in NAMES for q in (*QUANTS, *VARIANTS[n].extra_quants)]


@pytest.mark.parametrize(("name", "quant"), CASES)
def test_quantized_matches_llamacpp(name: str, quant: str) -> None:
    native_peer_or_unavailable()
    ref = reference(name)
    gguf = quantized(built(name), quant)
    ctx = ref.variant.context
    # (RoPE as llama.cpp computes it where the two differ: checks.with_llamacpp_rope.)
    model = checks.with_llamacpp_rope(checks.load_ours(gguf, "auto"))
    ours = checks.ours_logits(model, ref.ids, ctx)
    theirs = checks.llamacpp_logits(gguf, ref.ids, ctx)
    a = checks.agreement(theirs, ours)
    print(f"{name} {quant}: {a}")
    bound = checks.LLAMACPP_BOUNDS[quant]
    if not model.config.moe:
        assert checks.quant_passes(quant, a), (a, bound)
        return
    # A mixture of experts: the median and the distance from the true model
    # (checks.MOE_TRUTH_RATIO: why).
    ours_kl = checks.agreement(ref.logits, ours).mean_kl
    theirs_kl = checks.agreement(ref.logits, theirs).mean_kl
    print(f"  mean KL from transformers: ours {ours_kl:.3e}, llama.cpp {theirs_kl:.3e}")
    assert checks.quant_passes(quant, a, moe=True, ours_to_truth=ours_kl,
                               llamacpp_to_truth=theirs_kl), (a, bound, ours_kl, theirs_kl)
