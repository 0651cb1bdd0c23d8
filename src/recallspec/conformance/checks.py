"""The suite's measurements: logits and greedy tokens of our model and of two outside
truths on the same token sequence, and how far apart they are.

* transformers on the original checkpoint (``hf_logits``, ``hf_greedy``): the model's own
  maths, against our fp32 path on the GGUF llama.cpp's converter made of it;
* native llama.cpp on the same quantized file (``llamacpp_logits``: ``llama-logits``,
  tools/llama_logits.cpp, built by ``make peers``): the same quantized model computed
  another way, against our quantized path.

Our side runs the sequence as a prefill in chunks through the KV cache (so cached
positions, RoPE of later chunks and the windows across chunks are all exercised) and
greedy decoding one token a step, as plain decoding does.
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recallspec.conformance.checkpoints import Built, ConformanceSetupError
from recallspec.conformance.variants import SEQ_LEN
from recallspec.models import CausalLM, load_model
from recallspec.runtime.batch import SequenceInput, build_batch

GREEDY_TOKENS = 64
# Our fp32 path vs transformers, per position: max |ours - ref| <= FP32_REL * max |ref|.
# Both compute in float32 but sum in other orders (fused vs separate projections, our
# kernels' 16-lane accumulators vs MKL's blocking, chunked prefill vs one forward), and
# a GGUF's Llama 3 RoPE comes as divisors of the frequencies (rope_freqs), one ulp from
# transformers' own formula; these random models amplify such noise (a one-ulp change
# of a frequency moves their logits visibly). The worst over the variants (the "max rel.
# diff" column of docs/conformance/conformance.md) stays well inside 2^-14, while each
# fault tried (plain RoPE in place of Llama 3's among them) moves a position's logits by
# a large share of its largest.
FP32_REL = 2.0**-14


@dataclass(frozen=True)
class QuantBound:
    top1: float  # the least share of positions whose argmaxes agree
    mean_kl: float  # the largest mean KL(llama.cpp || ours), nats


# Our quantized path vs llama.cpp on the same file. The integer products agree exactly
# where both quantize activations the same way, but llama.cpp's K-quant products take
# activations in blocks of 256 (Q8_K) where ours take blocks of 32, and softmax, norms,
# RoPE (llama.cpp multiplies its angles up from one factor) and sums differ in float
# order; these random models (wide logits) turn such noise into flipped argmaxes at
# near-ties. What the variants give is in docs/conformance/conformance.md; the bounds
# leave a margin below its top-1 and above its KL (llama.cpp's kernels on other
# instruction sets order their sums otherwise; ours give the same bits on every path).
# A fault is far outside: plain RoPE in place of Llama 3's flips most argmaxes against
# transformers, and the same file's llama.cpp logits against transformers' fp32 ones (a
# close but other model: the quantization's own change) fall outside both bounds at Q4.
LLAMACPP_BOUNDS: dict[str, QuantBound] = {
    "Q8_0": QuantBound(top1=0.80, mean_kl=3e-3),
    "Q4_0": QuantBound(top1=0.80, mean_kl=3e-3),
    "Q4_K_M": QuantBound(top1=0.70, mean_kl=1.2e-2),
    # MXFP4 experts (their products exact integer sums on both sides, over the same 8-bit
    # activations in blocks of 32) and Q8_0 elsewhere: Q8_0's bound.
    "MXFP4_MOE": QuantBound(top1=0.80, mean_kl=3e-3),
}
# A mixture of experts against llama.cpp: each row's top-k experts are chosen by router
# logits that carry the two engines' float-order noise, and where a row's k-th and
# (k+1)-th experts are that close (random routers over few experts are often), the two
# choose differently and that row's FFN output, with every later layer's input, changes
# entirely. So the KL between them is a median like a dense model's with a tail of a
# few flipped positions (the tiny Qwen3-MoE at Q8_0: median 4e-4, mean 3.7e-3 from 22 of
# 600 positions above 0.02), whose mean depends on how many near-ties fall in the
# sequence, not on a fault. The mean is therefore replaced by two checks that a fault
# fails: the median KL within the dense bound on the mean, and ours no farther from the
# true model (transformers on the checkpoint, fp32) than llama.cpp is, in mean KL, by
# at most MOE_TRUTH_RATIO (measured: 0.996-1.045 over the three formats). A fault is far
# outside: the chosen experts' weights not renormalised, or one expert fewer per row,
# give top-1 0.35-0.38, median KL 0.09-0.13 and ours 1.26-16x farther from the truth.
MOE_TRUTH_RATIO = 1.25


def quant_passes(quant: str, a: Agreement, *, moe: bool = False,
                 ours_to_truth: float | None = None,
                 llamacpp_to_truth: float | None = None) -> bool:
    """Whether our quantized logits are within ``LLAMACPP_BOUNDS[quant]`` of llama.cpp's
    (``a``); for a mixture of experts, with the mean KL replaced as stated at
    ``MOE_TRUTH_RATIO`` (``ours_to_truth`` / ``llamacpp_to_truth``: each engine's mean
    KL from transformers' fp32 logits, needed then)."""
    b = LLAMACPP_BOUNDS[quant]
    if a.top1 < b.top1:
        return False
    if not moe:
        return a.mean_kl <= b.mean_kl
    if ours_to_truth is None or llamacpp_to_truth is None:
        raise ValueError("a mixture of experts' verdict needs both engines' KL from the truth")
    return a.median_kl <= b.mean_kl and ours_to_truth <= MOE_TRUTH_RATIO * llamacpp_to_truth


# The prefill's chunks: the sequence's positions [0, 256), [256, 520), [520, 600).
CHUNKS = (256, 520)


def token_ids(vocab_size: int, n: int = SEQ_LEN, seed: int = 1) -> list[int]:
    """A seeded random sequence of ids (random text is what a random model is fair on:
    every token, every position); ids 0-2 (unk / bos / eos) left out."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(3, vocab_size, (n,), generator=gen)).tolist()


def hf_model(built: Built) -> Any:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        built.hf_dir, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


@torch.inference_mode()
def hf_logits(model: Any, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids])).logits[0].float()


@torch.inference_mode()
def hf_greedy(model: Any, prompt: list[int], n: int = GREEDY_TOKENS) -> list[int]:
    """Greedy tokens through transformers' own KV cache (one forward per token)."""
    out = model(torch.tensor([prompt]), use_cache=True)
    past, tokens = out.past_key_values, []
    for _ in range(n):
        nxt = int(out.logits[0, -1].argmax())
        tokens.append(nxt)
        out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
    return tokens


def load_ours(path: Path, dtype: str) -> CausalLM:
    model, _ = load_model(path, dtype=dtype, repack_cache=False)
    return model


def with_llamacpp_rope(model: CausalLM) -> CausalLM:
    """``model`` (weights shared) with RoPE as llama.cpp computes it where the two
    differ: YaRN's correction range rounded to whole dims (llama.cpp rounds it always,
    gpt-oss's own config does not). For the quantized check against llama.cpp, which is
    of the file's blocks and kernels, not of RoPE (the fp32 check against transformers
    is): a random model turns the few percent this moves some frequencies by into logits
    that no longer agree at all. The model itself when nothing differs."""
    import copy

    c = model.config
    specs = [s for s in (c.rope, c.rope_local) if s is not None]
    if not any(s.type == "yarn" and not s.truncate for s in specs):
        return model
    from dataclasses import replace

    from recallspec.models.rope import RopeTables

    def rounded(s: Any) -> Any:
        return None if s is None else replace(s, truncate=True)

    other = copy.copy(model)  # (a shallow copy: its own config and tables, same weights)
    other.config = replace(c, rope=rounded(c.rope), rope_local=rounded(c.rope_local))
    other.rope = RopeTables(other.config, model.dtype)
    return other


@torch.inference_mode()
def ours_logits(model: CausalLM, ids: list[int], context: int) -> torch.Tensor:
    cache = model.new_cache(1, context)
    parts, start = [], 0
    for end in (*[c for c in CHUNKS if c < len(ids)], len(ids)):
        meta = build_batch([SequenceInput(0, start, ids[start:end])])
        parts.append(model(meta, cache))
        start = end
    return torch.cat(parts)


@torch.inference_mode()
def ours_greedy(model: CausalLM, prompt: list[int], context: int,
                n: int = GREEDY_TOKENS) -> list[int]:
    cache = model.new_cache(1, context)
    logits = model(build_batch([SequenceInput(0, 0, prompt, logits="last")]), cache)
    tokens: list[int] = []
    for i in range(n):
        nxt = int(logits[-1].argmax())
        tokens.append(nxt)
        logits = model(build_batch([SequenceInput(0, len(prompt) + i, [nxt])]), cache)
    return tokens


def llamacpp_logits(gguf: Path, ids: list[int], context: int, threads: int = 2) -> torch.Tensor:
    """Native llama.cpp's logits at every position of ``ids`` (context ``context``, an
    f32 KV cache as ours)."""
    from recallspec.bench.common import llamacpp

    binary = llamacpp.bin_dir() / "llama-logits"
    if not binary.is_file():
        raise ConformanceSetupError(f"{binary} is missing (run `make peers`)")
    with tempfile.TemporaryDirectory(prefix="recallspec-conf-") as d:
        src, dst = Path(d) / "ids.bin", Path(d) / "logits.bin"
        np.asarray(ids, dtype=np.int32).tofile(src)
        r = subprocess.run([str(binary), str(gguf), str(src), str(dst), "--ctx", str(context),
                            "--threads", str(threads), "--kv", "f32"],
                           capture_output=True, text=True, errors="replace", check=False)
        if r.returncode != 0:
            raise ConformanceSetupError(f"llama-logits {gguf} failed: {r.stderr.strip()[-800:]}")
        arr = np.fromfile(dst, dtype=np.float32)
    return torch.from_numpy(arr.reshape(len(ids), -1).copy())


@dataclass(frozen=True)
class Agreement:
    """How far ``ours`` is from a reference over the same positions."""

    positions: int
    max_rel: float  # max over positions of max|ours - ref| / max|ref|
    top1: float  # share of positions where the argmaxes agree
    mean_kl: float  # mean KL(ref || ours) of the softmaxes, nats
    max_kl: float
    median_kl: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return {"positions": self.positions, "max_rel": self.max_rel, "top1": self.top1,
                "mean_kl": self.mean_kl, "max_kl": self.max_kl, "median_kl": self.median_kl}


def agreement(ref: torch.Tensor, ours: torch.Tensor) -> Agreement:
    if ref.shape != ours.shape:
        raise ValueError(f"logits of shapes {tuple(ref.shape)} and {tuple(ours.shape)}")
    rel = (ours - ref).abs().amax(-1) / ref.abs().amax(-1)
    lp, lq = torch.log_softmax(ref.double(), -1), torch.log_softmax(ours.double(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    return Agreement(positions=int(ref.shape[0]), max_rel=float(rel.max()),
                     top1=float((ref.argmax(-1) == ours.argmax(-1)).double().mean()),
                     mean_kl=float(kl.mean()), max_kl=float(kl.max()),
                     median_kl=float(kl.median()))


def near_tie_mismatches(ref: torch.Tensor, ours: torch.Tensor, gap: float) -> list[int]:
    """Positions whose argmaxes differ although the reference's top two are more than
    ``gap`` apart (relative to its largest |logit|): a real disagreement, not a tie."""
    top = ref.topk(2, dim=-1).values
    rel_gap = (top[:, 0] - top[:, 1]) / ref.abs().amax(-1)
    bad = (ref.argmax(-1) != ours.argmax(-1)) & (rel_gap > gap)
    return [int(i) for i in bad.nonzero().flatten()]
