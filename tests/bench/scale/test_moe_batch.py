"""``bench scale``'s batched verification curve (``bench/scale/moe_batch.py``), measured by
our side's child (``bench/scale/ours.py``) at tiny shapes: what it counts and how the
cost model's price of it is composed. No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import needs_model

from recallspec.bench.common.shapes import SHAPES
from recallspec.bench.scale.config import ScaleConfig, seq_counts
from recallspec.bench.scale.moe_batch import BATCH_KS, BATCH_SEQS, BatchPlan
from recallspec.bench.scale.report import _batched_table
from recallspec.errors import DataError

POINT_KEYS = {"seqs", "k", "rows", "ms", "one_seq_ms", "priced_ms"}
MOE_POINT_KEYS = POINT_KEYS | {"experts", "one_seq_experts", "uniform", "most", "position",
                               "priced_routed_ms"}


def _ours(gguf: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    from recallspec.bench.scale import ours

    assert ours.main([str(gguf), "--repeats", "1", "--new-tokens", "4", "--prefill", "32",
                      "--ks", "1,2,4,8", "--cached", "64", "--contexts", "16",
                      "--threads", "1", *extra]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return out


def _gguf(name: str, quant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from recallspec.bench.common.shapes_gguf import ensure_shape_gguf

    monkeypatch.setenv("RECALLSPEC_CACHE_DIR", str(tmp_path / "models"))
    return ensure_shape_gguf(name, quant, cache_dir=tmp_path, progress=lambda _m: None)


def test_options_are_checked() -> None:
    assert seq_counts("0") == seq_counts("none") == ()
    assert seq_counts("1,2,8") == (1, 2, 8)
    with pytest.raises(DataError):
        ScaleConfig(batch_seqs=(0, 2))
    with pytest.raises(DataError):
        ScaleConfig(batch_ks=())
    with pytest.raises(ValueError):
        BatchPlan((1, 2), (0,), cached=8)
    plan = BatchPlan((2, 1), (4, 1), cached=8)
    assert plan.points() == [(1, 1), (2, 1), (1, 4), (2, 4)]
    assert plan.rows() == [1, 2, 4, 8]


def test_bench_scale_hands_the_options_to_its_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """The full measurement's child hears --batch-seqs only where it was set (else the
    child's default: a mixture's), 0 for none; a paired round's child hears neither."""
    import subprocess

    from recallspec.bench.scale import command

    seen: list[list[str]] = []

    def run(cmd: list[str], **_kw: Any) -> subprocess.CompletedProcess[str]:
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout="{}\n", stderr="")

    monkeypatch.setattr(command.subprocess, "run", run)
    for seqs, want in ((None, None), ((), "0"), ((1, 2), "1,2")):
        command._ours(Path("m.gguf"), ScaleConfig(batch_seqs=seqs, batch_ks=(2,)),
                      Path("c.json"), lambda _m: None)
        cmd = seen[-1]
        assert (cmd[cmd.index("--batch-seqs") + 1] if "--batch-seqs" in cmd else None) == want
        assert cmd[cmd.index("--batch-ks") + 1] == "2"
    command._ours(Path("m.gguf"), ScaleConfig(batch_seqs=(1, 2)), None, lambda _m: None,
                  only="decode")
    assert "--batch-seqs" not in seen[-1] and "--batch-ks" not in seen[-1]


@needs_model
@pytest.mark.parametrize("name", ["tiny-qwen3moe", "tiny-gptoss"])
def test_a_mixtures_batched_curve(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """By default a mixture measures B = 1, 2, 4, 8 sequences of k = 1, 4 rows: each
    forward wakes at least K and at most min(E, B k K) experts a layer; one sequence's
    forwards are the one-sequence curve's own (the same count); the chains of B k rows
    beyond the run's --ks are measured with it; the price is the one chain's plus
    (B - 1) per_seq, and at a single sequence's own routing it is unchanged; the report
    renders every point."""
    shape = SHAPES[name]
    e, used = shape.experts, shape.experts_used
    res = _ours(_gguf(name, "Q8_0", tmp_path, monkeypatch), capsys)
    b = res["batched"]
    assert {"cached", "seqs", "ks", "repeats", "samples", "per_seq_ms", "one_seq_measured",
            "points", "notes", "experts", "experts_used"} <= set(b)
    assert (b["seqs"], b["ks"], b["cached"]) == (list(BATCH_SEQS), list(BATCH_KS), 64)
    assert (b["experts"], b["experts_used"]) == (e, used)
    assert b["per_seq_ms"] >= 0
    # B x k = 16 and 32 rows are past --ks 1,2,4,8: measured as one chain here.
    assert b["one_seq_measured"] == [16, 32]
    pts = {(p["seqs"], p["k"]): p for p in b["points"]}
    assert set(pts) == {(s, k) for s in BATCH_SEQS for k in BATCH_KS}
    touched = res["experts_touched"]
    for (s, k), p in pts.items():
        n = s * k
        assert set(p) == MOE_POINT_KEYS and p["rows"] == n
        assert used <= p["experts"] <= min(e, n * used) + 1e-9, p
        assert used <= p["one_seq_experts"] <= min(e, n * used) + 1e-9, p
        assert p["uniform"] == pytest.approx(e * (1 - (1 - used / e) ** n))
        assert p["most"] == min(e, n * used)
        if str(n) in touched:  # the one chain: the one-sequence curve's own count and time
            assert p["one_seq_experts"] == pytest.approx(touched[str(n)])
            assert p["one_seq_ms"] == pytest.approx(res["cost_ms"][str(n)])
        assert p["priced_ms"] == pytest.approx(p["one_seq_ms"] + (s - 1) * b["per_seq_ms"])
        if s == 1:
            # One sequence: the same forwards as experts_touched's (counted here again).
            assert p["experts"] == pytest.approx(touched[str(k)], abs=1e-9)
            assert p["position"] == pytest.approx(0.0, abs=1e-9)
            assert p["priced_routed_ms"] == pytest.approx(p["priced_ms"])
    assert pts[(1, 1)]["experts"] == used
    table = "\n".join(_batched_table({"entries": {"x": {"shape": name, "quant": "Q8_0",
                                                        "ours": res}}}))
    assert "Batched verification" in table and "llama-bench has no mode" in table
    for (s, k), p in pts.items():
        assert (f"| {name} | Q8_0 | {s} x {k} | {s * k} | {p['ms']:.1f} | "
                f"{p['one_seq_ms']:.1f} (") in table
        assert (f"{p['experts']:.1f} ({p['one_seq_experts']:.1f}; {p['uniform']:.1f})"
                in table)
    assert all(f"- {n}" in table for n in b["notes"])


@needs_model
def test_only_the_batched_curve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    """``--only batched``: the batched curve alone, its one-sequence chains all measured
    with it (no decode, prefill or one-sequence curve)."""
    res = _ours(_gguf("tiny-qwen3moe", "Q8_0", tmp_path, monkeypatch), capsys,
                "--only", "batched", "--batch-seqs", "1,3", "--batch-ks", "2")
    assert "ar" not in res and "cost_ms" not in res and "experts_touched" not in res
    b = res["batched"]
    assert [(p["seqs"], p["k"]) for p in b["points"]] == [(1, 2), (3, 2)]
    assert b["one_seq_measured"] == [1, 2, 6]


@needs_model
def test_a_dense_shape_measures_it_only_when_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    gguf = _gguf("tiny-llama", "F16", tmp_path, monkeypatch)
    res = _ours(gguf, capsys, "--only", "batched")
    assert "batched" not in res
    res = _ours(gguf, capsys, "--only", "batched", "--batch-seqs", "1,2", "--batch-ks", "1,2")
    b = res["batched"]
    assert "experts" not in b
    for p in b["points"]:
        assert set(p) == POINT_KEYS
        assert p["priced_ms"] == pytest.approx(p["one_seq_ms"] + (p["seqs"] - 1) * b["per_seq_ms"])
    table = "\n".join(_batched_table({"entries": {"x": {"shape": "tiny-llama", "quant": "F16",
                                                        "ours": res}}}))
    assert "| tiny-llama | F16 | 2 x 2 | 4 |" in table
