"""Write one random-weight F16 GGUF at a model shape, streamed tensor by tensor.

Layout, as llama.cpp's ``convert_hf_to_gguf.py`` writes these architectures:
``token_embd.weight``; per block ``attn_norm``, ``attn_q/k/v`` (+ ``.bias`` for qwen2),
``attn_output``, ``attn_q_norm``/``attn_k_norm`` (qwen3), ``ffn_norm``, ``ffn_gate``,
``ffn_up``, ``ffn_down``; ``output_norm.weight``; ``output.weight`` when untied. Matrices are
F16 (``llama-quantize``'s usual input), 1-D tensors F32. Metadata: the ``<arch>.*`` keys
llama.cpp reads (``attention.key_length`` too, so a head_dim other than hidden/heads, as
Qwen3-4B's, is stated), and the default model's (SmolLM2) tokenizer copied whole, its
vocabulary padded to the shape's size with ``[PAD<id>]`` tokens of type UNUSED, exactly as
``convert_hf_to_gguf.py`` pads a config whose ``vocab_size`` exceeds its tokenizer's.

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

MATRIX, BIAS, NORM = "matrix", "bias", "norm"


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the file."""

    name: str  # llama.cpp's name, e.g. "blk.3.attn_q.weight"
    shape: tuple[int, ...]  # numpy order: (rows = outputs, cols = inputs) or (n,)
    kind: str  # MATRIX (F16, random) | BIAS (F32, random) | NORM (F32, ones)

    @property
    def dtype(self) -> type[np.floating[Any]]:
        return np.float16 if self.kind == MATRIX else np.float32

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * np.dtype(self.dtype).itemsize


def tensor_plan(shape: Shape) -> list[TensorSpec]:
    """Every tensor of ``shape``'s GGUF, in file order."""
    h, hd, ffn = shape.hidden, shape.head_dim, shape.ffn
    q, kv = shape.heads * hd, shape.kv_heads * hd
    plan = [TensorSpec("token_embd.weight", (shape.vocab, h), MATRIX)]
    for i in range(shape.layers):
        b = f"blk.{i}."
        plan.append(TensorSpec(b + "attn_norm.weight", (h,), NORM))
        for part, rows in (("q", q), ("k", kv), ("v", kv)):
            plan.append(TensorSpec(f"{b}attn_{part}.weight", (rows, h), MATRIX))
            if shape.qkv_bias:
                plan.append(TensorSpec(f"{b}attn_{part}.bias", (rows,), BIAS))
        plan.append(TensorSpec(b + "attn_output.weight", (h, q), MATRIX))
        if shape.qk_norm:
            plan.append(TensorSpec(b + "attn_q_norm.weight", (hd,), NORM))
            plan.append(TensorSpec(b + "attn_k_norm.weight", (hd,), NORM))
        plan.append(TensorSpec(b + "ffn_norm.weight", (h,), NORM))
        plan.append(TensorSpec(b + "ffn_gate.weight", (ffn, h), MATRIX))
        plan.append(TensorSpec(b + "ffn_up.weight", (ffn, h), MATRIX))
        plan.append(TensorSpec(b + "ffn_down.weight", (h, ffn), MATRIX))
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
    w.add_name(f"random {shape.name}")
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
    w.add_rope_dimension_count(shape.head_dim)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_vocab_size(shape.vocab)
    for key, value, vtype, sub in tokenizer:
        w.add_key_value(key, value, vtype, sub)


def _progress_bar(total: int, label: str) -> Any:
    if not (sys.stderr.isatty() or os.environ.get("RECALLSPEC_PROGRESS") == "1"):
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=label, unit="B", unit_scale=True, file=sys.stderr)


def _write_data(fout: IO[bytes], plan: list[TensorSpec], seed: int,
                advance: Callable[[int], object]) -> None:
    """Each tensor's data, aligned as the tensor infos promised: matrices and biases
    sliced from the pool at seeded random offsets, norms ones."""
    rng = np.random.default_rng(seed)
    pool = (rng.standard_normal(POOL_SIZE, dtype=np.float32) * WEIGHT_STD).astype(np.float16)
    for spec in plan:
        if spec.kind == NORM:
            fout.write(np.ones(spec.numel, dtype=np.float32).data)
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


def write_shape_gguf(shape: Shape, path: Path, *, seed: int,
                     tokenizer_source: Path | None = None) -> int:
    """Write ``shape``'s random F16 GGUF to ``path`` (the caller renames it into place);
    returns its size in bytes. The same shape and seed give the same bytes."""
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
    bar = _progress_bar(sum(t.nbytes for t in plan if t.kind != NORM), f"{shape.name} F16")
    try:
        _write_data(fout, plan, seed, bar.update if bar is not None else lambda _n: None)
        fout.flush()
        os.fsync(fout.fileno())
    finally:
        if bar is not None:
            bar.close()
        writer.close()
    return path.stat().st_size


__all__ = ["TensorSpec", "f16_file_bytes", "tensor_plan", "tokenizer_fields",
           "write_shape_gguf"]
