"""A GGUF's first quantized load: the C++ repack gives today's numpy weights byte for
byte on whole real models, and the repack cache is written (and reported) or not."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from recallspec.cli import build_parser
from recallspec.engine import EngineConfig
from recallspec.errors import ModelLoadError
from recallspec.kernels import qformats as qf
from recallspec.kernels.qlinear import QuantizedWeight, Segment, default_bits, storage_policy
from recallspec.models import load_model, loader, resolve_model
from recallspec.models.gguf import quantized
from recallspec.runtime.batch import SequenceInput, build_batch


@pytest.fixture
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("RECALLSPEC_CACHE_DIR", str(cache))
    return cache


def packed_bytes(weights: dict[str, Any]) -> dict[str, bytes]:
    """Every tensor of a weights dict (quantized ones through their state_dict) as bytes."""
    out: dict[str, bytes] = {}
    for name, w in weights.items():
        tensors = w.state_dict(name + ".") if isinstance(w, QuantizedWeight) else {name: w}
        for key, t in tensors.items():
            out[key] = str(t.dtype).encode() + t.contiguous().view(torch.uint8).numpy().tobytes()
    return out


def numpy_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Route loads through the numpy path the C++ repack replaced: decode + pack of each
    whole tensor in the storage a load gives it here, and fused weights unpacked,
    concatenated and packed again."""

    def from_rows(cls: type[QuantizedWeight], ggml_type: Any, n: int, k: int,
                  chunks: Any, *, into: Any = None) -> QuantizedWeight:
        # each part on its own (``into`` ignored): the fused matrices stacked by copying
        qtype = qf.T(int(ggml_type))
        parts = sorted(((r0, np.array(raw)) for r0, raw in chunks), key=lambda p: p[0])
        raw = np.concatenate([p for _, p in parts])
        canon = qf.with_bits(qf.decode(raw, qtype, n, k), default_bits(qtype))
        return cls(n, k, qtype.name, (Segment.build(canon, 0, (qtype.name,)),))

    def stack(run: Any, n_off: int, kinds: tuple[str, ...]) -> Segment:
        return Segment.build(qf.concat([s.canon() for s in run]), n_off, kinds)

    monkeypatch.setattr(QuantizedWeight, "from_gguf_rows", classmethod(from_rows))
    monkeypatch.setattr(Segment, "stack", staticmethod(stack))


def first_load_weights(model: str) -> dict[str, Any]:
    """What a first quantized load of ``model`` builds (the cache file aside)."""
    config = loader.read_config(loader.model_dir(model))
    weights = quantized.quantized_state_dict(resolve_model(model), config)
    return loader.internal_weights(config, weights)


def real_models() -> list[str]:
    models = ["smollm2-135m"]
    try:
        loader.gemma3_path()
        models.append("gemma3-270m")
    except ModelLoadError:
        pass
    return models


@pytest.mark.parametrize("model", real_models())
def test_first_load_equals_numpy_path(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """SmolLM2 (Q4_1, Q8_0, llama's un-permuted Q/K) and Gemma 3 (Q4_K, Q5_0, Q6_K, Q8_0,
    fused across formats): every packed array identical, with a small chunk size so that
    large tensors arrive in many pieces."""
    monkeypatch.setattr(quantized, "CHUNK_BYTES", 1 << 20)
    fast = packed_bytes(first_load_weights(model))
    with monkeypatch.context() as m:
        numpy_reference(m)
        ref = packed_bytes(first_load_weights(model))
    assert fast.keys() == ref.keys()
    assert [k for k in fast if fast[k] != ref[k]] == []


@pytest.mark.parametrize("model", real_models())
def test_fused_parts_are_written_in_place(model: str) -> None:
    """A first load writes the parts of QKV and gate-up that share a block type into their
    fused arrays (``quantized._fused_parts``): the fused weight holds those very arrays,
    not a copy; parts of different types (Gemma's Q5_0 q/k beside a Q8_0 v) are stacked
    by copying (both equal the numpy path: ``test_first_load_equals_numpy_path``)."""
    config = loader.read_config(loader.model_dir(model))
    hf = quantized.quantized_state_dict(resolve_model(model), config)
    groups: dict[str, tuple[bool, torch.Tensor]] = {}
    for i in range(config.num_layers):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        for fused, names in ((f"layers.{i}.qkv_w", [a + f"{x}_proj.weight" for x in "qkv"]),
                             (f"layers.{i}.gate_up_w", [m + "gate_proj.weight",
                                                        m + "up_proj.weight"])):
            parts = [w for n in names if isinstance(w := hf[n], QuantizedWeight)]
            assert len(parts) == len(names)
            groups[fused] = (len({w.kind for w in parts}) == 1, parts[0].segments[0].qs)
    weights = loader.internal_weights(config, hf)
    in_place = {name: weights[name].segments[0].qs.data_ptr() == first.data_ptr()
                for name, (_, first) in groups.items()}
    assert in_place == {name: same for name, (same, _) in groups.items()}
    assert any(in_place.values())


def test_expert_parts_are_written_in_place(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A mixture of experts' stacked gate and up tensors are repacked straight into each
    expert's fused gate-up arrays, as a dense layer's parts are: no copy at fusing."""
    from recallspec.bench.common.shapes import SHAPES
    from recallspec.bench.common.shapes_gguf import ensure_shape_gguf

    monkeypatch.setenv("RECALLSPEC_CACHE_DIR", str(tmp_path / "models"))
    shape = SHAPES["tiny-qwen3moe"]
    gguf = ensure_shape_gguf(shape.name, "Q8_0", cache_dir=tmp_path, progress=lambda _m: None)
    config = loader.read_config(loader.model_dir(gguf))
    hf = quantized.quantized_state_dict(gguf, config)
    firsts = {(i, e): hf[f"model.layers.{i}.mlp.experts.{e}.gate_proj.weight"].segments[0].qs
              for i in range(config.num_layers) for e in range(config.num_experts)}
    weights = loader.internal_weights(config, hf)
    moved = [(i, e) for (i, e), first in firsts.items()
             if weights[f"layers.{i}.experts.{e}.gate_up_w"].segments[0].qs.data_ptr()
             != first.data_ptr()]
    assert len(firsts) == shape.layers * shape.experts and moved == []


CACHED = re.compile(r"recallspec: cached the repacked weights \(([\d,]+) MB, ([\d.]+)x the "
                    r"GGUF\) in (\S+); --no-repack-cache")


def test_repack_cache_written_and_reported(isolated_cache: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    gguf = resolve_model(None)
    model, _ = load_model(None, repack_cache=False)
    assert model.repack_cache_writer is None
    assert "cached the repacked" not in capsys.readouterr().err
    written = list(isolated_cache.rglob(quantized.QUANTIZED_WEIGHTS + "*"))
    assert written == []  # nothing of the weights, not even a temporary file
    directory, _ = loader._model_source(None)
    in_memory, writer = loader._gguf_weights(gguf, directory, loader.read_config(directory),
                                             "quantized", repack_cache=False)
    assert writer is None

    model, _ = load_model(None)  # the default: cached, written in the background
    assert model.repack_cache_writer is not None
    model.repack_cache_writer.join()
    match = CACHED.search(capsys.readouterr().err)
    assert match is not None
    path = Path(match[3])
    assert path == directory / quantized.QUANTIZED_WEIGHTS and path.is_file()
    size = path.stat().st_size
    assert match[1] == f"{size / 1e6:,.0f}"
    assert match[2] == f"{size / gguf.stat().st_size:.2f}"
    cached = quantized.load_quantized(path)
    assert cached is not None and packed_bytes(cached) == packed_bytes(in_memory)

    model, _ = load_model(None, repack_cache=False)  # a cache already there is read, kept
    assert model.repack_cache_writer is None
    assert path.stat().st_size == size and "cached the" not in capsys.readouterr().err
    model, _ = load_model(None)  # read from the cache: nothing to write
    assert model.repack_cache_writer is None


def test_repack_cache_option() -> None:
    assert EngineConfig().repack_cache is True
    with pytest.raises(ValueError, match="repack_cache must be True or False"):
        EngineConfig(repack_cache="no")  # type: ignore[arg-type]
    parser = build_parser()
    for argv in (["generate", "--prompt", "x"], ["serve"],
                 ["corpus", "generate", "--prompts", "p", "--out", "o"]):
        assert parser.parse_args(argv).repack_cache is True
        assert parser.parse_args([*argv, "--no-repack-cache"]).repack_cache is False


def test_repack_cache_failure_is_reported_and_loses_nothing(
        isolated_cache: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A cache that cannot be written (a full disk) leaves the loaded model whole: the
    background writer says so on stderr and raises nothing; the next load repacks."""

    def full_disk(weights: Any, path: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(quantized, "save_quantized", full_disk)
    model, tok = load_model(None)
    assert model.repack_cache_writer is not None
    model.repack_cache_writer.join()
    err = capsys.readouterr().err
    assert "the repack cache was not written ([Errno 28] No space left on device)" in err
    directory, _ = loader._model_source(None)
    assert not (directory / quantized.QUANTIZED_WEIGHTS).exists()
    monkeypatch.undo()
    reference, _ = load_model(None, repack_cache=False)
    ids = tok.encode("The printing press changed how knowledge spread, because")
    logits = [m(build_batch([SequenceInput(0, 0, ids)]), m.new_cache(1, 64))
              for m in (model, reference)]
    assert torch.equal(logits[0], logits[1])  # the same weights: the same bits


def test_first_load_equals_a_later_load(isolated_cache: Path) -> None:
    """A first load (the GGUF's tokenizer converted on a second thread while this one
    repacks its weights) and a later one from the converted directory and repack cache:
    the same tokens, the same logits bit for bit."""
    first, tok = load_model(None)
    assert first.repack_cache_writer is not None
    first.repack_cache_writer.join()
    later, tok_later = load_model(None)
    assert later.repack_cache_writer is None  # read from the cache
    ids = tok.encode("The printing press changed how knowledge spread, because")
    assert tok_later.encode("The printing press changed how knowledge spread, because") == ids
    logits = [m(build_batch([SequenceInput(0, 0, ids)]), m.new_cache(1, 64))
              for m in (first, later)]
    assert torch.equal(logits[0], logits[1])


def test_a_cache_of_another_storage_policy_is_rebuilt(isolated_cache: Path) -> None:
    """A repack cache records the storage its path gives each path-dependent type
    (``storage_policy``); one written under another policy (another path's, or from before
    the record: no policy at all) is not loaded at that storage but rebuilt at this path's,
    with the same logits."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    first, tok = load_model(None)
    assert first.repack_cache_writer is not None
    first.repack_cache_writer.join()
    directory, _ = loader._model_source(None)
    path = directory / quantized.QUANTIZED_WEIGHTS
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata())
    assert json.loads(meta["storage"]) == storage_policy()
    assert quantized.load_quantized(path) is not None
    tensors = load_file(str(path))
    other = {t: 14 - b for t, b in storage_policy().items()}  # 6 <-> 8: the other paths'
    for stale in ({**meta, "storage": json.dumps(other)},
                  {k: v for k, v in meta.items() if k != "storage"}):
        save_file(tensors, str(path), metadata=stale)
        assert quantized.load_quantized(path) is None
        again, _ = load_model(None)
        assert again.repack_cache_writer is not None  # repacked, and the cache rewritten
        again.repack_cache_writer.join()
        with safe_open(str(path), framework="pt") as f:
            assert json.loads(f.metadata()["storage"]) == storage_policy()
        ids = tok.encode("The printing press changed how knowledge spread, because")
        logits = [m(build_batch([SequenceInput(0, 0, ids)]), m.new_cache(1, 64))
                  for m in (first, again)]
        assert torch.equal(logits[0], logits[1])


@pytest.mark.skipif("gemma3-270m" not in real_models(),
                    reason="the Gemma-3-270M GGUF is not installed")
def test_six_bit_loads_hold_about_the_file(isolated_cache: Path) -> None:
    """Gemma-3-270M's Q4_K_M mix (Q4_K, Q6_K, Q5_0 q/k, Q8_0) loaded afresh: where the path
    reads 6-bit storage (default_bits; the VNNI paths too), Q6_K takes the file's 210
    bytes per 256 weights of a row, not 274, and Q5_0 6 bits + its scale: 1.013x the
    GGUF, so <= 1.02; where it keeps a byte per value (AVX-512 without VNNI, AMX) 1.087x,
    so <= 1.10."""
    model, _ = load_model("gemma3-270m", repack_cache=False)
    matrices = [model.embed_w, model.lm_head_w,
                *(m for layer in model.layers for m in layer.matrices())]
    segments = [s for w in matrices if isinstance(w, QuantizedWeight) for s in w.segments]
    six = default_bits(qf.T.Q6_K) == 6
    of_six_bit_types = [s for s in segments if {"Q6_K", "Q5_0"} & set(s.kinds)]
    assert of_six_bit_types and {s.bits for s in of_six_bit_types} == {6 if six else 8}
    ratio = model.weight_bytes() / resolve_model("gemma3-270m").stat().st_size
    assert ratio <= (1.02 if six else 1.10)


def test_first_load_tokenizer_error_loses_nothing(isolated_cache: Path, tmp_path: Path) -> None:
    """A GGUF whose weights load but whose tokenizer cannot be converted: the error of the
    conversion thread reaches the caller once the repack beside it has stopped, and the
    cache holds nothing of the file (no directory, no repack cache, no temporary)."""
    import gguf

    from recallspec.bench.common.shapes import SHAPES
    from recallspec.bench.common.shapes_gguf import tokenizer_fields, write_shape_gguf

    shape = SHAPES["tiny-llama"]
    source = tmp_path / "tokenizer.gguf"
    w = gguf.GGUFWriter(str(source), "llama")
    for key, value, vtype, sub in tokenizer_fields(shape.vocab):
        w.add_key_value(key, "nonsense" if key == "tokenizer.ggml.model" else value, vtype, sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    bad = tmp_path / "bad-tokenizer.gguf"
    write_shape_gguf(shape, bad, seed=0, tokenizer_source=source)
    with pytest.raises(ModelLoadError, match=r"cannot convert the tokenizer of .*'nonsense'"):
        load_model(str(bad))
    assert list((isolated_cache / "models").iterdir()) == []
