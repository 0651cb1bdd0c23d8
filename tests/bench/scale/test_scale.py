"""`recallspec bench scale`: our side measured on a real GGUF in a child process, the
prediction at another model's cost curve, the matrix and the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import FoldedByteTokenizer, needs_model
from helpers.replay import V, cycle_model, grid_curve

from recallspec.bench.common.shapes import SHAPES
from recallspec.bench.replay.exact import ReplayConfig, load_ar_answers
from recallspec.bench.scale.cold_start import ColdStartConfig, measure, summarize
from recallspec.bench.scale.command import _derive, _ours, paired_rounds
from recallspec.bench.scale.config import DEFAULT_MATRIX, ScaleConfig, parse_entries
from recallspec.bench.scale.moe import BOUNDS, bound_curve
from recallspec.bench.scale.predict import fitted_model, predict_at_curve
from recallspec.bench.scale.report import _experts_table, render_scale_markdown
from recallspec.cost.curve import CostCurve
from recallspec.engine import Engine, EngineConfig
from recallspec.errors import DataError


def test_matrix_and_config_are_checked() -> None:
    assert parse_entries(None, None) == DEFAULT_MATRIX
    published = {n for n in SHAPES if not n.startswith("tiny-") and not SHAPES[n].experts}
    assert {s for s, q in DEFAULT_MATRIX if q == "Q4_K_M"} == published  # every dense one
    # Any shape by name, or reduced to its first n layers (<name>-L<n>).
    assert ScaleConfig(entries=(("qwen3-30b-a3b", "Q4_K_M"),
                                ("qwen3-30b-a3b-L8", "Q4_K_M"))).entries[1][0] == (
        "qwen3-30b-a3b-L8")
    with pytest.raises(DataError, match="1 to 47 of its 48 layers"):
        ScaleConfig(entries=(("qwen3-30b-a3b-L48", "Q4_K_M"),))
    assert parse_entries("smollm2-1.7b,llama-3.1-8b", "Q4_0,Q8_0") == (
        ("smollm2-1.7b", "Q4_0"), ("smollm2-1.7b", "Q8_0"),
        ("llama-3.1-8b", "Q4_0"), ("llama-3.1-8b", "Q8_0"))
    with pytest.raises(DataError, match="unknown shape"):
        ScaleConfig(entries=(("gpt-9", "Q4_K_M"),))
    with pytest.raises(DataError, match="unknown quantization"):
        ScaleConfig(entries=(("smollm2-1.7b", "Q3_K"),))
    # MXFP4_MOE (a mixture's experts in MXFP4, as gpt-oss is published): mixtures only.
    assert ScaleConfig(entries=(("gpt-oss-20b", "MXFP4_MOE"), ("gpt-oss-20b-L4", "MXFP4_MOE"),
                                ("qwen3-30b-a3b", "MXFP4_MOE"))).entries[0] == (
        "gpt-oss-20b", "MXFP4_MOE")
    with pytest.raises(DataError, match=r"MXFP4_MOE quantizes a mixture's experts; "
                                        r"smollm2-1\.7b is a dense llama"):
        ScaleConfig(entries=(("gpt-oss-20b", "MXFP4_MOE"), ("smollm2-1.7b", "MXFP4_MOE")))
    with pytest.raises(DataError, match="include 1"):
        ScaleConfig(ks=(2, 4))
    with pytest.raises(DataError, match="'ar'"):
        ScaleConfig(answers="x", methods=("pld",))
    with pytest.raises(DataError, match="decode_rounds"):
        ScaleConfig(decode_rounds=-1)
    with pytest.raises(DataError, match="prefill_rounds"):
        ScaleConfig(prefill_rounds=-1)
    with pytest.raises(DataError, match="pair_idle_s"):
        ScaleConfig(pair_idle_s=-0.5)
    # (both refused before anything runs)
    with pytest.raises(ValueError, match="measure"):
        paired_rounds(Path("m.gguf"), ScaleConfig(), 1, "ttft", 1, print)
    with pytest.raises(ValueError, match="repeats"):
        paired_rounds(Path("m.gguf"), ScaleConfig(), 1, "prefill", 1, print, repeats=0)
    with pytest.raises(ValueError, match="not both"):  # neither a curve nor one side
        _ours(Path("m.gguf"), ScaleConfig(), None, print)
    with pytest.raises(DataError, match="ttft_repeats"):
        ScaleConfig(ttft_repeats=-1)
    with pytest.raises(DataError, match="repeats >= 1"):
        ColdStartConfig(repeats=0)


def _recorded_run(tmp_path: Path) -> tuple[list[dict[str, Any]], ReplayConfig]:
    from recallspec.bench.common.answers import answers_path
    from recallspec.bench.suite.runner import BenchConfig, run_bench

    eng = Engine(cycle_model(5), FoldedByteTokenizer(V), EngineConfig(max_len=512))
    run_bench(BenchConfig(suite="demo", methods=("ar", "pld:mode=fixed"), max_new_tokens=30),
              tmp_path, engine=eng, progress=False, log=lambda m: None)
    recs, _ = load_ar_answers(answers_path(tmp_path, "ar"))
    return recs, ReplayConfig(max_new_tokens=30, max_draft_nodes=16)


def test_prediction_prices_the_recorded_answers_with_the_shapes_curve(tmp_path: Path) -> None:
    """The overheads are fitted on the recorded run with its own curve; at a shape whose
    draft rows are nearly free (a large model streaming its weights once per forward)
    the sizing drafts more rows and speculation gains more than where rows are dear."""
    recs, cfg = _recorded_run(tmp_path)
    methods = ("ar", "pld:mode=fixed", "portfolio:mode=adaptive")
    fit, check = fitted_model(recs, cfg, grid_curve(), methods, tmp_path, lambda m: None)
    assert check["ar"]["recorded"] is not None and check["portfolio:mode=adaptive"][
        "recorded"] is None  # a method the run did not record has no error to show
    dear = predict_at_curve(recs, cfg, grid_curve(step=1.0, per_row=0.5), methods, fit)
    cheap = predict_at_curve(recs, cfg, grid_curve(step=1.0, per_row=0.005), methods, fit)
    pf = "portfolio:mode=adaptive"
    assert cheap[pf]["drafted"] > dear[pf]["drafted"]
    assert cheap[pf]["speedup_vs_ar"] > dear[pf]["speedup_vs_ar"]
    assert cheap["ar"]["speedup_vs_ar"] == 1.0
    # AR's forwards are one row: the row price does not change its prediction. (Not to
    # the bit: the policy's own measured seconds, microseconds a question, are counted.)
    assert cheap["ar"]["tokens_per_s"] == pytest.approx(dear["ar"]["tokens_per_s"], rel=1e-4)
    slower = predict_at_curve(recs, cfg, grid_curve(step=2.0, per_row=0.005), ("ar",), fit)
    assert slower["ar"]["tokens_per_s"] < cheap["ar"]["tokens_per_s"]


def test_a_mixtures_routing_bounds_order_the_prediction(tmp_path: Path) -> None:
    """A mixture of experts re-priced at its routing bounds: where draft rows wake no
    experts beyond one row's (full overlap) rows are cheaper than where they route
    uniformly, so the sizing drafts no fewer rows and speculation gains no less; the
    report labels every row."""
    recs, cfg = _recorded_run(tmp_path)
    methods = ("ar", "portfolio:mode=adaptive")
    fit, _ = fitted_model(recs, cfg, grid_curve(), methods, tmp_path, lambda m: None)
    measured = grid_curve(step=1.0, per_row=0.3)
    # 4 layers, 2 of 64 experts a row; the random router woke 1 more a layer per row.
    ks = measured.tokens
    ours = {"experts": 64, "experts_used": 2,
            "experts_touched": {str(k): 1.0 + k for k in ks},
            "experts_uniform": {str(k): 64 * (1 - (1 - 2 / 64) ** k) for k in ks},
            "weight_bytes": {"experts": 4 * 64 * 10**6}, "achieved_gb_s": 1e6 / 0.05 / 1e9}
    curves = {b: bound_curve(measured, ours, 4, b) for b in BOUNDS}
    assert curves["uniform"](8, context=100) > measured(8, context=100) > curves[
        "full-overlap"](8, context=100)
    pred = {b: predict_at_curve(recs, cfg, c, methods, fit) for b, c in curves.items()}
    pf = "portfolio:mode=adaptive"
    f, u = pred["full-overlap"][pf], pred["uniform"][pf]
    assert f["drafted"] >= u["drafted"] and f["speedup_vs_ar"] >= u["speedup_vs_ar"]
    res = _result({"shape": "qwen3-30b-a3b", "quant": "Q4_K_M", "file_bytes": 1})
    key = "qwen3-30b-a3b:Q4_K_M"
    res["entries"] = {key: res["entries"]["smollm2-1.7b:Q4_0"]}
    res["config"]["methods"] = list(methods)
    res["prediction"] = {"questions": len(recs), "model": "m", "answers": "a",
                         "replay_error_on_real_run": {},
                         "entries": {key: predict_at_curve(recs, cfg, measured, methods, fit)},
                         "bounds": {b: {key: v} for b, v in pred.items()}}
    md = render_scale_markdown(res)
    for label in ("measured routing", "uniform, estimated", "full-overlap, estimated"):
        assert f"| qwen3-30b-a3b ({label}) | Q4_K_M |" in md


def _result(entry: dict[str, Any]) -> dict[str, Any]:
    return {"machine": {"cpu": "test cpu", "cpus": 2, "kernels": "k", "loadavg_1m": 0.1},
            "date": "2026-11-27", "config": ScaleConfig().__dict__ | {"ks": (1, 8, 16)},
            "peer": {"llama_cpp_commit": "0c1e570", "cmake_args": ["-DGGML_NATIVE=ON"]},
            "stream": {"read_gb_s": 40.0, "buffer_mib": 1024},
            "entries": {"smollm2-1.7b:Q4_0": entry}}


def test_ratios_and_report_of_one_entry() -> None:
    entry: dict[str, Any] = {
        "shape": "smollm2-1.7b", "quant": "Q4_0", "file_bytes": 1_000_000_000,
        "token_bytes": 900_000_000,
        "ours": {"ar": {"decode_tok_s": 30.0}, "prefill_tok_s": 150.0, "achieved_gb_s": 30.0,
                 "cost_ms": {"1": 30.0, "8": 45.0, "16": 90.0}, "rss_mb": 1100.0,
                 "load_s": 2.0},
        "llamacpp": {"tg_tok_s": 25.0, "pp_tok_s": 75.0, "cost_ms": {"1": 40.0, "8": 80.0},
                     "rss_mb": 1050.0, "start_s": 0.5},
        "paired_decode": [{"first": "ours", "ours": 30.0, "llamacpp": 20.0},
                          {"first": "llamacpp", "ours": 26.0, "llamacpp": 20.0},
                          {"first": "ours", "ours": 28.0, "llamacpp": 25.0}],
        "paired_prefill": [{"first": "ours", "ours": 150.0, "llamacpp": 60.0},
                           {"first": "llamacpp", "ours": 140.0, "llamacpp": 70.0}],
        "ttft": {"summary": summarize({
            "ours_first": [{"first_token_s": 4.0, "load_s": 3.5, "exit_s": 6.0},
                           {"first_token_s": 5.0, "load_s": 4.5, "exit_s": 7.0},
                           {"first_token_s": 9.0, "load_s": 8.0, "exit_s": 9.5}],
            "ours_later": [{"first_token_s": 2.0, "import_s": 1.5}] * 3,
            "llamacpp": [{"first_token_s": 2.5, "ready_s": 2.0}] * 3})},
    }
    _derive(entry, {"read_gb_s": 40.0})
    d = entry["derived"]
    assert d["decode_vs_llamacpp"] == pytest.approx(1.2)
    # The paired rounds' ratios 1.5, 1.3, 1.12: their median and range.
    assert d["decode_vs_llamacpp_paired"] == pytest.approx(
        {"median": 1.3, "min": 1.12, "max": 1.5, "rounds": 3})
    assert d["prefill_vs_llamacpp"] == pytest.approx(2.0)
    # Two prefill rounds, 2.5x and 2.0x: the median is their mean.
    assert d["prefill_vs_llamacpp_paired"] == pytest.approx(
        {"median": 2.25, "min": 2.0, "max": 2.5, "rounds": 2})
    assert d["cost_ratio"]["8"] == pytest.approx(1.5)
    assert d["llamacpp_cost_ratio"]["8"] == pytest.approx(2.0)
    assert d["bandwidth_fraction"] == pytest.approx(0.75)
    assert d["rss_vs_file"] == pytest.approx(1.1)
    assert d["llamacpp_gb_s"] == pytest.approx(0.9 * 25.0)  # the bytes a token reads
    md = render_scale_markdown(_result(entry))
    row = next(line for line in md.splitlines() if line.startswith("| smollm2-1.7b | Q4_0"))
    # TTFT: the medians (first run 5.0 s of 4, 5, 9) and their ratios to llama-server's
    for cell in ("30.0 / 25.0", "1.20x", "150.0 / 75.0", "2.00x", "1.50x (2.00x)", "(75%)",
                 "1.10x", "5.00 / 2.00 / 2.50 (2.00x, 0.80x)"):
        assert cell in row, (cell, row)
    assert "commit 0c1e570" in md and "-DGGML_NATIVE=ON" in md
    assert "smollm2-1.7b Q4_0 1.30x (median of 3, 1.12x-1.50x)" in md
    assert "Prefill in paired rounds" in md and "llama-bench pp" in md
    assert "smollm2-1.7b Q4_0 2.25x (median of 2, 2.00x-2.50x)" in md


@needs_model
def test_our_side_measures_a_real_gguf_in_a_child(tmp_path: Path) -> None:
    """The child that measures one GGUF: every figure present and sane, and the curve it
    writes is a cost curve the replay can price with (decode and prefill grids)."""
    from recallspec.models import resolve_model

    gguf = resolve_model(None)
    curve_file = tmp_path / "curve.json"
    proc = subprocess.run(
        [sys.executable, "-m", "recallspec.bench.scale.ours", str(gguf), "--repeats", "1",
         "--new-tokens", "4", "--prefill", "32", "--ks", "1,2,4", "--cached", "64",
         "--contexts", "16", "--curve-out", str(curve_file), "--threads", "1"],
        capture_output=True, text=True, check=True, timeout=600)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["threads"] == 1
    assert res["ar"]["decode_tok_s"] > 0 and res["prefill_tok_s"] > 0
    assert set(res["cost_ms"]) == {"1", "2", "4"} and min(res["cost_ms"].values()) > 0
    # RSS holds at least the weights the model keeps resident.
    assert res["rss_mb"] >= res["resident_weight_mb"] > 0
    assert res["peak_rss_mb"] >= res["rss_mb"]
    assert res["achieved_gb_s"] > 0 and res["weight_bytes"]["total"] > 0
    curve = CostCurve.from_json(json.loads(curve_file.read_text()))
    assert curve.tokens == (1, 2, 4)
    assert curve.decode is not None and curve.decode.contexts == (16, 64)
    assert curve.prefill is not None and curve.prefill.rows == (32, 128)
    assert curve(2, 1, 64) == pytest.approx(res["cost_ms"]["2"] / 1000)
    # A paired round's child: the decode or the prefill only, no curve.
    for only, has, lacks in (("decode", "ar", "prefill_tok_s"), ("prefill", "prefill_tok_s", "ar")):
        proc = subprocess.run(
            [sys.executable, "-m", "recallspec.bench.scale.ours", str(gguf), "--repeats", "1",
             "--new-tokens", "4", "--prefill", "32", "--only", only, "--threads", "1"],
            capture_output=True, text=True, check=True, timeout=600)
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        assert res[has] and lacks not in res and "cost_ms" not in res, (only, res)


def test_experts_touched_is_the_mean_over_its_chains() -> None:
    """``ours.experts_touched`` (the calibration's count, several chains a size): for each
    k the distinct experts per layer a chain of k rows after ``cached`` tokens woke, the
    mean over EXPERT_SAMPLES chains (the s-th: tokens cached + s k on), on a fake mixture
    that routes by token; a model without the native forward's counters is refused."""
    from helpers.routed import RoutedBigram, woken

    from recallspec.bench.scale.ours import EXPERT_SAMPLES, experts_touched
    from recallspec.cost.calibration import random_ids

    model = RoutedBigram(torch.randn(200, 200, generator=torch.Generator().manual_seed(0)),
                         experts=16)
    ks, cached = (4, 1, 8), 20
    res = experts_touched(model, ks, cached)
    ids = random_ids(model, cached + max(ks) * EXPERT_SAMPLES)
    want = {str(k): sum(woken(ids[cached + s * k : cached + (s + 1) * k], 16)
                        for s in range(EXPERT_SAMPLES)) / EXPERT_SAMPLES for k in ks}
    assert res["experts_touched"] == pytest.approx(want)
    assert list(res["experts_touched"]) == ["4", "1", "8"]  # (in the order asked)
    assert res["experts_uniform"] == pytest.approx(
        {str(k): 16 * (1 - (1 - 1 / 16) ** k) for k in ks})
    assert (res["experts"], res["experts_used"]) == (16, 1)
    model.native = None  # type: ignore[assignment]
    with pytest.raises(ValueError, match="native forward"):
        experts_touched(model, ks, cached)


@needs_model
@pytest.mark.parametrize("name", ["tiny-qwen3moe", "tiny-gptoss"])
def test_our_side_counts_the_experts_a_mixture_wakes(name: str, tmp_path: Path) -> None:
    """A mixture of experts' child: the bytes a token reads count its routed experts'
    share only (gpt-oss: their biases too, not every expert's), and the experts a chain
    of k rows wakes per layer are counted: exactly experts_used for one row, never fewer
    for more rows, never more than k x experts_used or all of them."""
    from recallspec.bench.common.shapes_gguf import ensure_shape_gguf

    shape = SHAPES[name]
    gguf = ensure_shape_gguf(shape.name, "Q8_0", cache_dir=tmp_path, progress=lambda _m: None)
    env = {**os.environ, "RECALLSPEC_CACHE_DIR": str(tmp_path / "models")}
    proc = subprocess.run(
        [sys.executable, "-m", "recallspec.bench.scale.ours", str(gguf), "--repeats", "1",
         "--new-tokens", "4", "--prefill", "32", "--ks", "1,2,4,8", "--cached", "64",
         "--contexts", "16", "--curve-out", str(tmp_path / "curve.json"), "--threads", "1"],
        capture_output=True, text=True, check=True, timeout=600, env=env)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    e, used = shape.experts, shape.experts_used
    assert (res["experts"], res["experts_used"]) == (e, used)
    t = {int(k): v for k, v in res["experts_touched"].items()}
    assert t[1] == used
    assert all(t[a] <= t[b] for a, b in ((1, 2), (2, 4), (4, 8)))
    assert all(t[k] <= min(e, k * used) for k in t)
    assert res["experts_uniform"]["1"] == pytest.approx(used)
    wb = res["weight_bytes"]
    assert wb["experts_read"] * e == wb["experts"] * used
    assert wb["total"] < res["resident_weight_mb"] * 1e6 - (wb["experts"] - wb["experts_read"]) + 1
    table = "\n".join(_experts_table({"config": {"ks": [1, 2, 4, 8]}, "entries": {
        "x": {"shape": shape.name, "quant": "Q8_0", "ours": res}}}))
    assert f"| {shape.name} | Q8_0 | {used} of {e} |" in table
    assert f"{t[8]:.1f} ({res['experts_uniform']['8']:.1f})" in table


@needs_model
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3", "tiny-gptoss"])
def test_token_bytes_are_what_a_token_reads_of_the_file(name: str, tmp_path: Path) -> None:
    """llama.cpp's GB/s is priced at the bytes of the file a token reads, as ours is:
    every tensor, a mixture's stacked experts (gpt-oss's stacked biases too) at
    experts_used of experts, an untied embedding at one row; never the whole file (a
    mixture's is far less; a sparse file: its header and tensor sizes are all it needs)."""
    from recallspec.bench.common.shapes import tensor_plan
    from recallspec.bench.common.shapes_gguf import _data_bytes, write_shape_gguf
    from recallspec.bench.scale.command import token_bytes

    shape = SHAPES[name]
    src = "Q8_0" if shape.experts else "F16"
    path = tmp_path / f"{name}.gguf"
    size = write_shape_gguf(shape, path, seed=0, weights=False, source=src)
    want = 0
    for t in tensor_plan(shape):
        b = _data_bytes(t, src)
        if t.stacked:
            b = b // shape.experts * shape.experts_used
        elif t.name == "token_embd.weight" and not shape.tied:
            b //= shape.vocab
        want += b
    assert token_bytes(path) == want < size
    if shape.experts:
        assert want < 0.5 * size


@needs_model
def test_time_to_first_token_from_fresh_processes(tmp_path: Path) -> None:
    """Ours from fresh processes: the first run repacks the GGUF (and writes the repack
    cache), the later run reads that cache; each answers one token."""
    from recallspec.models import resolve_model

    res = measure(resolve_model(None), ColdStartConfig(threads=1, pause_s=0, peer=False),
                  scratch=tmp_path)
    (first,), (later,) = res["runs"]["ours_first"], res["runs"]["ours_later"]
    assert first["repacked"] and not later["repacked"]
    assert first["tokens"] == later["tokens"] == 1
    for run in (first, later):
        assert 0 < run["import_s"] < run["load_s"] < run["first_token_s"] < run["exit_s"]
    s = res["summary"]
    assert s["ours_first_token_s"] == first["first_token_s"]
    assert s["llamacpp_first_token_s"] is None and s["first_vs_llamacpp"] is None
    assert list(tmp_path.iterdir()) == []  # the first run's cache directory removed
