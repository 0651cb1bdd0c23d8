"""Runtime benchmark: llama.cpp's side on a stand-in, settings, a tiny end-to-end run
(the byte accounting and bandwidth probe it reports: ``tests/bench/common/``)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from helpers import needs_model

from recallspec.bench.runtime.command import (
    RuntimeConfig,
    render_runtime_markdown,
    run_runtime_bench,
)
from recallspec.errors import DataError


def test_llamacpp_runtime_against_a_stand_in(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp's part of the runtime benchmark (llama-bench rows, the server's timings)
    and its Markdown, on the stand-in binaries (tests/fake_llama_server.py)."""
    from helpers.fake_llama_server import install

    from recallspec.bench.common.llamacpp import BIN_ENV
    from recallspec.bench.runtime.llamacpp import describe, llamacpp_runtime, table_rows

    monkeypatch.setenv(BIN_ENV, str(install(tmp_path / "bin")))
    said: list[str] = []
    lc = llamacpp_runtime("m.gguf", list(range(1, 40)), new_tokens=4, repeats=1, ks=(1, 4),
                          cached=16, threads=1, say=said.append)
    assert lc is not None and not [m for m in said if "failed" in m], said
    assert lc["bench"]["tg"]["n_gen"] == 4 and lc["bench"]["tg"]["avg_ts"] == 100.0
    assert lc["bench"]["pp"]["n_prompt"] == 512
    # k tokens past the 16 cached, 1 ms each in the stand-in's prompt cache
    assert lc["cost_ms"] == {"1": 1.0, "4": 4.0}
    g = lc["greedy"]  # the server's timings: 2 ms prefill, 8 ms for 3 decode steps
    assert g["e2e_s"] == pytest.approx(0.010) and g["decode_tok_s"] == pytest.approx(3 / 0.008)
    assert lc["info"]["system_info"].startswith("system_info:")
    rows = table_rows(lc)
    assert rows[0][0].startswith("llama.cpp llama-server greedy") and "tg4" in rows[1][0]
    assert "pp512" in rows[2][0]
    assert "system_info" in describe(lc)
    monkeypatch.setenv(BIN_ENV, str(tmp_path / "nothing"))
    assert llamacpp_runtime("m.gguf", [1], new_tokens=4, repeats=1, ks=(1,), cached=1,
                            threads=1, say=said.append) is None
    assert "make peers" in said[-1]


def test_config_validation() -> None:
    with pytest.raises(DataError):
        RuntimeConfig(dtypes=("float16",))
    with pytest.raises(DataError):
        RuntimeConfig(repeats=0)


@needs_model
def test_tiny_runtime_run(tmp_path: Path) -> None:
    _tiny(tmp_path, hf=False)


@needs_model
@pytest.mark.slow
@pytest.mark.skipif(not importlib.util.find_spec("transformers"), reason="transformers missing")
def test_tiny_runtime_run_with_transformers(tmp_path: Path) -> None:
    _tiny(tmp_path, hf=True)


def _tiny(tmp_path: Path, hf: bool) -> None:
    cfg = RuntimeConfig(repeats=1, new_tokens=4, dtypes=("quantized", "float32"), ks=(1, 4),
                        cached=64, stream_mib=64, hf=hf, llamacpp=False)
    res = run_runtime_bench(cfg, out=tmp_path, log=lambda m: None)
    q = res["dtypes"]["quantized"]
    # SmolLM2's GGUF is 98 MB (Q4_1 layers, Q8_0 tied embedding); resident <= 1.25x.
    assert 60 < q["resident_weight_mb"] < 1.25 * 98.4
    assert q["weight_bytes"]["total"] < 1.25 * 98.4e6 and q["weight_bytes"]["tied"] == 1
    r = res["dtypes"]["float32"]
    assert set(r["cost_ms"]) == {"1", "4"} and r["cost_ratio"]["1"] == 1.0
    # Timings only as sanity (no bounds: a loaded machine makes them anything).
    assert r["ours"]["decode_tok_s"] > 0 and r["bandwidth_fraction"] > 0
    # SmolLM2-135M in fp32: ~135M parameters * 4 bytes.
    assert 4.5e8 < r["weight_bytes"]["total"] < 6.5e8
    if cfg.hf:
        assert r["hf"]["decode_tok_s"] > 0 and set(r["hf_cost_ms"]) == {"1"}
    saved = json.loads((tmp_path / "runtime.json").read_text())["dtypes"]
    assert saved.keys() == {"quantized", "float32"}
    md = render_runtime_markdown(res)
    assert "| ours quantized |" in md and "| ours float32 |" in md
