"""Write one random-weight F16 GGUF at a model shape, streamed tensor by tensor.

Layout, as llama.cpp's ``convert_hf_to_gguf.py`` writes these architectures: first the
RoPE tensors its ``generate_extra_tensors`` computes from the config (``rope_freqs.weight``
of Llama 3's scaling; ``rope_factors_long/short.weight`` of Phi-3's LongRoPE), then
``token_embd.weight``; per block ``attn_norm``, ``attn_q/k/v`` (+ ``.bias`` for qwen2; one
``attn_qkv`` for phi3), ``attn_output``, ``attn_q_norm``/``attn_k_norm`` (qwen3, gemma3),
``post_attention_norm`` (gemma3), ``ffn_norm``, ``ffn_gate`` (not phi3's), ``ffn_up``
(phi3's: gate and up rows), ``ffn_down``, ``post_ffw_norm`` (gemma3);
``output_norm.weight``; ``output.weight`` when untied. Matrices are F16
(``llama-quantize``'s usual input), 1-D tensors F32. Norm weights are 1.0 as stored, which
for Gemma (stored 1 + w) is w = 0: either way a unit scale. Metadata: the ``<arch>.*`` keys
llama.cpp reads (``attention.key_length`` too, so a head_dim other than hidden/heads, as
Qwen3-4B's, is stated; the RoPE scaling's and sliding window's keys), and the default
model's (SmolLM2) tokenizer copied whole, its vocabulary padded to the shape's size with
``[PAD<id>]`` tokens of type UNUSED, exactly as ``convert_hf_to_gguf.py`` pads a config
whose ``vocab_size`` exceeds its tokenizer's.

Memory: the header is written first (``GGUFWriter``: key/values, then tensor infos), then
each tensor's data in chunks sliced from one pool of random values, so a 16 GB file needs
the pool (16 MiB) and one chunk, never a tensor.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from recallspec.errors import ModelLoadError

if TYPE_CHECKING:
    from recallspec.bench.shapes import Shape

POOL_SIZE = 1 << 23  # random F16 values drawn once per file (16 MiB)
CHUNK = 1 << 20  # values per slice of the pool written at a time (2 MiB of F16)
WEIGHT_STD = 0.02  # matrices and biases: N(0, 0.02), HF's initializer_range
UNUSED = 5  # llama.cpp's token type of padding ids (gguf.TokenType.UNUSED)
METADATA_BYTES = 16 << 20  # bound on header + key/values + tensor infos (a 152k vocabulary)
ALIGNMENT = 32  # GGUF's default data alignment (GGUFWriter's)
NAME = "recallspec random weights"  # general.name of every file

MATRIX, BIAS, NORM, FACTORS = "matrix", "bias", "norm", "factors"


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the file."""

    name: str  # llama.cpp's name, e.g. "blk.3.attn_q.weight"
    shape: tuple[int, ...]  # numpy order: (rows = outputs, cols = inputs) or (n,)
    kind: str  # MATRIX (F16, random) | BIAS (F32, random) | NORM (F32, ones) |
    #            FACTORS (F32, ``values``: RoPE factors computed from the shape)
    values: tuple[float, ...] = ()

    @property
    def dtype(self) -> type[np.floating[Any]]:
        return np.float16 if self.kind == MATRIX else np.float32

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * np.dtype(self.dtype).itemsize


def llama3_rope_freqs(shape: Shape) -> list[float]:
    """Llama 3's ``rope_freqs.weight``: the divisor of each rotary frequency, computed
    exactly as llama.cpp's converter does (``conversion/llama.py``,
    ``LlamaModel.generate_extra_tensors``: float32 frequencies, its comparisons)."""
    import torch

    base, dim = shape.rope_theta, shape.head_dim
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = shape.rope_factor
    low_freq_factor, high_freq_factor = shape.rope_low_freq_factor, shape.rope_high_freq_factor
    old_context_len = shape.rope_original_context
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    rope_factors: list[Any] = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            rope_factors.append(1)
        elif wavelen > low_freq_wavelen:
            rope_factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (
                high_freq_factor - low_freq_factor)
            rope_factors.append(1 / ((1 - smooth) / factor + smooth))
    return [float(x) for x in torch.tensor(rope_factors, dtype=torch.float32).tolist()]


def longrope_factors(shape: Shape) -> tuple[list[float], list[float]]:
    """LongRoPE's (long, short) factors, one per rotated pair: a random-weight file has no
    trained ones, so plausible values stand in (what a forward costs does not depend on
    them): short 1.0 (plain RoPE within the original context, as Phi-4-mini's), long a
    geometric ramp from 1 to the scaling factor over the pairs, fastest to slowest (the
    shape of Phi-4-mini's ramp to 32)."""
    n = shape.rotary_dim // 2
    ramp = np.float32(shape.rope_factor) ** (np.arange(n, dtype=np.float32)
                                              / np.float32(max(n - 1, 1)))
    return [float(x) for x in ramp], [1.0] * n


def longrope_attn_factor(shape: Shape) -> float:
    """``rope.scaling.attn_factor``, as the converter computes it for LongRoPE
    (``conversion/phi.py``): sqrt(1 + ln(scale) / ln(original)), scale = context /
    original (1 when not scaled)."""
    scale = shape.context / shape.rope_original_context
    if scale <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(scale) / math.log(shape.rope_original_context))


@functools.lru_cache(maxsize=64)
def _rope_tensors(shape: Shape) -> tuple[TensorSpec, ...]:
    """The RoPE tensors the converter computes from the config (once per shape)."""
    if shape.rope_scaling == "llama3":
        freqs = llama3_rope_freqs(shape)
        return (TensorSpec("rope_freqs.weight", (len(freqs),), FACTORS, tuple(freqs)),)
    if shape.rope_scaling == "longrope":
        long, short = longrope_factors(shape)
        return (TensorSpec("rope_factors_long.weight", (len(long),), FACTORS, tuple(long)),
                TensorSpec("rope_factors_short.weight", (len(short),), FACTORS, tuple(short)))
    return ()


def tensor_plan(shape: Shape) -> list[TensorSpec]:
    """Every tensor of ``shape``'s GGUF, in file order."""
    h, hd, ffn, arch = shape.hidden, shape.head_dim, shape.ffn, shape.arch
    q, kv = shape.heads * hd, shape.kv_heads * hd
    plan = [*_rope_tensors(shape), TensorSpec("token_embd.weight", (shape.vocab, h), MATRIX)]
    for i in range(shape.layers):
        b = f"blk.{i}."
        plan.append(TensorSpec(b + "attn_norm.weight", (h,), NORM))
        if arch == "phi3":  # q, k and v rows in one matrix
            plan.append(TensorSpec(b + "attn_qkv.weight", (q + 2 * kv, h), MATRIX))
        else:
            for part, rows in (("q", q), ("k", kv), ("v", kv)):
                plan.append(TensorSpec(f"{b}attn_{part}.weight", (rows, h), MATRIX))
                if shape.qkv_bias:
                    plan.append(TensorSpec(f"{b}attn_{part}.bias", (rows,), BIAS))
        plan.append(TensorSpec(b + "attn_output.weight", (h, q), MATRIX))
        if shape.qk_norm:
            plan.append(TensorSpec(b + "attn_q_norm.weight", (hd,), NORM))
            plan.append(TensorSpec(b + "attn_k_norm.weight", (hd,), NORM))
        if arch == "gemma3":
            plan.append(TensorSpec(b + "post_attention_norm.weight", (h,), NORM))
        plan.append(TensorSpec(b + "ffn_norm.weight", (h,), NORM))
        if arch == "phi3":  # gate rows, then up rows, in one matrix
            plan.append(TensorSpec(b + "ffn_up.weight", (2 * ffn, h), MATRIX))
        else:
            plan.append(TensorSpec(b + "ffn_gate.weight", (ffn, h), MATRIX))
            plan.append(TensorSpec(b + "ffn_up.weight", (ffn, h), MATRIX))
        plan.append(TensorSpec(b + "ffn_down.weight", (h, ffn), MATRIX))
        if arch == "gemma3":
            plan.append(TensorSpec(b + "post_ffw_norm.weight", (h,), NORM))
    plan.append(TensorSpec("output_norm.weight", (h,), NORM))
    if not shape.tied:
        plan.append(TensorSpec("output.weight", (shape.vocab, h), MATRIX))
    return plan


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def f16_file_bytes(shape: Shape) -> int:
    """An upper bound of the F16 file's size (exact data, bounded metadata)."""
    return sum(_align(t.nbytes) for t in tensor_plan(shape)) + METADATA_BYTES


# ---- the tokenizer -------------------------------------------------------------------
@functools.lru_cache(maxsize=2)
def _source_tokenizer(source: Path) -> tuple[tuple[str, Any, Any, Any], ...]:
    """(key, value, type, array item type) of every ``tokenizer.*`` key of ``source``
    (read once per process: GGUFReader takes seconds over a vocabulary)."""
    import gguf

    reader = gguf.GGUFReader(source)
    return tuple(
        (key, f.contents(), f.types[0], f.types[-1] if len(f.types) > 1 else None)
        for key, f in reader.fields.items() if key.startswith("tokenizer.")
    )


def tokenizer_fields(vocab: int, source: Path | None = None) -> list[tuple[str, Any, Any, Any]]:
    """The ``tokenizer.*`` keys of ``source`` (default: the default model's GGUF), the
    per-token arrays padded to ``vocab`` ids with UNUSED ``[PAD<id>]`` tokens."""
    if source is None:
        from recallspec.models.loader import default_model_path

        source = default_model_path()
    fields = _source_tokenizer(Path(source).resolve())
    n = len(next(v for k, v, _, _ in fields if k == "tokenizer.ggml.tokens"))
    if vocab < n:
        raise ModelLoadError(f"vocabulary of {vocab} ids is smaller than the tokenizer's {n}")
    pad: dict[str, list[Any]] = {
        "tokenizer.ggml.tokens": [f"[PAD{i}]" for i in range(n, vocab)],
        "tokenizer.ggml.token_type": [UNUSED] * (vocab - n),
        "tokenizer.ggml.scores": [0.0] * (vocab - n),
    }
    return [(key, [*value, *pad[key]] if key in pad else value, vtype, sub)
            for key, value, vtype, sub in fields]


# ---- the file --------------------------------------------------------------------------
def _metadata(writer: Any, shape: Shape, seed: int, tokenizer: list[tuple[str, Any, Any, Any]],
              ) -> None:
    import gguf

    w = writer
    w.add_type("model")
    # (No shape name in general.name: llama.cpp sets token attributes by the model name
    # it finds there, e.g. Phi-3's for a name holding "phi3", and looks up Phi-3's tokens,
    # which the default model's vocabulary lacks; the description names the shape.)
    w.add_name(NAME)
    w.add_description(f"random weights (seed {seed}) at the published shape of {shape.name}; "
                      "written by recallspec.bench.shapes for speed measurements only")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_dimension_count(shape.rotary_dim)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_vocab_size(shape.vocab)
    if shape.rope_scaling == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(shape.rope_factor)
    elif shape.rope_scaling == "longrope":  # (no type key: Phi-3's converter writes none)
        w.add_rope_scaling_orig_ctx_len(shape.rope_original_context)
        w.add_rope_scaling_attn_factors(longrope_attn_factor(shape))
    # (llama3: its rope_freqs tensor only, no key, as the converter writes it)
    if shape.sliding_window:
        w.add_sliding_window(shape.sliding_window)
    if shape.rope_theta_swa:
        w.add_rope_freq_base_swa(shape.rope_theta_swa)
    for key, value, vtype, sub in tokenizer:
        w.add_key_value(key, value, vtype, sub)


def _progress_bar(total: int, label: str) -> Any:
    if not (sys.stderr.isatty() or os.environ.get("RECALLSPEC_PROGRESS") == "1"):
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=label, unit="B", unit_scale=True, file=sys.stderr)


def _write_data(fout: IO[bytes], plan: list[TensorSpec], seed: int,
                advance: Callable[[int], object], weights: bool = True) -> None:
    """Each tensor's data, aligned as the tensor infos promised: matrices and biases
    sliced from the pool at seeded random offsets (``weights`` False: skipped over, a
    hole), norms ones, RoPE factors theirs."""
    rng = np.random.default_rng(seed)
    pool = (rng.standard_normal(POOL_SIZE, dtype=np.float32) * WEIGHT_STD).astype(np.float16)
    for spec in plan:
        if spec.kind == NORM:
            fout.write(np.ones(spec.numel, dtype=np.float32).data)
        elif spec.kind == FACTORS:
            fout.write(np.asarray(spec.values, dtype=np.float32).data)
        elif not weights:
            fout.seek(spec.nbytes, os.SEEK_CUR)
        else:
            done = 0
            while done < spec.numel:
                k = min(CHUNK, spec.numel - done)
                off = int(rng.integers(0, POOL_SIZE - k + 1))
                part = pool[off:off + k]
                fout.write((part if spec.kind == MATRIX else part.astype(np.float32)).data)
                done += k
                advance(k * np.dtype(spec.dtype).itemsize)
        fout.write(bytes(_align(spec.nbytes) - spec.nbytes))
    fout.truncate()  # (the end of the last tensor's padding, written or skipped over)


def write_shape_gguf(shape: Shape, path: Path, *, seed: int,
                     tokenizer_source: Path | None = None, weights: bool = True) -> int:
    """Write ``shape``'s random F16 GGUF to ``path`` (the caller renames it into place);
    returns its size in bytes. The same shape and seed give the same bytes.
    ``weights`` False leaves the matrices and biases unwritten: a sparse file of the same
    size and header whose weights read as zeros, to check a shape's header, config and
    RoPE tensors in seconds (it is no model to run: never cache or time one)."""
    import gguf

    plan = tensor_plan(shape)
    writer = gguf.GGUFWriter(path, shape.arch)
    _metadata(writer, shape, seed, tokenizer_fields(shape.vocab, tokenizer_source))
    for spec in plan:
        writer.add_tensor_info(spec.name, spec.shape, np.dtype(spec.dtype), spec.nbytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    assert writer.fout is not None and len(writer.fout) == 1  # one file, no shards
    assert writer.data_alignment == ALIGNMENT
    fout = writer.fout[0]
    fout.write(bytes(_align(fout.tell()) - fout.tell()))
    bar = _progress_bar(sum(t.nbytes for t in plan if t.kind in (MATRIX, BIAS)),
                        f"{shape.name} F16") if weights else None
    try:
        _write_data(fout, plan, seed, bar.update if bar is not None else lambda _n: None,
                    weights)
        fout.flush()
        os.fsync(fout.fileno())
    finally:
        if bar is not None:
            bar.close()
        writer.close()
    return path.stat().st_size


__all__ = ["FACTORS", "TensorSpec", "f16_file_bytes", "llama3_rope_freqs",
           "longrope_attn_factor", "longrope_factors", "tensor_plan", "tokenizer_fields",
           "write_shape_gguf"]
