"""`recallspec bench serve`: the Poisson schedule, the summary arithmetic on synthetic
records, and one end-to-end run against a real `recallspec serve` child process."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest
from helpers.availability import data_dir_or_unavailable

from recallspec.bench.serve.client import RequestRecord, poisson_arrivals
from recallspec.bench.serve.report import percentile, summaries, summarize
from recallspec.bench.serve.targets import check_loopback, make_target
from recallspec.errors import DataError


def test_poisson_schedule_is_reproducible_with_the_right_mean() -> None:
    a = poisson_arrivals(20_000, 2.0, seed=7)
    assert a == poisson_arrivals(20_000, 2.0, seed=7)
    assert a != poisson_arrivals(20_000, 2.0, seed=8)
    assert all(x < y for x, y in itertools.pairwise(a)) and a[0] > 0
    gaps = np.diff([0.0, *a])
    assert gaps.mean() == pytest.approx(0.5, rel=0.03)  # 1 / rate
    assert gaps.std() == pytest.approx(0.5, rel=0.05)  # exponential: sd = mean
    # Every rate stretches the same draws (common random numbers).
    assert poisson_arrivals(50, 0.5, seed=7) == pytest.approx([x * 4 for x in a[:50]])
    with pytest.raises(ValueError):
        poisson_arrivals(3, 0.0, seed=0)
    with pytest.raises(ValueError):
        poisson_arrivals(3, float("inf"), seed=0)


def test_percentile_matches_numpy() -> None:
    rng = random.Random(0)
    for n in (1, 2, 3, 10, 101):
        xs = [rng.uniform(0, 10) for _ in range(n)]
        for q in (0, 1, 50, 90, 99, 100):
            assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([], 50) is None


def _rec(i: int, sent: float, ttft: float, itl: list[float], tokens: int, *,
         ok: bool = True) -> RequestRecord:
    e2e = ttft + sum(itl)
    return RequestRecord("t", 1.0, i, str(i), "qa", scheduled_s=sent - 0.01, sent_s=sent,
                         end_s=sent + e2e, ok=ok, error=None if ok else "HTTP 500: boom",
                         ttft_s=ttft if ok else None, e2e_s=e2e if ok else None,
                         itl_s=itl if ok else [], output_tokens=tokens if ok else 0)


def test_summary_arithmetic_on_synthetic_records() -> None:
    recs = [
        _rec(0, 0.0, 0.10, [0.02, 0.02, 0.02], 4),  # ends at 0.16
        _rec(1, 1.0, 0.20, [0.05, 0.05], 3),  # ends at 1.30
        _rec(2, 2.0, 0.30, [0.01] * 9, 10),  # ends at 2.39: the span is 2.39 s
        _rec(3, 1.5, 0.0, [], 0, ok=False),  # an error: counted, not in the latencies
    ]
    s = summarize(recs)
    assert (s["requests"], s["completed"], s["errors"]) == (4, 3, 1)
    assert s["error_messages"] == ["HTTP 500: boom"]
    assert s["duration_s"] == pytest.approx(2.39)
    assert s["output_tokens"] == 17
    assert s["output_tok_per_s"] == pytest.approx(17 / 2.39)
    assert s["req_per_s"] == pytest.approx(3 / 2.39)
    assert s["ttft_s"]["p50"] == pytest.approx(0.20)
    assert s["ttft_s"]["p99"] == pytest.approx(0.298)  # 0.2 + 0.98 * 0.1
    itl = [0.02] * 3 + [0.05] * 2 + [0.01] * 9  # pooled over requests, one per token
    assert s["itl_s"]["mean"] == pytest.approx(sum(itl) / len(itl))
    assert s["itl_s"]["p50"] == pytest.approx(float(np.percentile(itl, 50)))
    assert s["itl_s"]["p99"] == pytest.approx(float(np.percentile(itl, 99)))
    assert s["e2e_s"]["p50"] == pytest.approx(0.30)
    assert s["max_send_lag_s"] == pytest.approx(0.01)
    two = summaries([*recs, RequestRecord("u", 2.0, 0, "0", "qa", 0.0)])
    assert [(x["target"], x["rate"]) for x in two] == [("t", 1.0), ("u", 2.0)]
    assert two[1]["output_tok_per_s"] is None  # never sent: no span, no division by zero


def test_targets_and_urls_are_checked() -> None:
    from recallspec.bench.serve.config import ServeBenchConfig

    with pytest.raises(DataError):
        ServeBenchConfig(targets=("ours-turbo",))
    with pytest.raises(DataError):
        ServeBenchConfig(rates=(0.0,))
    assert check_loopback("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    with pytest.raises(DataError):
        check_loopback("http://example.com:8000")
    cfg = ServeBenchConfig(adaptive_drafter="sam:index=x.rsidx")
    # A server given by URL gets the drafter per request; an index can't travel there.
    fixed = make_target("ours-fixed", cfg).request_fields(launched=False)
    assert fixed == {"recallspec": {"return_token_ids": True, "drafter": "pld",
                                    "drafter_options": {}, "mode": "fixed"}}
    with pytest.raises(DataError):
        make_target("ours-adaptive", cfg).request_fields(launched=False)
    assert make_target("ours-adaptive", cfg).request_fields(launched=True) == {
        "recallspec": {"return_token_ids": True}}


@pytest.mark.server
def test_end_to_end_against_a_real_server(tmp_path: Path) -> None:
    """3 Spec-Bench requests at one rate, max_tokens 8, through the CLI against a
    `recallspec serve` child with a fixed-size drafter."""
    from recallspec.cli import main
    data_dir_or_unavailable()
    out = tmp_path / "serve"
    rc = main(["bench", "serve", "--targets", "ours-fixed", "--rates", "4",
               "--per-category", "1", "--categories", "qa,translation,math_reasoning",
               "--max-tokens", "8", "--out", str(out)])
    assert rc == 0
    rep = json.loads((out / "serve.json").read_text())
    assert {"config", "workload", "machine", "sessions", "arrivals", "targets", "records",
            "summaries", "prefix_cache"} <= rep.keys()
    assert rep["config"]["context"] == 2048 and rep["workload"]["name"] == "spec_bench"
    assert rep["machine"]["cpus"] >= 1
    assert rep["targets"]["ours-fixed"]["skipped"] is None
    assert "--drafter" in rep["targets"]["ours-fixed"]["argv"]
    recs = rep["records"]
    assert len(recs) == 3 and {r["source"] for r in recs} == {"qa", "translation",
                                                              "math_reasoning"}
    assert {(r["workload"], r["turn"]) for r in recs} == {("spec_bench", 0)}
    assert [r["scheduled_s"] for r in recs] == pytest.approx(rep["arrivals"]["4.0"], abs=1e-6)
    for r in recs:
        assert r["ok"], r["error"]
        # Tokens counted from the stream's chunks are the server's own usage figure.
        assert r["streamed_tokens"] == r["usage_completion_tokens"] == r["output_tokens"]
        assert 1 <= r["output_tokens"] <= 8 and r["prompt_tokens"] > 0
        assert 0 < r["ttft_s"] <= r["e2e_s"]
        assert len(r["itl_s"]) <= r["output_tokens"] - 1 and all(x >= 0 for x in r["itl_s"])
        assert r["text"]
    (s,) = rep["summaries"]
    assert (s["target"], s["rate"], s["completed"], s["errors"]) == ("ours-fixed", 4.0, 3, 0)
    assert s["output_tokens"] == sum(r["output_tokens"] for r in recs)
    assert s["output_tok_per_s"] > 0 and s["e2e_s"]["p99"] >= s["e2e_s"]["p50"] > 0
    md = (out / "serve.md").read_text()
    assert "## 4 req/s" in md and "| ours-fixed |" in md and "TTFT p50" in md
    assert "TTFT 2+" not in md and "Prefix cache" not in md  # single-turn sessions
    assert (out / "serve.png").stat().st_size > 0
    assert (out / "logs" / "ours-fixed-4.log").is_file()


def test_llamacpp_targets_are_native_llama_server(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """llamacpp / llamacpp-<ngram type>: native llama-server, -np = --max-batch-size,
    -c = context x slots; without the binaries a note naming `make peers`."""
    from helpers.fake_llama_server import install

    from recallspec.bench.common.llamacpp import BIN_ENV
    from recallspec.bench.serve.config import DEFAULT_TARGETS, TARGETS, ServeBenchConfig
    from recallspec.bench.serve.targets import command, unavailable

    assert "llamacpp-ngram-mod" in TARGETS and set(DEFAULT_TARGETS) <= set(TARGETS)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    cfg = ServeBenchConfig(targets=("llamacpp", "llamacpp-ngram-map-k4v"), model=str(model),
                           threads=3, max_batch_size=4, context=1024)
    monkeypatch.setenv(BIN_ENV, str(tmp_path / "none"))
    assert "make peers" in (unavailable(make_target("llamacpp", cfg), cfg) or "")
    bin_dir = install(tmp_path / "bin")
    monkeypatch.setenv(BIN_ENV, str(bin_dir))
    plain, spec = (make_target(n, cfg) for n in cfg.targets)
    assert unavailable(plain, cfg) is None
    assert plain.request_fields(launched=True) == {"cache_prompt": True}
    argv, env = command(plain, cfg, 8123)
    assert argv[0] == str(bin_dir / "llama-server") and env == {}
    flags = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert (flags["-m"], flags["--port"], flags["-t"], flags["-tb"]) == (str(model), "8123",
                                                                         "3", "3")
    assert (flags["-np"], flags["-c"], flags["-fa"]) == ("4", str(4 * 1024), "on")
    assert "--spec-type" not in argv
    assert command(spec, cfg, 8123)[0][-2:] == ["--spec-type", "ngram-map-k4v"]
