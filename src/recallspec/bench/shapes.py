"""Random-weight GGUFs at the published shapes of the models people run (1-8B), cached.

What is random, and why the costs are still true: every matrix and bias is drawn from
N(0, 0.02) (slices of one seeded pool of F16 values at seeded offsets), every norm weight
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
real models (``bench/replay*``), never from these. The same (shape, seed, generator
version) gives the same bytes.

Files: ``<cache>/shapes/<shape>-<quant>.gguf`` (``<cache>``: ``RECALLSPEC_CACHE_DIR`` or
platformdirs' user cache dir of recallspec), each with a JSON manifest beside it
(``<shape>-<quant>.json``: the shape, seed, generator version, file size, sha256 for files
up to 1 GiB) that is written last and must match for a file to be reused. Quantized files
are made from the F16 one by llama.cpp's own ``llama-quantize``; the F16 intermediate is
deleted afterwards unless it was cached already. Everything is written to a temporary name
and renamed, so an interrupted run never leaves a file that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from recallspec.bench.shapes_gguf import (
    FACTORS,
    f16_file_bytes,
    tensor_plan,
    write_shape_gguf,
)
from recallspec.errors import RecallspecError, ResourceError, UnknownNameError

GENERATOR_VERSION = 2  # bump when the bytes written for a (shape, seed) change
DEFAULT_SEED = 0
ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "phi3", "smollm3")
# RoPE scalings a shape may state, as llama.cpp's converter writes them: "linear" as
# rope.scaling.type/factor, "llama3" as the rope_freqs tensor (no type key), "longrope" as
# rope_factors_long/short and rope.scaling.original_context_length/attn_factor.
ROPE_SCALINGS = ("none", "linear", "llama3", "longrope")
# The scalings each architecture's file may hold (the converter's and llama.cpp's: Llama
# 3's rope_freqs only in llama files, LongRoPE only in Phi-3's).
_ARCH_SCALINGS = {"llama": ("none", "linear", "llama3"), "phi3": ("none", "longrope")}
_SLIDING_ARCHS = ("gemma3", "phi3")  # attention.sliding_window is theirs (gguf_arch's keys)
QUANTS = ("F16", "Q8_0", "Q4_0", "Q4_K_M")  # llama-quantize's type names
# Bits per parameter of a quantized file, for the disk check only: upper estimates
# (llama-quantize keeps output.weight at Q6_K, and rows not a multiple of 256, as
# SmolLM2-360M's 960, fall back to Q5_0/Q8_0: that file is 5.98 bits at Q4_K_M).
_BITS = {"F16": 16.0, "Q8_0": 8.6, "Q4_0": 5.5, "Q4_K_M": 6.5}
QUANTIZE_ENV = "RECALLSPEC_LLAMA_QUANTIZE"
HASH_LIMIT = 1 << 30  # files up to this size get a sha256 in their manifest
DISK_MARGIN = 256 << 20
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_GB = 1e9


@dataclass(frozen=True)
class Shape:
    """A decoder-only model's shape: what llama.cpp and our loader need to build it.

    Per architecture (llama.cpp builds each with exactly these tensors): qwen2 has q/k/v
    biases, qwen3 and gemma3 q/k norms, gemma3 post-attention and post-FFN norms too (all
    its norms stored as 1 + w, as its converter writes them), phi3 one fused ``attn_qkv``
    and an ``ffn_up`` of 2 * ffn rows (gate, then up) with no ``ffn_gate``; smollm3 is
    llama's layout (llama.cpp leaves RoPE out of every 4th layer, which no key states)."""

    name: str  # registry key and file-name stem, e.g. "llama-3.1-8b"
    arch: str  # GGUF architecture: one of ARCHS
    hidden: int  # embedding_length
    layers: int  # block_count
    heads: int  # attention.head_count
    kv_heads: int  # attention.head_count_kv
    head_dim: int  # attention.key_length (Qwen3-4B: 128, not hidden / heads = 80)
    ffn: int  # feed_forward_length
    vocab: int  # token ids (embedding and head rows); >= the tokenizer's 49152
    tied: bool  # the head reuses token_embd (no output.weight)
    rope_theta: float
    context: int  # context_length (the published max_position_embeddings)
    qkv_bias: bool = False  # qwen2: biases on q, k and v (llama.cpp requires them)
    qk_norm: bool = False  # qwen3, gemma3: RMSNorm over head_dim on q and k
    rms_eps: float = 1e-5
    rope_dim: int = 0  # rope.dimension_count: rotated dims of a head (0: head_dim; phi3's
    #                    partial rotary: Phi-4-mini's 0.75 of 128 = 96)
    rope_scaling: str = "none"  # one of ROPE_SCALINGS
    rope_factor: float = 1.0  # linear, llama3: the factor; longrope: context / original
    rope_original_context: int = 0  # llama3, longrope: original_max_position_embeddings
    rope_low_freq_factor: float = 1.0  # llama3 (the converter's defaults: 1 and 4)
    rope_high_freq_factor: float = 4.0
    rope_theta_swa: float = 0.0  # gemma3: rope.freq_base_swa, the sliding layers' base
    sliding_window: int = 0  # gemma3, phi3: attention.sliding_window (0: none)

    def __post_init__(self) -> None:
        n = self.name
        if not _NAME.match(n):
            raise ValueError(f"shape name {n!r}: lower-case letters, digits, '.-_'")
        if self.arch not in ARCHS:
            raise ValueError(f"{n}: arch must be one of {', '.join(ARCHS)}")
        sizes = ("hidden", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab", "context")
        if any(getattr(self, f) < 1 for f in sizes) or self.rope_theta <= 0 or self.rms_eps <= 0:
            raise ValueError(f"{n}: sizes, rope_theta and rms_eps must be positive")
        if self.heads % self.kv_heads or self.head_dim % 2:
            raise ValueError(f"{n}: heads must be a multiple of kv_heads and "
                             "head_dim even (RoPE rotates pairs)")
        # llama.cpp builds each architecture with exactly these tensors.
        if self.qkv_bias != (self.arch == "qwen2"):
            raise ValueError(f"{n}: qkv_bias must be set exactly for qwen2 (llama.cpp's "
                             "qwen2 requires the biases, the others have none)")
        if self.qk_norm != (self.arch in ("qwen3", "gemma3")):
            raise ValueError(f"{n}: qk_norm must be set exactly for qwen3 and gemma3 "
                             "(llama.cpp requires their q/k norms, the others have none)")
        if self.arch in ("qwen2", "phi3") and self.heads * self.head_dim != self.hidden:
            raise ValueError(f"{n}: llama.cpp's {self.arch} needs heads * head_dim == hidden")
        self._check_rope()
        if self.sliding_window < 0 or (self.sliding_window and
                                       self.arch not in _SLIDING_ARCHS):
            raise ValueError(f"{n}: sliding_window is gemma3's and phi3's (>= 0)")
        swa = self.arch == "gemma3" and self.sliding_window > 0
        if (self.rope_theta_swa != 0) != swa or self.rope_theta_swa < 0:
            raise ValueError(f"{n}: rope_theta_swa (> 0, the sliding layers' RoPE base) must "
                             "be given exactly for gemma3 with a sliding_window")

    def _check_rope(self) -> None:
        n, kind = self.name, self.rope_scaling
        if self.rope_dim < 0 or self.rope_dim % 2 or self.rope_dim > self.head_dim:
            raise ValueError(f"{n}: rope_dim must be even, in [0, head_dim]")
        if self.rotary_dim != self.head_dim and self.arch != "phi3":
            raise ValueError(f"{n}: partial rotary (rope_dim {self.rope_dim} of "
                             f"{self.head_dim}) is phi3's only")
        if kind not in ROPE_SCALINGS:
            raise ValueError(f"{n}: rope_scaling must be one of {', '.join(ROPE_SCALINGS)}")
        allowed = _ARCH_SCALINGS.get(self.arch, ("none", "linear"))
        if kind not in allowed:
            raise ValueError(f"{n}: a {self.arch} file holds rope_scaling "
                             f"{' or '.join(allowed)}, not {kind!r}")
        if (kind == "none") != (self.rope_factor == 1.0) or self.rope_factor < 1.0:
            raise ValueError(f"{n}: rope_factor > 1 with a rope_scaling, 1.0 without")
        needs_orig = kind in ("llama3", "longrope")
        if needs_orig != (self.rope_original_context > 0) or self.rope_original_context < 0:
            raise ValueError(f"{n}: rope_original_context (> 0) is llama3's and longrope's")
        if kind == "longrope" and self.rope_factor != self.context / self.rope_original_context:
            raise ValueError(f"{n}: longrope's rope_factor must be context / "
                             f"rope_original_context = "
                             f"{self.context / self.rope_original_context:g}")
        low, high = self.rope_low_freq_factor, self.rope_high_freq_factor
        if kind == "llama3" and not 0 < low < high:
            raise ValueError(f"{n}: llama3 needs 0 < rope_low_freq_factor < "
                             "rope_high_freq_factor")
        if kind != "llama3" and (low, high) != (1.0, 4.0):
            raise ValueError(f"{n}: rope_low/high_freq_factor are llama3's")

    @property
    def rotary_dim(self) -> int:
        """The rotated dims of a head (rope.dimension_count)."""
        return self.rope_dim or self.head_dim

    def parameters(self) -> int:
        """Parameters of the model (a tied head counted once), from its tensors (the
        RoPE factor tensors, computed from the config, are none)."""
        return sum(t.numel for t in tensor_plan(self) if t.kind != FACTORS)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _tiny(name: str, arch: str, **kw: Any) -> Shape:
    """A test shape: 2 layers of width 256, built in a second."""
    base: dict[str, Any] = dict(hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64,
                                ffn=512, vocab=49152, tied=True, rope_theta=1e6,
                                context=2048, rms_eps=1e-6)
    return Shape(name, arch, **{**base, **kw})


# Llama 3.x's "llama3" RoPE scaling (config.json's rope_scaling: factor, low_freq_factor 1,
# high_freq_factor 4, original_max_position_embeddings 8192), which llama.cpp's converter
# writes as the rope_freqs tensor.
_LLAMA3: dict[str, Any] = dict(rope_scaling="llama3", rope_original_context=8192)

# From each model's config.json on the Hugging Face hub (the text model's, for Gemma 3).
SHAPES: dict[str, Shape] = {s.name: s for s in (
    Shape("smollm2-360m", "llama", hidden=960, layers=32, heads=15, kv_heads=5, head_dim=64,
          ffn=2560, vocab=49152, tied=True, rope_theta=1e5, context=8192),
    Shape("smollm2-1.7b", "llama", hidden=2048, layers=24, heads=32, kv_heads=32,
          head_dim=64, ffn=8192, vocab=49152, tied=True, rope_theta=1.3e5, context=8192),
    # meta-llama/Llama-3.2-1B: rope_scaling llama3, factor 32.
    Shape("llama-3.2-1b", "llama", hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64,
          ffn=8192, vocab=128256, tied=True, rope_theta=5e5, context=131072,
          rope_factor=32.0, **_LLAMA3),
    # meta-llama/Llama-3.2-3B: rope_scaling llama3, factor 32.
    Shape("llama-3.2-3b", "llama", hidden=3072, layers=28, heads=24, kv_heads=8,
          head_dim=128, ffn=8192, vocab=128256, tied=True, rope_theta=5e5, context=131072,
          rope_factor=32.0, **_LLAMA3),
    Shape("qwen2.5-1.5b", "qwen2", hidden=1536, layers=28, heads=12, kv_heads=2,
          head_dim=128, ffn=8960, vocab=151936, tied=True, rope_theta=1e6, context=32768,
          qkv_bias=True, rms_eps=1e-6),
    Shape("qwen3-4b", "qwen3", hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128,
          ffn=9728, vocab=151936, tied=True, rope_theta=1e6, context=40960, qk_norm=True,
          rms_eps=1e-6),
    # HuggingFaceTB/SmolLM3-3B (no rope_scaling; RoPE left out of every 4th layer).
    Shape("smollm3-3b", "smollm3", hidden=2048, layers=36, heads=16, kv_heads=4,
          head_dim=128, ffn=11008, vocab=128256, tied=True, rope_theta=5e6, context=65536,
          rms_eps=1e-6),
    # microsoft/Phi-4-mini-instruct: partial_rotary_factor 0.75, rope_scaling longrope
    # (48 long and 48 short factors, original_max_position_embeddings 4096), sliding_window
    # 262144 (llama.cpp disables Phi-3's window; larger than the context anyway).
    Shape("phi-4-mini", "phi3", hidden=3072, layers=32, heads=24, kv_heads=8, head_dim=128,
          ffn=8192, vocab=200064, tied=True, rope_theta=1e4, context=131072, rope_dim=96,
          rope_scaling="longrope", rope_factor=32.0, rope_original_context=4096,
          sliding_window=262144),
    # google/gemma-3-4b-it's text_config: rope_theta 1e6 (global layers, rope_scaling
    # linear 8), rope_local_base_freq 1e4, sliding_window 1024 (5 of every 6 layers),
    # vocab_size 262208 of which the converter keeps the tokenizer's 262144.
    Shape("gemma-3-4b", "gemma3", hidden=2560, layers=34, heads=8, kv_heads=4, head_dim=256,
          ffn=10240, vocab=262144, tied=True, rope_theta=1e6, context=131072, qk_norm=True,
          rms_eps=1e-6, rope_scaling="linear", rope_factor=8.0, rope_theta_swa=1e4,
          sliding_window=1024),
    # meta-llama/Llama-3.1-8B: rope_scaling llama3, factor 8.
    Shape("llama-3.1-8b", "llama", hidden=4096, layers=32, heads=32, kv_heads=8,
          head_dim=128, ffn=14336, vocab=128256, tied=False, rope_theta=5e5, context=131072,
          rope_factor=8.0, **_LLAMA3),
    # Tests: one per architecture (and per RoPE scaling); the qwen ones pad the vocabulary
    # (to a multiple of 256 and to a round number), tiny-qwen3 has heads * head_dim !=
    # hidden and an untied head; tiny-gemma3 (6 layers: 5 sliding ones, then a global one)
    # and tiny-smollm3 (4: the last without RoPE) have each kind of layer; tiny-phi3 rotates
    # Phi-4-mini's 96 of 128 dims (our native forward rotates multiples of 32).
    _tiny("tiny-llama", "llama", rope_theta=1e5, rms_eps=1e-5),
    _tiny("tiny-llama3", "llama", rope_theta=5e5, rope_factor=32.0, **_LLAMA3),
    _tiny("tiny-qwen2", "qwen2", vocab=49408, qkv_bias=True),
    _tiny("tiny-qwen3", "qwen3", vocab=50000, head_dim=128, tied=False, qk_norm=True),
    _tiny("tiny-gemma3", "gemma3", layers=6, head_dim=128, qk_norm=True,
          rope_scaling="linear", rope_factor=8.0, rope_theta_swa=1e4, sliding_window=8),
    _tiny("tiny-phi3", "phi3", hidden=512, head_dim=128, rope_theta=1e4, rms_eps=1e-5,
          rope_dim=96, rope_scaling="longrope", rope_factor=4.0, rope_original_context=512,
          sliding_window=4096),
    _tiny("tiny-smollm3", "smollm3", layers=4, rope_theta=5e6),
)}


def get_shape(name: str) -> Shape:
    s = SHAPES.get(name)
    if s is None:
        raise UnknownNameError(f"unknown shape {name!r} (known: {', '.join(SHAPES)})")
    return s


def canonical_quant(quant: str) -> str:
    for q in QUANTS:
        if q.lower() == quant.lower():
            return q
    raise UnknownNameError(f"unknown quantization {quant!r} (known: {', '.join(QUANTS)})")


def shapes_dir(cache_dir: Path | None = None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    from recallspec.models.loader import cache_dir as recallspec_cache

    return recallspec_cache() / "shapes"


# ---- llama-quantize ------------------------------------------------------------------
def _peer_quantize() -> Path:
    """Where ``make peers`` puts llama-quantize (complete once its peer.json exists).
    Until ``bench/llamacpp.py`` locates the native binaries, this is the only default."""
    return Path(sys.prefix) / "peers" / "llama.cpp" / "bin" / "llama-quantize"


def find_quantize(quantize_bin: Path | None = None) -> Path | None:
    """``quantize_bin``, else $RECALLSPEC_LLAMA_QUANTIZE, else the built peer's; None
    when none of them is given or built."""
    env = os.environ.get(QUANTIZE_ENV)
    if quantize_bin is not None or env:
        return Path(quantize_bin or str(env)).expanduser()
    peer = _peer_quantize()
    return peer if (peer.parent / "peer.json").is_file() and peer.is_file() else None


def _check_executable(binary: Path) -> None:
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise RecallspecError(f"llama-quantize {binary} is not an executable file")


def quantize_gguf(src: Path, dst: Path, quant: str, *, quantize_bin: Path,
                  threads: int | None = None) -> None:
    """``llama-quantize SRC DST TYPE THREADS``; a failure raises with its output's tail."""
    _check_executable(quantize_bin)
    cmd = [str(quantize_bin), str(src), str(dst), canonical_quant(quant),
           str(threads or os.cpu_count() or 1)]
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", check=False)
    if r.returncode != 0 or not dst.is_file():
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-8:])
        raise RecallspecError(f"{' '.join(cmd)} failed (exit {r.returncode}):\n{tail}")


# ---- the cache -----------------------------------------------------------------------
def _identity(shape: Shape, quant: str, seed: int) -> dict[str, Any]:
    """The manifest fields a cached file must match to be reused."""
    return {"generator_version": GENERATOR_VERSION, "seed": seed, "quant": quant,
            "shape": shape.to_dict()}


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
    """The cached GGUF of ``shape_name`` at ``quant`` (one of ``QUANTS``), written (and
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
    f16 = directory / f"{shape.name}-F16.gguf"
    reuse_f16 = q != "F16" and _cached(f16, _identity(shape, "F16", seed))
    binary = None
    if q != "F16":  # before writing gigabytes
        binary = find_quantize(quantize_bin)
        if binary is None:
            raise RecallspecError(
                f"{shape.name} {q}: llama-quantize not found: pass quantize_bin, set "
                f"{QUANTIZE_ENV}, or build the native peer (make peers)")
        _check_executable(binary)
    for p in (final, f16):
        _remove_stale(p)
    f16_bytes = f16_file_bytes(shape)
    quant_bytes = int(shape.parameters() * _BITS[q] / 8)
    _check_disk(directory, (0 if q == "F16" or reuse_f16 else f16_bytes) + quant_bytes,
                f"{shape.name} {q}")
    source = f16 if reuse_f16 else _temp(f16)
    try:
        if not reuse_f16:
            say(f"{shape.name}: writing random F16 weights ({shape.parameters() / 1e9:.2f}B "
                f"parameters, {f16_bytes / _GB:.2f} GB, seed {seed}) to {directory}")
            write_shape_gguf(shape, source, seed=seed)
        if binary is None:
            _publish(source, final, identity, parameters=shape.parameters())
        else:
            say(f"{shape.name}: quantizing to {q} with {binary} "
                f"(up to about {quant_bytes / _GB:.2f} GB)")
            _quantize_into(source, final, identity, shape, binary)
        say(f"{shape.name} {q}: wrote {final} ({final.stat().st_size / _GB:.2f} GB)")
    finally:
        if source != f16 and source.exists():  # the F16 intermediate, or a partial file
            size = source.stat().st_size
            source.unlink()
            if q != "F16":
                say(f"{shape.name}: deleted the F16 intermediate ({size / _GB:.2f} GB)")
    return final


def _quantize_into(source: Path, final: Path, identity: dict[str, Any], shape: Shape,
                   binary: Path) -> None:
    tmp = _temp(final)
    try:
        quantize_gguf(source, tmp, str(identity["quant"]), quantize_bin=binary)
        _publish(tmp, final, identity, parameters=shape.parameters(),
                 quantize_bin=str(binary))
    finally:
        tmp.unlink(missing_ok=True)


__all__ = ["ARCHS", "QUANTS", "ROPE_SCALINGS", "SHAPES", "Shape", "canonical_quant",
           "ensure_shape_gguf", "find_quantize", "get_shape", "quantize_gguf", "shapes_dir"]
