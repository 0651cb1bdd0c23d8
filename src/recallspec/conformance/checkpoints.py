"""A variant's files: its tiny random transformers checkpoint, the GGUF that llama.cpp's
own converter makes of it, and that GGUF quantized by ``llama-quantize``.

Everything is made at first use, seeded, and cached under the model cache
(``<cache>/conformance/<variant>-<key>/``, the key a hash of the variant, the
transformers version and this build's format), so CI downloads nothing and a later run
rebuilds nothing. A directory is built in a temporary sibling and renamed into place.

The converter is ``convert_hf_to_gguf.py`` of the llama.cpp source that
llama-cpp-python 0.3.36 vendors (commit 0c1e570; ``make install-dev`` extracts it into
``.venv/llama.cpp-src``; ``RECALLSPEC_LLAMA_CPP_SRC`` names another tree), run in a child
process of this Python (its own ``gguf-py`` first on its path, as the script arranges).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from recallspec.conformance.tokenizers import ConformanceSetupError, write_tokenizer
from recallspec.conformance.variants import Variant
from recallspec.models import cache_prune

BUILD_FORMAT = 2  # bump when what is built (or how) changes (2: the families' tokens)
SRC_ENV = "RECALLSPEC_LLAMA_CPP_SRC"
LLAMA_CPP_COMMIT = "0c1e570"
_VENDORED = Path("llama.cpp-src") / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"
_REPO = Path(__file__).resolve().parents[3]  # src/recallspec/conformance/ -> repo
QUANTS = ("Q8_0", "Q4_0", "Q4_K_M")


def llama_cpp_source() -> Path:
    """The llama.cpp source tree holding convert_hf_to_gguf.py and models/templates/."""
    env = os.environ.get(SRC_ENV)
    dirs = [Path(env)] if env else [Path(sys.prefix) / _VENDORED, _REPO / ".venv" / _VENDORED]
    for d in dirs:
        if (d / "convert_hf_to_gguf.py").is_file():
            return d
    raise ConformanceSetupError(
        f"llama.cpp's converter is not there ({', '.join(map(str, dirs))}): run "
        f"`make install-dev`, or set {SRC_ENV} to a llama.cpp source tree")


def conformance_dir() -> Path:
    from recallspec.models.loader import cache_dir

    return cache_dir() / "conformance"


@dataclass(frozen=True)
class Built:
    """A variant's files."""

    variant: Variant
    root: Path

    @property
    def hf_dir(self) -> Path:
        return self.root / "hf"

    @property
    def f32_gguf(self) -> Path:
        return self.root / "f32.gguf"

    def gguf(self, quant: str) -> Path:
        return self.f32_gguf if quant == "F32" else self.root / f"{quant}.gguf"


def _key(variant: Variant) -> str:
    import transformers

    blob = json.dumps({"variant": asdict(variant), "format": BUILD_FORMAT,
                       "transformers": transformers.__version__,
                       "llama.cpp": LLAMA_CPP_COMMIT}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _log(msg: str) -> None:
    print(f"recallspec conformance: {msg}", file=sys.stderr, flush=True)


def build(variant: Variant, root: Path | None = None) -> Built:
    """The variant's checkpoint and f32 GGUF, built once."""
    root = (root or conformance_dir()) / f"{variant.name}-{_key(variant)}"
    built = Built(variant, root)
    if built.f32_gguf.is_file():
        return built
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=root.name + ".tmp-", dir=root.parent))
    try:
        _log(f"{variant.name}: building the checkpoint (first use only)")
        _write_checkpoint(variant, tmp / "hf")
        _log(f"{variant.name}: converting with llama.cpp's convert_hf_to_gguf.py")
        _convert(tmp / "hf", tmp / "f32.gguf")
        try:
            os.rename(tmp, root)
        except OSError:
            if not built.f32_gguf.is_file():  # lost a race: the winner's copy is whole
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cache_prune.prune_builds(root.parent, root)  # one build per variant is kept
    return built


def quantized(built: Built, quant: str) -> Path:
    """The variant's GGUF in ``quant`` (llama-quantize of the f32 one), made once."""
    from recallspec.bench.common.shapes_gguf import find_quantize, quantize_gguf

    out = built.gguf(quant)
    if out.is_file():
        return out
    binary = find_quantize()
    if binary is None:
        raise ConformanceSetupError("llama-quantize is not built (run `make peers`)")
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    try:
        quantize_gguf(built.f32_gguf, tmp, quant, quantize_bin=binary, threads=2)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


# ---- the checkpoint --------------------------------------------------------------------


def _write_checkpoint(variant: Variant, out: Path) -> None:
    import torch
    import transformers

    out.mkdir(parents=True)
    tok_config = write_tokenizer(variant, out, llama_cpp_source())
    cfg = transformers.AutoConfig.for_model(variant.model_type, **variant.hf_config(
        tok_config["vocab_size"], tok_config["bos_id"], tok_config["eos_id"],
        tok_config["eos_id"]))
    torch.manual_seed(variant.seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    gen = torch.Generator().manual_seed(variant.seed + 1)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            # (gpt-oss's stacked expert biases are 2-D and initialised to zero.)
            if p.ndim == 1 or name.endswith("bias"):
                p.add_(torch.randn(p.shape, generator=gen) * 0.2)
            else:
                p.mul_(variant.scale * next(
                    (f for k, f in variant.scales.items() if name.endswith(k)), 1.0))
    model.save_pretrained(out)


def _convert(hf_dir: Path, out: Path) -> None:
    src = llama_cpp_source()
    cmd = [sys.executable, str(src / "convert_hf_to_gguf.py"), str(hf_dir),
           "--outtype", "f32", "--outfile", str(out)]
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env,
                       check=False)
    if r.returncode != 0 or not out.is_file():
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-12:])
        raise ConformanceSetupError(f"{' '.join(cmd)} failed (exit {r.returncode}):\n{tail}")
