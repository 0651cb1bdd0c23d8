"""Compact weights: a GGUF's matrices kept in their own block formats.

``quantized_state_dict`` reads a GGUF into HF names and conventions, like
``convert.dequantized_state_dict`` (``models/gguf/convert.py``), but every matrix
becomes a ``QuantizedWeight`` (``kernels/qlinear.py``) holding the file's own integers
and scales, repacked once for the batch-invariant kernel; 1-D tensors (norms, biases)
stay float32. The two llama.cpp conventions are undone exactly as for the fp32 path: Q/K
rows of llama models are un-permuted (a row permutation, exact on block rows), Gemma
norms get ``- 1``.
Float matrices (F32/F16/BF16 GGUFs, HF safetensors) are quantized to Q8_0 at load.

The repacked weights of a converted model are cached next to its fp32 ones
(``save_quantized`` / ``load_quantized``), so a later load is a memory map; the loader
skips that file when asked to (``load_model(repack_cache=False)``). The first load writes
it in the background (``save_in_background``): the model answers meanwhile, where writing
a file larger than the GGUF through the page cache had doubled the first load on a VM
disk.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np
import torch

from recallspec.errors import ModelLoadError
from recallspec.kernels import qformats as qf
from recallspec.kernels import qrepack
from recallspec.kernels.ggml_types import GGMLType, to_gguf, type_name
from recallspec.kernels.qlinear import QuantizedWeight, default_bits, storage_policy
from recallspec.models.config import ModelConfig
from recallspec.models.gguf import arch as gguf_arch
from recallspec.models.gguf.convert import norm_offset, qk_heads, tensor_target, unpermute_qk
from recallspec.models.gguf.header import Header, TensorInfo, read_header

QUANTIZED_WEIGHTS = "recallspec-quantized.safetensors"
# A mixture of experts' router (HF name ``...mlp.gate.weight``): a float matrix stays
# float (llama.cpp computes it so; rounding it to 8 bits would move which experts a row
# chooses), the model's product is the dense fp32 kernel.
ROUTER_SUFFIX = (".mlp.gate.weight", ".mlp.router.weight")  # Qwen3-MoE, gpt-oss
# bump when QuantizedWeight's state_dict layout changes (3: storage bits; 4: MXFP4's codes)
QUANT_FORMAT = 4
# Float matrices (no block format of their own) are quantized to this at load.
FLOAT_MATRIX_KIND = "Q8_0"
# Bytes of a quantized tensor read (and held) at a time while repacking: bounds the
# load's transient memory whatever the tensor's size (an 8B vocabulary's embedding is
# 430 MB of Q6_K), and is large enough that the per-chunk call costs nothing.
CHUNK_BYTES = 16 << 20

Weights = dict[str, "torch.Tensor | QuantizedWeight"]


def quantized_state_dict(path: Path, config: ModelConfig) -> Weights:
    """Every tensor of a GGUF with HF names: matrices quantized, the rest float32.
    The header is read without its metadata arrays (``header.read_header``); quantized matrices
    are read in chunks of rows and repacked as they arrive (``kernels/qrepack.py``)."""
    header = read_header(path)
    with open(path, "rb", buffering=0) as f:
        return _state_dict(header, config, f.fileno(), path)


def _state_dict(header: Header, config: ModelConfig, fd: int, path: Path) -> Weights:
    import gguf

    _, arch = gguf_arch.arch_of(header.metadata, str(path))
    float_types = {GGMLType.F32, GGMLType.F16, GGMLType.BF16}
    out: Weights = {}
    fused = _fused_parts(header)
    arrays: dict[str, qrepack.Packed] = {}  # a fused matrix's, by its first part's name
    for t in header.tensors:
        name = tensor_target(arch, t.name, path)
        if name is None:
            continue  # RoPE factors: the config holds them
        shape, qtype = t.shape, t.ggml_type  # [rows, cols] as numpy sees it
        if not isinstance(qtype, GGMLType):
            raise ModelLoadError(
                f"{t.name}: block type {type_name(qtype)} is not supported by the quantized "
                "path; load with dtype='float32'")
        if gguf_arch.EXPERT_PLACEHOLDER in name:
            out.update(_experts(t, name, qtype, fd, float_types, fused.get(t.name), arrays))
            continue
        permute = qk_heads(arch, t.name, config.num_heads, config.num_kv_heads)
        rows = shape[0] if len(shape) == 2 else 1
        if len(shape) == 1 or qtype in float_types:
            _, raw = next(_row_chunks(fd, t.offset, rows, t.n_bytes // rows, 0))
            try:
                arr = gguf.quants.dequantize(raw, to_gguf(qtype))
            except Exception as e:
                raise ModelLoadError(f"cannot read {t.name} ({qtype.name}): {e}") from None
            arr = np.asarray(arr, dtype=np.float32).reshape(shape)
            if permute:
                arr = unpermute_qk(arr, permute)
            if norm_offset(arch, t.name):
                arr = arr + norm_offset(arch, t.name)
            tensor = torch.from_numpy(np.array(arr, dtype=np.float32, order="C", copy=True))
            out[name] = (
                tensor if tensor.ndim == 1 or name.endswith(ROUTER_SUFFIX)
                else QuantizedWeight.from_float(tensor, FLOAT_MATRIX_KIND)
            )
            continue
        # Q/K rows are permuted within heads: read whole (hidden rows at most), unpermuted.
        chunks: Iterable[tuple[int, np.ndarray]] = _row_chunks(
            fd, t.offset, rows, t.n_bytes // rows, 0 if permute else CHUNK_BYTES)
        if permute:
            chunks = [(0, unpermute_qk(whole, permute)) for _, whole in chunks]
        into = None
        if t.name in fused:
            key, total, first = fused[t.name]
            if key not in arrays:
                arrays[key] = qrepack.allocate(qtype, total, shape[1], default_bits(qtype))
            into = (arrays[key], total, first)
        try:
            out[name] = QuantizedWeight.from_gguf_rows(qtype, rows, shape[1], chunks,
                                                       into=into)
        except (ValueError, NotImplementedError) as e:
            raise ModelLoadError(
                f"{t.name}: block type {qtype.name} is not supported by the quantized "
                f"path ({e}); load with dtype='float32'"
            ) from None
    return out


def _experts(t: TensorInfo, name: str, qtype: GGMLType, fd: int,
             float_types: set[GGMLType], fused: tuple[str, int, int] | None,
             arrays: dict[str, qrepack.Packed]) -> Weights:
    """A stacked [experts, rows, cols] tensor as one matrix per expert under its
    per-expert name (``arch.expert_names``): the file's blocks of each expert's rows, or
    a float tensor's rows quantized to ``FLOAT_MATRIX_KIND`` like any float matrix.
    ``fused`` (``_fused_parts``): each expert's rows are repacked straight into its fused
    gate-up arrays (``arrays``, keyed by the plan's key and the expert)."""
    import gguf

    if len(t.shape) == 2 and name.endswith(".bias") and qtype in float_types:
        # gpt-oss's stacked expert biases [experts, rows]: one float32 vector per expert.
        _, raw = next(_row_chunks(fd, t.offset, 1, t.n_bytes, 0))
        arr = np.asarray(gguf.quants.dequantize(raw, to_gguf(qtype)), dtype=np.float32)
        arr = arr.reshape(t.shape)
        return {ename: torch.from_numpy(np.array(arr[e], order="C", copy=True))
                for e, ename in enumerate(gguf_arch.expert_names(name, t.shape[0]))}
    if len(t.shape) != 3:
        raise ModelLoadError(f"{t.name}: expert tensor of shape {t.shape}, expected "
                             "[experts, rows, cols]")
    experts, rows, cols = t.shape
    names = gguf_arch.expert_names(name, experts)
    row_bytes = t.n_bytes // (experts * rows)
    out: Weights = {}
    for e, ename in enumerate(names):
        chunks = _row_chunks(fd, t.offset + e * rows * row_bytes, rows, row_bytes,
                             0 if qtype in float_types else CHUNK_BYTES)
        if qtype in float_types:
            _, raw = next(chunks)
            arr = np.asarray(gguf.quants.dequantize(raw, to_gguf(qtype)), dtype=np.float32)
            dense = torch.from_numpy(np.array(arr.reshape(rows, cols), order="C", copy=True))
            out[ename] = QuantizedWeight.from_float(dense, FLOAT_MATRIX_KIND)
            continue
        into = None
        if fused is not None:
            key, total, first = fused
            key = f"{key}.{e}"
            if key not in arrays:
                arrays[key] = qrepack.allocate(qtype, total, cols, default_bits(qtype))
            into = (arrays[key], total, first)
        try:
            out[ename] = QuantizedWeight.from_gguf_rows(qtype, rows, cols, chunks, into=into)
        except (ValueError, NotImplementedError) as err:
            raise ModelLoadError(
                f"{t.name}: block type {qtype.name} is not supported by the quantized "
                f"path ({err}); load with dtype='float32'") from None
    return out


# The matrices a load fuses (``weights.internal_weights``: QKV, gate-up, each expert's
# gate-up), in their order.
_FUSED = (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"),
          ("ffn_gate_exps", "ffn_up_exps"))


def _fused_parts(header: Header) -> dict[str, tuple[str, int, int]]:
    """GGUF tensor name -> (its fused matrix's key, that matrix's rows, this part's first
    row there), for the fused matrices whose parts share one block type and row length
    and start groups of 16 rows: their rows are repacked straight into the fused arrays
    (``qrepack.repack(into=)``), which the fusing then takes as they are. Others (Gemma's
    Q5_0 q/k beside a Q8_0 v, float parts) are fused by copying, as before. Without it a
    first load wrote and faulted in each of these bytes twice (QKV and gate-up are ~2/3
    of a llama block's matrix bytes)."""
    by_name = {t.name: t for t in header.tensors}
    layers = sorted({int(n.split(".")[1]) for n in by_name
                     if n.startswith("blk.") and n.split(".")[1].isdigit()})
    plan: dict[str, tuple[str, int, int]] = {}
    for layer, group in ((i, g) for i in layers for g in _FUSED):
        found = [by_name.get(f"blk.{layer}.{part}.weight") for part in group]
        dims = 3 if group[0].endswith("_exps") else 2
        parts = [t for t in found if t is not None and len(t.shape) == dims]
        if (len(parts) < len(group) or parts[0].ggml_type not in qf.LAYOUTS
                or len({(t.ggml_type, t.shape[0] if dims == 3 else 0, t.shape[-1])
                        for t in parts}) > 1
                or any(t.shape[-2] % 16 for t in parts[:-1])):
            continue
        key, total, first = f"blk.{layer}.{group[0]}", sum(t.shape[-2] for t in parts), 0
        for t in parts:
            plan[t.name] = (key, total, first)
            first += t.shape[-2]
    return plan


def _row_chunks(fd: int, offset: int, rows: int, row_bytes: int,
                chunk_bytes: int) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, uint8 [rows, row_bytes]) pieces of a tensor at ``offset`` in the file,
    as read-only views of the file's pages (the GGUF is in the page cache after a first
    read, so nothing is copied): with chunk_bytes > 0, pieces of whole groups of 16 rows,
    each mapped on its own and unmapped once the consumer drops it (a consumer repacks a
    piece before asking for the next), so the file's pages count in this process's
    resident memory a piece at a time, never the whole file; with chunk_bytes=0, the
    whole tensor at once. ``read_header`` checked that every tensor lies inside the file;
    the size is checked again here because the file may have changed since, and a
    mapping past its end would kill the process (SIGBUS) instead of raising."""
    step = rows if chunk_bytes <= 0 else max(16, chunk_bytes // max(1, row_bytes) // 16 * 16)
    size = os.fstat(fd).st_size
    if offset + rows * row_bytes > size:
        raise ModelLoadError(f"GGUF file ends inside a tensor (offset {offset}, "
                             f"{rows * row_bytes} bytes, file {size} bytes)")
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        pos = offset + r0 * row_bytes
        start = pos - pos % mmap.ALLOCATIONGRANULARITY
        m = mmap.mmap(fd, pos + n * row_bytes - start, flags=mmap.MAP_SHARED | _POPULATE,
                      prot=mmap.PROT_READ, offset=start)
        yield r0, np.frombuffer(m, np.uint8, n * row_bytes, pos - start).reshape(n, row_bytes)


# Map a piece's pages in one call (they are in the page cache) rather than a fault per page.
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def quantize_floats(weights: Mapping[str, torch.Tensor]) -> Weights:
    """Internal-layout fp32 weights (HF safetensors) -> matrices quantized to Q8_0."""
    return {
        k: QuantizedWeight.from_float(v.float().contiguous(), FLOAT_MATRIX_KIND)
        if v.ndim == 2 and not k.endswith(".router_w") else v.float()
        for k, v in weights.items()
    }


def save_quantized(weights: Mapping[str, torch.Tensor | QuantizedWeight], path: Path) -> None:
    """One safetensors file; written to a temporary sibling and renamed into place, so a
    reader never sees a partial file."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    kinds: dict[str, str] = {}
    for name, w in weights.items():
        if isinstance(w, QuantizedWeight):
            tensors.update(w.state_dict(name + "."))
            kinds[name] = "q"
        else:
            tensors[name] = w.contiguous()
            kinds[name] = "t"
    meta = {"format": "recallspec-quantized", "version": str(QUANT_FORMAT),
            "storage": json.dumps(storage_policy()), "kinds": json.dumps(kinds)}
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".tmp-", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=meta)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def save_in_background(weights: Mapping[str, torch.Tensor | QuantizedWeight], path: Path,
                       gguf: Path) -> threading.Thread:
    """``save_quantized`` in a thread of its own, started; it reports the file's size on
    stderr when written, or why it was not (a full disk), and never raises. Not a daemon:
    the interpreter waits for it at exit, so a short run still leaves the cache. safetensors
    writes from the tensors' memory with the GIL released (no copy; the caller's forwards
    run meanwhile). Join it before timing anything on this machine (the cost curve)."""

    def write() -> None:
        if sys.platform == "linux":
            # This thread only (Linux gives each thread its own nice value): the model's
            # first forwards, on the other threads, keep the cores while it writes.
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        try:
            save_quantized(weights, path)
        except Exception as e:  # the weights in memory are whole: only the cache is lost
            print(f"recallspec: the repack cache was not written ({e}); the next load "
                  "repacks again", file=sys.stderr, flush=True)
            return
        size, src = path.stat().st_size, gguf.stat().st_size
        print(f"recallspec: cached the repacked weights ({size / 1e6:,.0f} MB, "
              f"{size / src:.2f}x the GGUF) in {path}; --no-repack-cache "
              "(repack_cache=False) to skip", file=sys.stderr, flush=True)

    thread = threading.Thread(target=write, name="recallspec-repack-cache")
    thread.start()
    return thread


def load_quantized(path: Path) -> Weights | None:
    """The cached weights, or None when the file is missing, of another format or
    written under another storage policy than this path's (``storage_policy``)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        if meta.get("version") != str(QUANT_FORMAT):
            return None
        if json.loads(meta.get("storage", "null")) != storage_policy():
            return None
        kinds: dict[str, str] = json.loads(meta["kinds"])
        tensors = load_file(str(path))
    except Exception:
        return None  # corrupt or stale: the caller rebuilds it from the GGUF
    out: Weights = {}
    for name, kind in kinds.items():
        out[name] = (
            QuantizedWeight.from_state_dict(tensors, name + ".") if kind == "q" else tensors[name]
        )
    return out
