"""Random-weight GGUFs at published shapes (``bench/shapes.py``, ``bench/shapes_gguf.py``):
the registry's numbers, the file llama.cpp's way, our loader on a tiny shape of each
architecture, the cache (reuse, interrupted writes, disk check) and quantization (a fake
``llama-quantize`` always; the real one when a binary is found).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from availability import native_peer_or_unavailable, unavailable
from helpers import needs_model

from recallspec.bench import shapes
from recallspec.bench.shapes import (
    QUANTS,
    SHAPES,
    Shape,
    ensure_shape_gguf,
    find_quantize,
    get_shape,
)
from recallspec.bench.shapes_gguf import UNUSED, tensor_plan, write_shape_gguf
from recallspec.errors import RecallspecError, ResourceError, UnknownNameError

BASE_VOCAB = 49152  # the default model's (SmolLM2) tokenizer
# Published parameter counts (model cards / safetensors totals).
PUBLISHED = {
    "smollm2-360m": 362e6, "smollm2-1.7b": 1.71e9, "llama-3.2-1b": 1.24e9,
    "llama-3.2-3b": 3.21e9, "qwen2.5-1.5b": 1.54e9, "qwen3-4b": 4.02e9,
    "llama-3.1-8b": 8.03e9,
}
TINY = ("tiny-llama", "tiny-qwen2", "tiny-qwen3")


# ---- the registry --------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_the_published_sizes(name: str) -> None:
    assert SHAPES[name].parameters() == pytest.approx(PUBLISHED[name], rel=0.02)


def test_registry_spot_checks() -> None:
    q3, l8, q2 = SHAPES["qwen3-4b"], SHAPES["llama-3.1-8b"], SHAPES["qwen2.5-1.5b"]
    assert q3.heads * q3.head_dim == 4096 != q3.hidden and q3.qk_norm
    assert not l8.tied and "output.weight" in {t.name for t in tensor_plan(l8)}
    assert q2.qkv_bias and "blk.0.attn_v.bias" in {t.name for t in tensor_plan(q2)}
    assert {s.arch for s in SHAPES.values()} == {"llama", "qwen2", "qwen3"}
    assert set(QUANTS) >= {"F16", "Q4_K_M", "Q4_0", "Q8_0"}


def test_shape_validation() -> None:
    base: dict[str, Any] = SHAPES["tiny-llama"].to_dict()
    with pytest.raises(ValueError, match="qkv_bias"):
        Shape(**{**base, "arch": "qwen2"})  # llama.cpp's qwen2 needs the biases
    with pytest.raises(ValueError, match="qwen2 needs"):
        Shape(**{**SHAPES["tiny-qwen2"].to_dict(), "head_dim": 128})
    with pytest.raises(ValueError, match="multiple"):
        Shape(**{**base, "kv_heads": 3})
    with pytest.raises(ValueError, match="name"):
        Shape(**{**base, "name": "../x"})
    with pytest.raises(UnknownNameError):
        get_shape("gpt-5")
    with pytest.raises(UnknownNameError):
        ensure_shape_gguf("tiny-llama", "Q5_K_S")


# ---- the file ------------------------------------------------------------------------
@needs_model
def test_file_layout_metadata_and_determinism(tmp_path: Path) -> None:
    import gguf

    shape = SHAPES["tiny-qwen3"]
    a, b, c = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    write_shape_gguf(shape, a, seed=1)
    write_shape_gguf(shape, b, seed=1)
    write_shape_gguf(shape, c, seed=2)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    r = gguf.GGUFReader(a)
    plan = tensor_plan(shape)
    assert [t.name for t in r.tensors] == [t.name for t in plan]
    for t, spec in zip(r.tensors, plan, strict=True):
        assert tuple(int(d) for d in reversed(t.shape)) == spec.shape
        assert t.tensor_type.name == ("F16" if len(spec.shape) == 2 else "F32")
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    assert f["general.architecture"] == "qwen3"
    assert f["qwen3.attention.key_length"] == 128 and f["qwen3.embedding_length"] == 256
    assert f["qwen3.vocab_size"] == 50000 and f["general.file_type"] == 1
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    assert len(tokens) == len(types) == 50000 and len(set(tokens)) == 50000
    assert tokens[BASE_VOCAB:][:1] == [f"[PAD{BASE_VOCAB}]"]
    assert set(types[BASE_VOCAB:]) == {UNUSED}
    norms = {t.name: t for t in r.tensors if t.name.endswith("norm.weight")}
    assert all(np.all(t.data == 1.0) for t in norms.values())
    q = next(t for t in r.tensors if t.name == "blk.0.attn_q.weight")
    w = np.asarray(q.data, dtype=np.float32)
    assert 0.015 < float(w.std()) < 0.025 and np.isfinite(w).all()


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The tiny shapes as F16 files, with a private model cache for their conversion."""
    root = tmp_path_factory.mktemp("shapes")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RECALLSPEC_CACHE_DIR", str(root / "cache"))
        yield {n: ensure_shape_gguf(n, cache_dir=root / "shapes", progress=lambda _m: None)
               for n in TINY}


@needs_model
@pytest.mark.parametrize("name", TINY)
def test_our_loader_runs_each_architecture(name: str, tiny_files: dict[str, Path]) -> None:
    from recallspec import Engine, SamplingParams
    from recallspec.runtime.batch import SequenceInput, build_batch

    shape = SHAPES[name]
    eng = Engine.load(str(tiny_files[name]), max_batch_size=1)
    c, tok = eng.model.config, eng.tokenizer
    assert (c.arch, c.vocab_size, c.hidden_size, c.head_dim, c.num_kv_heads) == (
        shape.arch, shape.vocab, shape.hidden, shape.head_dim, shape.kv_heads)
    assert (c.tie_embeddings, c.attention_bias, c.qk_norm) == (
        shape.tied, shape.qkv_bias, shape.qk_norm)
    assert tok.vocab_size == shape.vocab
    ids = tok.encode("The quick brown fox jumps over the lazy dog.")
    logits = eng.model(build_batch([SequenceInput(0, 0, ids)]), eng.model.new_cache(1, 64))
    assert logits.shape == (len(ids), shape.vocab) and bool(logits.isfinite().all())
    out = eng.generate("Hello", SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert len(out.token_ids) == 4 and all(0 <= t < shape.vocab for t in out.token_ids)
    padded = list(range(BASE_VOCAB - 2, shape.vocab))  # the last real ids and every pad id
    text = tok.decode(padded)
    assert isinstance(text, str)
    assert tok.decode([shape.vocab - 1]) == (
        f"[PAD{shape.vocab - 1}]" if shape.vocab > BASE_VOCAB else tok.decode([BASE_VOCAB - 1]))


# ---- the cache -----------------------------------------------------------------------
@needs_model
def test_manifest_reuse_and_rewrite(tmp_path: Path) -> None:
    said: list[str] = []
    p = ensure_shape_gguf("tiny-llama", "f16", cache_dir=tmp_path, progress=said.append)
    assert p == tmp_path / "tiny-llama-F16.gguf"
    m = json.loads(p.with_suffix(".json").read_text())
    assert m["file_bytes"] == p.stat().st_size and m["seed"] == shapes.DEFAULT_SEED
    assert m["shape"] == SHAPES["tiny-llama"].to_dict() and len(m["sha256"]) == 64
    mtime = p.stat().st_mtime_ns
    assert ensure_shape_gguf("tiny-llama", cache_dir=tmp_path, progress=said.append) == p
    assert p.stat().st_mtime_ns == mtime and "cached" in said[-1]
    ensure_shape_gguf("tiny-llama", cache_dir=tmp_path, progress=said.append, seed=5)
    assert p.stat().st_mtime_ns != mtime  # another seed: rewritten
    assert json.loads(p.with_suffix(".json").read_text())["seed"] == 5
    assert sorted(x.name for x in tmp_path.iterdir()) == ["tiny-llama-F16.gguf",
                                                          "tiny-llama-F16.json"]


def test_interrupted_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          ) -> None:
    def interrupted(shape: Shape, path: Path, *, seed: int) -> int:
        path.write_bytes(b"GGUF" + bytes(1000))
        raise KeyboardInterrupt

    stale = tmp_path / "tiny-llama-F16.tmp-99999999.gguf"  # a dead process's
    stale.write_bytes(b"GGUF")
    monkeypatch.setattr(shapes, "write_shape_gguf", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ensure_shape_gguf("tiny-llama", cache_dir=tmp_path, progress=lambda _m: None)
    assert list(tmp_path.iterdir()) == []


def test_disk_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shapes.shutil, "disk_usage", lambda _p: SimpleNamespace(free=10 << 30))
    with pytest.raises(ResourceError, match=r"llama-3.1-8b F16: needs about 16.1 GB"):
        ensure_shape_gguf("llama-3.1-8b", cache_dir=tmp_path, progress=lambda _m: None)
    assert list(tmp_path.iterdir()) == []


# ---- quantization ----------------------------------------------------------------------
def _fake_quantize(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in for llama-quantize: logs its arguments and copies SRC to DST."""
    log = tmp_path / "args.log"
    exe = tmp_path / "llama-quantize"
    exe.write_text(f'#!/bin/sh\necho "$@" >> {log}\ncp "$1" "$2"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe, log


def test_quantize_needs_a_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(shapes.QUANTIZE_ENV, raising=False)
    monkeypatch.setattr(shapes, "_peer_quantize", lambda: tmp_path / "none" / "llama-quantize")
    assert find_quantize() is None
    cache = tmp_path / "cache"
    with pytest.raises(RecallspecError, match="llama-quantize not found"):
        ensure_shape_gguf("tiny-llama", "Q4_K_M", cache_dir=cache, progress=lambda _m: None)
    assert list(cache.iterdir()) == []  # failed before writing the F16 file
    monkeypatch.setenv(shapes.QUANTIZE_ENV, str(tmp_path / "q"))
    assert find_quantize() == tmp_path / "q"
    with pytest.raises(RecallspecError, match="not an executable"):
        ensure_shape_gguf("tiny-llama", "Q8_0", cache_dir=cache, progress=lambda _m: None)
    assert list(cache.iterdir()) == []
    assert find_quantize(tmp_path / "p") == tmp_path / "p"


@needs_model
def test_quantize_pipeline_with_a_fake_binary(tmp_path: Path) -> None:
    exe, log = _fake_quantize(tmp_path)
    cache = tmp_path / "cache"
    said: list[str] = []
    p = ensure_shape_gguf("tiny-llama", "q8_0", cache_dir=cache, quantize_bin=exe,
                          progress=said.append)
    assert p == cache / "tiny-llama-Q8_0.gguf"
    args = log.read_text().split()
    assert args[2:3] == ["Q8_0"] and args[3].isdigit() and args[1].endswith(".gguf")
    assert sorted(x.name for x in cache.iterdir()) == ["tiny-llama-Q8_0.gguf",
                                                       "tiny-llama-Q8_0.json"]
    assert any("deleted the F16 intermediate" in s for s in said)
    assert json.loads(p.with_suffix(".json").read_text())["quant"] == "Q8_0"
    # A cached F16 file is the source and is kept.
    f16 = ensure_shape_gguf("tiny-llama", cache_dir=cache, progress=said.append)
    ensure_shape_gguf("tiny-llama", "Q4_0", cache_dir=cache, quantize_bin=exe,
                      progress=said.append)
    assert log.read_text().splitlines()[-1].split()[0] == str(f16) and f16.is_file()


@needs_model
@pytest.mark.peer
def test_quantize_with_llama_quantize(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      ) -> None:
    """The real llama-quantize ($RECALLSPEC_LLAMA_QUANTIZE or the built peer's); our
    loader runs its Q4_K_M output."""
    if not os.environ.get(shapes.QUANTIZE_ENV):
        native_peer_or_unavailable()  # CI builds the peer (.ci/run); a missing one fails
    exe = find_quantize()
    if exe is None or not exe.is_file():
        unavailable(f"no llama-quantize (set {shapes.QUANTIZE_ENV} or make peers)")
    from recallspec import Engine, SamplingParams

    monkeypatch.setenv("RECALLSPEC_CACHE_DIR", str(tmp_path / "models"))
    cache = tmp_path / "shapes"
    for q in ("Q8_0", "Q4_0", "Q4_K_M"):
        p = ensure_shape_gguf("tiny-llama", q, cache_dir=cache, progress=lambda _m: None)
        assert p.stat().st_size < 0.7 * SHAPES["tiny-llama"].parameters() * 2
    assert not list(cache.glob("*F16*"))
    eng = Engine.load(str(cache / "tiny-llama-Q4_K_M.gguf"), max_batch_size=1)
    out = eng.generate("Hello", SamplingParams(max_new_tokens=3, ignore_eos=True))
    assert len(out.token_ids) == 3
