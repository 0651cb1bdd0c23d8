"""Engine parameters the command line names before torch loads: each one's allowed values
and default, defined once.

Free of imports (like ``policy.py``), so that the commands offer these as choices and
state the defaults in their help without loading torch or numpy. A value is checked by
one function, ``one_of``, where it enters: ``EngineConfig`` for an engine, ``load_model``
for a direct caller (the loader resolves the format names to torch dtypes).
"""

from __future__ import annotations

from typing import Literal, TypeVar

# "auto": a GGUF's own quantized blocks (float matrices quantized to Q8_0), float32 for an
# HF directory; "quantized" the same for either; "float32" the dequantized reference
# (token-identical to transformers' fp32); "bfloat16" dense bf16 weights.
_T = TypeVar("_T")

WeightFormat = Literal["auto", "quantized", "float32", "bfloat16"]
WEIGHT_FORMATS: tuple[WeightFormat, ...] = ("auto", "quantized", "float32", "bfloat16")
DEFAULT_WEIGHT_FORMAT: WeightFormat = "auto"

# What the KV cache stores keys and values in. "auto": the weights' compute dtype
# (float32 for quantized weights: measured, a 16-bit cache did not pay at Spec-Bench
# lengths); "float16" halves the cache and the bytes a decode row's attention reads.
KVDtype = Literal["auto", "float32", "float16"]
KV_DTYPES: tuple[KVDtype, ...] = ("auto", "float32", "float16")
DEFAULT_KV_DTYPE: KVDtype = "auto"


def one_of(name: str, value: object, allowed: tuple[_T, ...]) -> _T:
    """``value`` if it is one of ``allowed``, else the one ``ValueError`` every layer that
    takes such a parameter raises (the engine's config, ``load_model``)."""
    for a in allowed:
        if value == a:
            return a
    raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))}, got {value!r}")

# Draft-tree nodes verified per sequence and step, at most: the one default of every
# layer that takes a ``max_draft_nodes`` (the engine's config and command line, the
# transformers integration, the benchmarks and their replay). Cost-aware sizing drafts
# fewer where rows do not pay; workloads that re-send long texts gain from more (32).
MAX_DRAFT_NODES = 16

# A request's draft sizing policy (``cost/sizing.py``). "adaptive": each step chooses the
# draft's size, zero included, by its expected tokens per second; "fixed": the drafter's
# proposal is verified as proposed (cut to the room). Adaptive is the default of every
# drafter named without one (``drafters/spec.py``, ``engine/drafter_pool.py``): a fixed
# size can make decoding clearly slower than plain decoding (``sam`` with a corpus index
# on instruction prompts, where adaptive sizing stays near plain decoding), while
# cost-aware sizing stops drafting where drafts do not pay. Defined here, free of numpy,
# so that parsing a drafter spec needs no array library.
Sizing = Literal["adaptive", "fixed"]
SIZINGS: tuple[Sizing, ...] = ("adaptive", "fixed")
DEFAULT_SIZING: Sizing = "adaptive"

# EMS-SD's batch layouts are no parameter: the engine always decodes unpadded (ragged
# rows, each KV slot advancing by its own accepted count: EMS-SD's own layout, "ems").
# The paper's padded baselines are a benchmark ablation
# (``bench/suite/padded_layouts.py``, run by ``benchmarks/experiments/exp_batch.py``).
# Their words are named here only so that one given where a sizing is expected is refused
# with that explanation (``sizing_refusal``).
BATCH_LAYOUT_WORDS = ("ems", "vanilla", "unpad-kv", "unpad-input")


def sizing_refusal(word: str, what: str = "sizing") -> str:
    """The message refusing ``word`` where a sizing word is expected (``what``: how the
    caller names the field, e.g. "mode")."""
    msg = f"unknown {what} {word!r}; available: {', '.join(SIZINGS)} (draft sizing)"
    if word in BATCH_LAYOUT_WORDS:
        msg += (f". {word!r} is a batch layout, not a sizing: the engine always decodes "
                "unpadded (EMS-SD; its fixed-size drafts are 'fixed'), and EMS-SD's padded "
                "layouts (vanilla, unpad-kv, unpad-input) are a benchmark ablation, in "
                "recallspec.bench.suite.padded_layouts (run by "
                "benchmarks/experiments/exp_batch.py)")
    return msg


# The prefix pool's default (``engine/prefix_pool.py``): this many tokens, but never more
# than DEFAULT_POOL_BYTES of keys and values (a token weighs 46 KB at SmolLM2-135M in
# float32, 393 KB at the SmolLM2-1.7B shape, 262 KB at Llama-3.1-8B's: 16,384 tokens would
# be 6.4 GB at 1.7B). llama-server's prompt cache defaults to 8 GiB (``--cache-ram``)
# beside a context it reserves up front; ours holds only what it was given, within the
# engine's KV budget too.
DEFAULT_POOL_TOKENS = 16384
DEFAULT_POOL_BYTES = 2 << 30
