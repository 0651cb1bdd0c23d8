"""Random-weight GGUFs at the published shapes of the models people run (1-8B dense, the
20-30B mixtures of experts), cached.

What is random, and why the costs are still true: every matrix, bias and router is drawn
from N(0, 0.02) (slices of one seeded pool of F16 values at seeded offsets), every norm weight
is 1.0 as stored (Gemma's store 1 + w: a unit scale too), the RoPE factor tensors are
computed from the config (Llama 3's rope_freqs as llama.cpp's converter computes them;
LongRoPE's, trained in a real model, plausible stand-ins), and the tokenizer is the
default model's (SmolLM2's) with its vocabulary padded to the shape's size. What a forward
costs (bytes of weights read, multiply-adds, KV-cache traffic, the head over the whole
vocabulary) depends only on the shapes and the quantization, never on the values, in our
runtime and in llama.cpp alike; the scale keeps activations finite through every layer
(unit-RMS inputs give q/k/v of RMS 0.02*sqrt(hidden), about 1.3 at 4096), so no NaN/inf
slow path is taken. What random weights do change is *which* tokens come out: benchmark
with ``ignore_eos`` and fixed token counts, and take acceptance rates of speculation from
real models (``bench/replay/``), never from these. A mixture of experts adds one value
that does matter: which experts a row reads follows the router's (random) values. A row
reads ``experts_used`` of them per layer whatever they are, so one row's weight bytes are
``Shape.active_parameters``' at any values; how many distinct experts a batch of rows
reads (prefill, verification) follows the picks, which a trained router makes
differently: take those costs from a real model where they matter. The same (shape,
seed, generator version) gives the same bytes.

Files: ``<cache>/shapes/<shape>-<quant>.gguf`` (``<cache>``: ``RECALLSPEC_CACHE_DIR`` or
platformdirs' user cache dir of recallspec), each with a JSON manifest beside it
(``<shape>-<quant>.json``: the shape, seed, generator version, file size, sha256 for files
up to 1 GiB) that is written last and must match for a file to be reused. Quantized files
are made from the F16 one by llama.cpp's own ``llama-quantize``; the F16 intermediate is
deleted afterwards unless it was cached already. A mixture of experts is written in Q8_0
blocks instead (``source_quant``: no 61 GB F16 file for Qwen3-30B-A3B) and requantized
(``--allow-requantize``): its Q4_K_M or MXFP4_MOE is then two roundings from the random
values, which changes no cost. Everything is written to a temporary name
and renamed, so an interrupted run never leaves a file that looks complete.

Each file holds the tensors of ``shapes.tensor_plan`` (matrices F16, the stacked experts'
3-D ones too; 1-D tensors, gpt-oss's stacked 2-D expert biases and the router F32).
Metadata: the ``<arch>.*`` keys llama.cpp reads (``attention.key_length`` too, so a
head_dim other than hidden/heads, as Qwen3-4B's, is stated; the RoPE scaling's and sliding
window's keys, YaRN's as gpt-oss's converter writes them; a mixture of experts'
``expert_count``, ``expert_used_count`` and ``expert_feed_forward_length``), and the
default model's (SmolLM2) tokenizer copied whole, its vocabulary padded to the shape's
size with ``[PAD<id>]`` tokens of type UNUSED, exactly as ``convert_hf_to_gguf.py`` pads a
config whose ``vocab_size`` exceeds its tokenizer's.

Memory: the header is written first (``GGUFWriter``: key/values, then tensor infos), then
each tensor's data in chunks sliced from one pool of random values, so a 16 GB file needs
the pool (16 MiB) and one chunk, never a tensor (of any rank: a tensor's values are
written flat, in numpy's C order of its shape, which GGUFWriter states reversed as ggml's
dims).

A reduced shape (``shapes.with_layers``, ``<shape>-L<n>``) is written like any other, under
its own name; its description states the reduction.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import gguf
import numpy as np
from tqdm import tqdm

from recallspec.bench.common.llamacpp import BIN_ENV as LLAMACPP_BIN_ENV
from recallspec.bench.common.llamacpp import candidate_dirs as llamacpp_dirs
from recallspec.bench.common.shapes import (
    BIAS,
    FACTORS,
    MATRIX,
    NORM,
    ROUTER,
    Shape,
    TensorSpec,
    canonical_quant,
    get_shape,
    longrope_attn_factor,
    reduced_from,
    tensor_plan,
)
from recallspec.errors import ModelLoadError, RecallspecError, ResourceError
from recallspec.models.loader import cache_dir as recallspec_cache_dir
from recallspec.models.loader import default_model_path

GENERATOR_VERSION = 2  # bump when the bytes written for a (shape, seed) change
DEFAULT_SEED = 0
POOL_SIZE = 1 << 23  # random F16 values drawn once per file (16 MiB)
CHUNK = 1 << 20  # values per slice of the pool written at a time (2 MiB of F16)
WEIGHT_STD = 0.02  # matrices, biases and routers: N(0, 0.02), HF's initializer_range
UNUSED = 5  # llama.cpp's token type of padding ids (gguf.TokenType.UNUSED)
METADATA_BYTES = 16 << 20  # bound on header + key/values + tensor infos (a 152k vocabulary)
ALIGNMENT = 32  # GGUF's default data alignment (GGUFWriter's)
NAME = "recallspec random weights"  # general.name of every file

# Bits per parameter of a Q4_0 or Q4_K_M file, for the disk check only: upper estimates
# (llama-quantize keeps output.weight at Q6_K, and rows not a multiple of 256, as
# SmolLM2-360M's 960, fall back to Q5_0/Q8_0). F16, Q8_0 and MXFP4_MOE are counted per
# tensor (``quant_file_bytes``).
_BITS = {"Q4_0": 5.5, "Q4_K_M": 6.5}
# YaRN's beta_fast and beta_slow, gpt-oss's (its config.json's rope_scaling), which its
# converter copies into the file.
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0
QUANTIZE_ENV = "RECALLSPEC_LLAMA_QUANTIZE"
HASH_LIMIT = 1 << 30  # files up to this size get a sha256 in their manifest
DISK_MARGIN = 256 << 20
_GB = 1e9


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def f16_file_bytes(shape: Shape) -> int:
    """An upper bound of the F16 file's size (exact data, bounded metadata)."""
    return source_file_bytes(shape, "F16")


# The format a shape's random weights are written in before llama-quantize makes the
# other quantizations from it: F16, except a mixture of experts': Q8_0 blocks directly
# (its F16 file, 61 GB at Qwen3-30B-A3B, fits few disks; Q8_0 is 32 GB), requantized
# (``llama-quantize --allow-requantize``). Fixed per shape, so a (shape, seed, quant)
# names one file's bytes.
SOURCES = ("F16", "Q8_0")
Q8_BLOCK, Q8_BLOCK_BYTES = 32, 34  # ggml's block_q8_0: an f16 scale and 32 int8
MXFP4_BLOCK_BYTES = 17  # ggml's block_mxfp4 (of 32 weights): an E8M0 scale, 16 code bytes


def source_quant(shape: Shape, quant: str) -> str:
    """The format ``shape``'s file at ``quant`` is made from (itself when it is that)."""
    return "F16" if quant == "F16" or not shape.experts else "Q8_0"


def _data_bytes(spec: TensorSpec, source: str) -> int:
    """A tensor's data in the file: a matrix's in ``source``'s format, the rest float32."""
    if spec.kind == MATRIX and source == "Q8_0":
        return spec.numel // Q8_BLOCK * Q8_BLOCK_BYTES
    return spec.nbytes


def source_file_bytes(shape: Shape, source: str) -> int:
    """An upper bound of the size of the file ``write_shape_gguf`` writes in ``source``
    (exact data, bounded metadata)."""
    return sum(_align(_data_bytes(t, source)) for t in tensor_plan(shape)) + METADATA_BYTES


def _quant_data_bytes(spec: TensorSpec, quant: str) -> int:
    """A tensor's data in ``llama-quantize``'s ``quant`` (Q8_0 or MXFP4_MOE) output, by
    its choice per tensor (src/llama-quant.cpp): only MATRIX tensors are quantized (the
    router, norms, biases and 1-D tensors stay F32); MXFP4_MOE puts a stacked expert
    tensor (3-D) in MXFP4 and every other matrix, the head and embedding too, in Q8_0;
    Q8_0 every matrix. (A row not a multiple of 32 would fall back: counted at F16.)"""
    if spec.kind != MATRIX:
        return spec.nbytes
    if spec.shape[-1] % Q8_BLOCK:
        return spec.numel * 2
    block = MXFP4_BLOCK_BYTES if quant == "MXFP4_MOE" and len(spec.shape) == 3 else (
        Q8_BLOCK_BYTES)
    return spec.numel // Q8_BLOCK * block


def quant_file_bytes(shape: Shape, quant: str) -> int:
    """An upper bound of the size of ``shape``'s file at ``quant`` (the disk check's):
    F16, Q8_0 and MXFP4_MOE per tensor (exact data, bounded metadata); Q4_0 and Q4_K_M,
    whose per-tensor types llama-quantize picks by layer and row size, from an upper
    estimate of their bits per parameter (``_BITS``)."""
    q = canonical_quant(quant)
    if q == "F16":
        return source_file_bytes(shape, "F16")
    if q in _BITS:
        return int(shape.parameters() * _BITS[q] / 8)
    return sum(_align(_quant_data_bytes(t, q)) for t in tensor_plan(shape)) + METADATA_BYTES


# ---- the tokenizer -------------------------------------------------------------------
@functools.lru_cache(maxsize=2)
def _source_tokenizer(source: Path) -> tuple[tuple[str, Any, Any, Any], ...]:
    """(key, value, type, array item type) of every ``tokenizer.*`` key of ``source``
    (read once per process: GGUFReader takes seconds over a vocabulary)."""
    reader = gguf.GGUFReader(source)
    return tuple(
        (key, f.contents(), f.types[0], f.types[-1] if len(f.types) > 1 else None)
        for key, f in reader.fields.items() if key.startswith("tokenizer.")
    )


def tokenizer_fields(vocab: int, source: Path | None = None) -> list[tuple[str, Any, Any, Any]]:
    """The ``tokenizer.*`` keys of ``source`` (default: the default model's GGUF), the
    per-token arrays padded to ``vocab`` ids with UNUSED ``[PAD<id>]`` tokens."""
    if source is None:
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
              source: str = "F16") -> None:
    w = writer
    w.add_type("model")
    # (No shape name in general.name: llama.cpp sets token attributes by the model name
    # it finds there, e.g. Phi-3's for a name holding "phi3", and looks up Phi-3's tokens,
    # which the default model's vocabulary lacks; the description names the shape.)
    w.add_name(NAME)
    # (The text is part of the file's bytes, fixed by GENERATOR_VERSION: it names the module
    # that first wrote these files, and changes only with a version bump. A reduced
    # shape's says so, and of which published one.)
    full = reduced_from(shape)
    of = (shape.name if full is None else
          f"{full.name} reduced to {shape.layers} of its {full.layers} layers ({shape.name})")
    w.add_description(f"random weights (seed {seed}) at the published shape of {of}; "
                      "written by recallspec.bench.shapes for speed measurements only")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if source == "F16"
                    else gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    # The <arch>.* sizes (their order is part of the file's bytes too).
    for add, value in ((w.add_context_length, shape.context),
                       (w.add_embedding_length, shape.hidden), (w.add_block_count, shape.layers),
                       (w.add_feed_forward_length, shape.ffn), (w.add_head_count, shape.heads),
                       (w.add_head_count_kv, shape.kv_heads), (w.add_key_length, shape.head_dim),
                       (w.add_value_length, shape.head_dim),
                       (w.add_rope_dimension_count, shape.rotary_dim),
                       (w.add_rope_freq_base, shape.rope_theta),
                       (w.add_layer_norm_rms_eps, shape.rms_eps), (w.add_vocab_size, shape.vocab)):
        add(value)
    if shape.experts:  # (after the sizes: the dense shapes' bytes are unchanged)
        w.add_expert_count(shape.experts)
        w.add_expert_used_count(shape.experts_used)
        w.add_expert_feed_forward_length(shape.expert_ffn)
    if shape.rope_scaling == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(shape.rope_factor)
    elif shape.rope_scaling == "longrope":  # (no type key: Phi-3's converter writes none)
        w.add_rope_scaling_orig_ctx_len(shape.rope_original_context)
        w.add_rope_scaling_attn_factors(longrope_attn_factor(shape))
    elif shape.rope_scaling == "yarn":  # (conversion/base.py's yarn branch, its order)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(shape.rope_factor)
        w.add_rope_scaling_orig_ctx_len(shape.rope_original_context)
        w.add_rope_scaling_yarn_beta_fast(YARN_BETA_FAST)
        w.add_rope_scaling_yarn_beta_slow(YARN_BETA_SLOW)
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
    return tqdm(total=total, desc=label, unit="B", unit_scale=True, file=sys.stderr)


def _write_data(fout: IO[bytes], plan: list[TensorSpec], seed: int,
                advance: Callable[[int], object], weights: bool = True,
                source: str = "F16") -> None:
    """Each tensor's data, aligned as the tensor infos promised: matrices, biases and
    routers sliced from the pool at seeded random offsets (the F32 ones converted;
    ``weights`` False: skipped over, a hole), norms ones, RoPE factors theirs. A tensor of
    any rank is its numel values in C order, so chunks never see its shape. In ``source``
    Q8_0, matrices are whole blocks sliced from the pool quantized once to Q8_0 (ggml's
    reference rounding, ``gguf.quants``): the same values as an F16 file's up to Q8_0's
    rounding, at seeded block offsets."""
    rng = np.random.default_rng(seed)
    pool = (rng.standard_normal(POOL_SIZE, dtype=np.float32) * WEIGHT_STD).astype(np.float16)
    blocks = None
    if source == "Q8_0":
        blocks = np.asarray(gguf.quants.quantize(pool.astype(np.float32),
                                                 gguf.GGMLQuantizationType.Q8_0))
        blocks = blocks.reshape(-1, Q8_BLOCK_BYTES)
    for spec in plan:
        if spec.kind == MATRIX and blocks is not None:
            n, done = spec.numel // Q8_BLOCK, 0
            if not weights:
                fout.seek(n * Q8_BLOCK_BYTES, os.SEEK_CUR)
            while weights and done < n:
                k = min(CHUNK // Q8_BLOCK, n - done)
                off = int(rng.integers(0, len(blocks) - k + 1))
                fout.write(blocks[off:off + k].data)
                done += k
                advance(k * Q8_BLOCK_BYTES)
            size = n * Q8_BLOCK_BYTES
            fout.write(bytes(_align(size) - size))
            continue
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
                     tokenizer_source: Path | None = None, weights: bool = True,
                     source: str = "F16") -> int:
    """Write ``shape``'s random GGUF, its matrices in ``source`` (``SOURCES``: F16 or Q8_0
    blocks), to ``path`` (the caller renames it into place); returns its size in bytes.
    The same shape, seed and source give the same bytes.
    ``weights`` False leaves the matrices and biases unwritten: a sparse file of the same
    size and header whose weights read as zeros, to check a shape's header, config and
    RoPE tensors in seconds (it is no model to run: never cache or time one)."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, not {source!r}")
    plan = tensor_plan(shape)
    writer = gguf.GGUFWriter(path, shape.arch)
    _metadata(writer, shape, seed, tokenizer_fields(shape.vocab, tokenizer_source), source)
    for spec in plan:
        if spec.kind == MATRIX and source == "Q8_0":
            # (element shape, not a uint8 byte shape: GGUFWriter then states it as is)
            writer.add_tensor_info(spec.name, spec.shape, np.dtype(np.float32),
                                   _data_bytes(spec, source),
                                   raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor_info(spec.name, spec.shape, np.dtype(spec.dtype), spec.nbytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    assert writer.fout is not None and len(writer.fout) == 1  # one file, no shards
    assert writer.data_alignment == ALIGNMENT
    fout = writer.fout[0]
    fout.write(bytes(_align(fout.tell()) - fout.tell()))
    bar = _progress_bar(sum(_data_bytes(t, source) for t in plan
                            if t.kind in (MATRIX, BIAS, ROUTER)),
                        f"{shape.name} {source}") if weights else None
    try:
        _write_data(fout, plan, seed, bar.update if bar is not None else lambda _n: None,
                    weights, source)
        fout.flush()
        os.fsync(fout.fileno())
    finally:
        if bar is not None:
            bar.close()
        writer.close()
    return path.stat().st_size


def shapes_dir(cache_dir: Path | None = None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    return recallspec_cache_dir() / "shapes"


# ---- llama-quantize ------------------------------------------------------------------
def _peer_quantize() -> Path:
    """The native peer's llama-quantize, beside its llama-server and llama-bench
    (``llamacpp.candidate_dirs``: $RECALLSPEC_LLAMACPP_BIN alone when set, else where
    ``make peers`` puts them): the first directory that has one, else the first's path."""
    dirs = llamacpp_dirs()
    return next((d / "llama-quantize" for d in dirs if (d / "llama-quantize").is_file()),
                dirs[0] / "llama-quantize")


def find_quantize(quantize_bin: Path | None = None) -> Path | None:
    """``quantize_bin``, else $RECALLSPEC_LLAMA_QUANTIZE, else the native peer's (a
    ``make peers`` build once its peer.json exists, i.e. complete; any build named by
    $RECALLSPEC_LLAMACPP_BIN); None when none of them is given or built."""
    env = os.environ.get(QUANTIZE_ENV)
    if quantize_bin is not None or env:
        return Path(quantize_bin or str(env)).expanduser()
    peer = _peer_quantize()
    named = bool(os.environ.get(LLAMACPP_BIN_ENV))
    return peer if peer.is_file() and (named or (peer.parent / "peer.json").is_file()) else None


def _check_executable(binary: Path) -> None:
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise RecallspecError(f"llama-quantize {binary} is not an executable file")


def quantize_gguf(src: Path, dst: Path, quant: str, *, quantize_bin: Path,
                  threads: int | None = None, requantize: bool = False) -> None:
    """``llama-quantize [--allow-requantize] SRC DST TYPE THREADS`` (``requantize``: the
    source is block-quantized); a failure raises with its output's tail."""
    _check_executable(quantize_bin)
    cmd = [str(quantize_bin), *(["--allow-requantize"] if requantize else []), str(src),
           str(dst), canonical_quant(quant), str(threads or os.cpu_count() or 1)]
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", check=False)
    if r.returncode != 0 or not dst.is_file():
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-8:])
        raise RecallspecError(f"{' '.join(cmd)} failed (exit {r.returncode}):\n{tail}")


# ---- the cache -----------------------------------------------------------------------
def _identity(shape: Shape, quant: str, seed: int) -> dict[str, Any]:
    """The manifest fields a cached file must match to be reused (``source``: the format
    its random weights were written in, where not F16)."""
    src = source_quant(shape, quant)
    return {"generator_version": GENERATOR_VERSION, "seed": seed, "quant": quant,
            "shape": shape.to_dict(), **({"source": src} if src != "F16" else {})}


def _manifest_path(gguf: Path) -> Path:
    return gguf.with_suffix(".json")


def _cached(gguf: Path, identity: dict[str, Any]) -> bool:
    try:
        m = json.loads(_manifest_path(gguf).read_text())
        return (all(m.get(k) == v for k, v in identity.items())
                and m.get("file_bytes") == gguf.stat().st_size)
    except (OSError, ValueError):
        return False


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _publish(tmp: Path, gguf: Path, identity: dict[str, Any], **extra: Any) -> None:
    """Rename ``tmp`` to ``gguf``, then write its manifest (renamed in last)."""
    _manifest_path(gguf).unlink(missing_ok=True)
    os.replace(tmp, gguf)
    size = gguf.stat().st_size
    m = {**identity, **extra, "file": gguf.name, "file_bytes": size,
         "sha256": _sha256(gguf) if size <= HASH_LIMIT else None}
    mtmp = _temp(gguf).with_suffix(".json")
    mtmp.write_text(json.dumps(m, indent=2) + "\n")
    os.replace(mtmp, _manifest_path(gguf))


def _temp(gguf: Path) -> Path:
    """This process's temporary name for ``gguf`` (ends in .gguf, as llama-quantize
    likes its output)."""
    return gguf.with_name(f"{gguf.stem}.tmp-{os.getpid()}.gguf")


def _remove_stale(gguf: Path) -> None:
    """Delete temporary files of ``gguf`` left by processes that no longer run."""
    for p in gguf.parent.glob(f"{gguf.stem}.tmp-*"):
        pid = p.name.removeprefix(f"{gguf.stem}.tmp-").split(".")[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            p.unlink(missing_ok=True)
        except PermissionError:
            pass  # alive, another user's


def _check_disk(directory: Path, need: int, what: str) -> None:
    free = shutil.disk_usage(directory).free
    if free < need + DISK_MARGIN:
        raise ResourceError(
            f"not enough disk in {directory} for {what}: needs about {need / _GB:.1f} GB "
            f"(+{DISK_MARGIN >> 20} MiB margin), {free / _GB:.1f} GB free"
        )


def _stderr_say(message: str) -> None:
    print(f"recallspec: {message}", file=sys.stderr, flush=True)


def ensure_shape_gguf(
    shape_name: str, quant: str = "F16", *, cache_dir: Path | None = None,
    quantize_bin: Path | None = None, progress: Callable[[str], None] | None = None,
    seed: int = DEFAULT_SEED,
) -> Path:
    """The cached GGUF of ``shape_name`` (``get_shape``'s: a registry name, or
    ``<name>-L<n>``, its reduction to n layers) at ``quant`` (one of ``QUANTS``), written (and
    quantized by llama-quantize: ``find_quantize(quantize_bin)``) when missing or stale.
    ``progress`` receives one line per step (default: stderr)."""
    shape, q = get_shape(shape_name), canonical_quant(quant)
    say = progress or _stderr_say
    directory = shapes_dir(cache_dir)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"{shape.name}-{q}.gguf"
    identity = _identity(shape, q, seed)
    if _cached(final, identity):
        say(f"{shape.name} {q}: cached {final} ({final.stat().st_size / _GB:.2f} GB)")
        return final
    src = source_quant(shape, q)  # the intermediate's format
    inter = directory / f"{shape.name}-{src}.gguf"
    reuse = q != src and _cached(inter, _identity(shape, src, seed))
    binary = None
    if q != src:  # before writing gigabytes
        binary = find_quantize(quantize_bin)
        if binary is None:
            raise RecallspecError(
                f"{shape.name} {q}: llama-quantize not found: pass quantize_bin, set "
                f"{QUANTIZE_ENV}, or build the native peer (make peers)")
        _check_executable(binary)
    for p in (final, inter):
        _remove_stale(p)
    inter_bytes = source_file_bytes(shape, src)
    quant_bytes = quant_file_bytes(shape, q)
    _check_disk(directory, (0 if q == src or reuse else inter_bytes) + quant_bytes,
                f"{shape.name} {q}")
    source = inter if reuse else _temp(inter)
    try:
        if not reuse:
            say(f"{shape.name}: writing random {src} weights ({shape.parameters() / 1e9:.2f}B "
                f"parameters, {inter_bytes / _GB:.2f} GB, seed {seed}) to {directory}")
            write_shape_gguf(shape, source, seed=seed, source=src)
        if binary is None:
            _publish(source, final, identity, parameters=shape.parameters())
        else:
            say(f"{shape.name}: quantizing to {q} with {binary} "
                f"(up to about {quant_bytes / _GB:.2f} GB)")
            _quantize_into(source, final, identity, shape, binary, requantize=src != "F16")
        say(f"{shape.name} {q}: wrote {final} ({final.stat().st_size / _GB:.2f} GB)")
    finally:
        if source != inter and source.exists():  # the intermediate, or a partial file
            size = source.stat().st_size
            source.unlink()
            if q != src:
                say(f"{shape.name}: deleted the {src} intermediate ({size / _GB:.2f} GB)")
    return final


def _quantize_into(source: Path, final: Path, identity: dict[str, Any], shape: Shape,
                   binary: Path, requantize: bool = False) -> None:
    tmp = _temp(final)
    try:
        quantize_gguf(source, tmp, str(identity["quant"]), quantize_bin=binary,
                      requantize=requantize)
        _publish(tmp, final, identity, parameters=shape.parameters(),
                 quantize_bin=str(binary))
    finally:
        tmp.unlink(missing_ok=True)


__all__ = ["DEFAULT_SEED", "SOURCES", "ensure_shape_gguf", "f16_file_bytes", "find_quantize",
           "quant_file_bytes", "quantize_gguf", "shapes_dir", "source_file_bytes",
           "source_quant", "tokenizer_fields", "write_shape_gguf"]
