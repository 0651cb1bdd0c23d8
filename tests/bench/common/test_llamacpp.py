"""Native llama.cpp, the benchmark peer (``bench/common/llamacpp.py``).

Without the binaries: locating them (``RECALLSPEC_LLAMACPP_BIN``, the error naming
``make peers``), the server's command line, and the server protocol against a stand-in
(``tests/fake_llama_server.py``). With them (``make peers``; CI builds them, and under
CI=true a missing peer FAILS instead of skipping): llama-server greedy and n-gram
speculation on a few tokens of the default model, llama-bench, and the peer methods in a
benchmark run with their identity to llama.cpp's own greedy answers reported.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import needs_model
from helpers.availability import native_peer_or_unavailable
from helpers.fake_llama_server import install

from recallspec.bench.common import llamacpp
from recallspec.bench.common.llamacpp import (
    BIN_ENV,
    LlamaCppCrashed,
    LlamaServer,
    PeerNotBuilt,
    ServerConfig,
    llama_bench,
)
from recallspec.errors import DataError

THREADS = min(2, os.cpu_count() or 1)


# ---- without the binaries -------------------------------------------------------------


def test_the_peer_line_names_a_build_at_another_optimization() -> None:
    """A report's peer line gives the ISA flags and a Release optimization other than
    CMake's (CI's -O1 build, Makefile PEER_OPT): such a build is never taken for the peer."""
    from recallspec.bench.common.report import peer_line

    args = ["-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DCMAKE_C_FLAGS_RELEASE=-O1 -DNDEBUG",
            "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG"]
    line = peer_line({"llama_cpp_commit": "0c1e570", "cmake_args": args, "recorded_by": "x"})[0]
    assert all(a in line for a in (args[0], args[2], args[3])) and "CURL" not in line


def test_missing_binaries_name_make_peers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BIN_ENV, str(tmp_path))
    assert not llamacpp.available()
    with pytest.raises(PeerNotBuilt, match="make peers"):
        llamacpp.bin_dir()
    with pytest.raises(PeerNotBuilt, match=BIN_ENV):
        LlamaServer(ServerConfig("m.gguf", 1)).start()
    monkeypatch.delenv(BIN_ENV)
    # The venv's own peers/ first (robust to where the repository or Python lives).
    assert llamacpp.candidate_dirs()[0] == (Path(sys.prefix) / "peers/llama.cpp/bin").resolve()


def test_server_config_and_command_line() -> None:
    with pytest.raises(DataError, match="ngram-simple"):
        ServerConfig("m.gguf", 2, spec_type="draft-simple")
    with pytest.raises(DataError):
        ServerConfig("m.gguf", 0)
    argv = ServerConfig("m.gguf", 3, ctx_per_slot=2048, parallel=4,
                        spec_type="ngram-mod").argv(Path("/x/llama-server"), 8080)
    assert argv[0] == "/x/llama-server" and "--no-webui" in argv
    flags = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert flags["-m"] == "m.gguf" and flags["--host"] == "127.0.0.1"
    assert flags["-t"] == flags["-tb"] == "3" and flags["-fa"] == "on"
    assert flags["-c"] == str(2048 * 4) and flags["-np"] == "4"  # -c is split over slots
    assert argv[-2:] == ["--spec-type", "ngram-mod"]
    assert "--spec-type" not in ServerConfig("m.gguf", 1).argv(Path("s"), 1)
    assert "--swa-full" not in argv
    assert ServerConfig("m.gguf", 1, swa_full=True).argv(Path("s"), 1)[-1] == "--swa-full"


def test_protocol_against_a_stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BIN_ENV, str(install(tmp_path / "bin")))
    with LlamaServer(ServerConfig("m.gguf", 1)) as server:
        c = server.complete([5, 6, 7], 2)
        proc = server._proc
        assert server.system_info is not None and server.system_info.startswith("system_info:")
        assert server.info["system_info"] == server.system_info and server.info["argv"]
    assert c.token_ids == [7, 8] and c.stop_type == "limit" and c.prompt_tokens == 3
    assert c.server_s == pytest.approx(0.010) and c.client_s > 0
    assert c.record()["timings"]["predicted_n"] == 2
    assert proc is not None and proc.poll() is not None  # stopped on exit
    # A test failing inside the block still stops the server.
    with pytest.raises(RuntimeError), LlamaServer(ServerConfig("m.gguf", 1)) as server:
        proc = server._proc
        raise RuntimeError("test failed")
    assert proc is not None and proc.poll() is not None
    # A server that dies: one error with how it ended and its log's last lines.
    monkeypatch.setenv("FAKE_LLAMA_CRASH_AFTER", "0")
    with LlamaServer(ServerConfig("m.gguf", 1)) as server, \
            pytest.raises(LlamaCppCrashed, match=r"SIGSEGV.*about to crash"):
        server.complete([1, 2], 1)
    rows = llama_bench("m.gguf", 1, n=(4, 8), repeats=1)
    assert [r["n_gen"] for r in rows] == [4, 8]


# ---- the real peer ----------------------------------------------------------------------


def _native() -> tuple[str, list[int]]:
    """The default model's GGUF and a short chat prompt's ids (skips outside CI, fails
    under CI=true, when the peer is not built)."""
    native_peer_or_unavailable()
    from recallspec.bench.common.hf import gguf_path_for
    from recallspec.bench.common.prompting import conversation_ids
    from recallspec.models import load_tokenizer

    tok = load_tokenizer(None)
    text = "Repeat this twice: the quick brown fox jumps over the lazy dog."
    return gguf_path_for(None), conversation_ids(tok, [text], [])


@needs_model
@pytest.mark.peer
def test_native_server_greedy_and_ngram() -> None:
    gguf, ids = _native()
    with LlamaServer(ServerConfig(gguf, THREADS, ctx_per_slot=512)) as server:
        greedy = server.complete(ids, 8, ignore_eos=True)
        again = server.complete(ids, 8, ignore_eos=True)
        info = server.info
    assert len(greedy.token_ids) == 8 and greedy.stop_type == "limit"
    t = greedy.timings
    # The prompt's ids as given (no BOS added), evaluated whole: prompt cache off.
    assert t["prompt_n"] == len(ids) == greedy.prompt_tokens and t["predicted_n"] == 8
    assert t["prompt_ms"] > 0 and t["predicted_ms"] > 0 and greedy.server_s > 0
    assert again.timings["prompt_n"] == len(ids) and again.token_ids == greedy.token_ids
    assert info["llama_cpp_commit"] == "0c1e570" and "cmake_args" in info
    assert info["system_info"].startswith("system_info:")
    assert not any("AMX" in f for f in info["system_info"].split("|") if "= 1" in f)
    spec = ServerConfig(gguf, THREADS, ctx_per_slot=512, spec_type="ngram-simple")
    with LlamaServer(spec) as server:
        ngram = server.complete(ids, 8, ignore_eos=True)
    assert len(ngram.token_ids) == 8 and ngram.timings["predicted_ms"] > 0


@needs_model
@pytest.mark.peer
def test_native_llama_bench_tg() -> None:
    gguf, _ = _native()
    (row,) = llama_bench(gguf, THREADS, n=4, repeats=1)
    assert (row["n_gen"], row["n_prompt"], row["n_depth"]) == (4, 0, 0)
    assert row["avg_ts"] > 0 and row["n_threads"] == THREADS
    assert row["build_commit"] == llamacpp.peer_info().get("llama_cpp_commit")


@needs_model
@pytest.mark.peer
def test_paired_rounds_with_the_native_peer() -> None:
    """A decode round and a prefill round of bench scale's pairs: ours in a fresh child
    and llama-bench, the order alternating by round; the median of the rounds' ratios."""
    from recallspec.bench.scale.command import paired_rounds, paired_summary
    from recallspec.bench.scale.config import ScaleConfig

    gguf, _ = _native()
    cfg = ScaleConfig(repeats=1, new_tokens=4, prefill=32, pair_idle_s=0.0)
    logs: list[str] = []
    for measure in ("decode", "prefill"):
        rounds = paired_rounds(Path(gguf), cfg, THREADS, measure, 2, logs.append)
        assert [r["first"] for r in rounds] == ["ours", "llamacpp"], logs
        assert all(r["ours"] > 0 and r["llamacpp"] > 0 and r["read_gb_s"] > 0 for r in rounds)
        summary = paired_summary(rounds)
        assert summary is not None and summary["rounds"] == 2
        assert summary["min"] <= summary["median"] <= summary["max"]
    assert not [m for m in logs if "failed" in m], logs


@needs_model
@pytest.mark.peer
def test_native_peer_methods_in_a_bench_run(tmp_path: Path) -> None:
    """llamacpp-greedy and llamacpp-ngram-simple answer the demo suite; the report
    says how many n-gram answers equal llama.cpp's own greedy ones."""
    from recallspec.bench.common.answers import answers_path, read_answers
    from recallspec.bench.common.suites import load_suite
    from recallspec.bench.suite.report import write_report
    from recallspec.bench.suite.runner import BenchConfig, run_bench
    from recallspec.models import load_tokenizer

    _native()
    from recallspec.engine import EngineConfig

    # A stand-in for our engine (peers only): what run_bench reads of one, its tokenizer,
    # threads and config (how it would size our methods, recorded in run.json).
    engine = SimpleNamespace(tokenizer=load_tokenizer(None), threads=THREADS,
                             config=EngineConfig())
    cfg = BenchConfig(suite="demo", methods=("llamacpp-greedy", "llamacpp-ngram-simple"),
                      max_new_tokens=8)
    logs: list[str] = []
    run_bench(cfg, tmp_path, engine=engine, progress=False, log=logs.append)
    assert not [m for m in logs if "failed" in m or "skipping" in m], logs
    n = len(load_suite("demo"))
    for m in cfg.methods:
        recs = read_answers(answers_path(tmp_path, m))
        assert len(recs) == n
        c = recs[0]["choices"][0]
        peer = c["peer"][0]
        assert c["wall_time"][0] == pytest.approx(peer["server_s"]) and peer["client_s"] > 0
        assert peer["timings"]["prompt_n"] == c["prompt_tokens"][0]
    rep = write_report(tmp_path)
    ngram = rep["methods"]["llamacpp-ngram-simple"]
    assert ngram["baseline"] == "llamacpp-greedy"
    assert ngram["stats"]["overall"]["identical"] is not None
    # The exact peer binary that answered is in the report: its commit and the
    # instruction sets its server printed, as recorded by this run.
    from recallspec.bench.common.llamacpp import peer_info
    from recallspec.bench.suite.report import render_markdown

    peer = rep["peer"]
    assert peer["recorded_by"] == "recorded by the run"
    assert peer["llama_cpp_commit"] == peer_info()["llama_cpp_commit"]
    assert peer["system_info"].startswith("system_info:")
    md = render_markdown(rep)
    assert f"commit `{peer['llama_cpp_commit']}`" in md
    # A build at another optimization says so (CI builds its peer at -O1).
    assert all(a in md for a in peer["cmake_args"] if "_FLAGS_RELEASE=" in a)


@needs_model
@pytest.mark.peer
def test_native_runtime_part() -> None:
    """`recallspec bench runtime`'s llama.cpp part on a few tokens: llama-bench tg / pp,
    the cost curve on a cached prefix, and greedy through the server."""
    from recallspec.bench.runtime.llamacpp import describe, llamacpp_runtime

    gguf, ids = _native()
    said: list[str] = []
    lc = llamacpp_runtime(gguf, ids, new_tokens=4, repeats=1, ks=(1, 4), cached=16,
                          threads=THREADS, say=said.append)
    assert lc is not None and not [m for m in said if "failed" in m], said
    assert lc["bench"]["tg"]["n_gen"] == 4 and lc["bench"]["pp"]["n_prompt"] == 512
    assert set(lc["cost_ms"]) == {"1", "4"} and min(lc["cost_ms"].values()) > 0
    g = lc["greedy"]
    assert g["prompt_n"] == len(ids) and g["decode_tok_s"] > 0 and g["e2e_s"] > 0
    assert "0c1e570" in describe(lc) and "system_info: " in describe(lc)


@needs_model
@pytest.mark.peer
@pytest.mark.server
def test_native_serve_targets(tmp_path: Path) -> None:
    """`recallspec bench serve` against llama-server, plain and with n-gram speculation:
    3 Spec-Bench requests each through the OpenAI chat endpoint, streamed."""
    import json

    from helpers.availability import data_dir_or_unavailable

    from recallspec.cli import main

    _native()
    data_dir_or_unavailable()
    out = tmp_path / "serve"
    rc = main(["bench", "serve", "--targets", "llamacpp,llamacpp-ngram-simple", "--rates", "4",
               "--per-category", "1", "--categories", "qa,translation,math_reasoning",
               "--max-tokens", "8", "--threads", str(THREADS), "--max-batch-size", "2",
               "--out", str(out)])
    assert rc == 0
    rep = json.loads((out / "serve.json").read_text())
    argv = rep["targets"]["llamacpp-ngram-simple"]["argv"]
    assert argv[-2:] == ["--spec-type", "ngram-simple"] and "-np" in argv
    # The report names the peer build that served (commit and flags).
    from recallspec.bench.common.llamacpp import peer_info

    commit = peer_info()["llama_cpp_commit"]
    assert rep["targets"]["llamacpp"]["peer"]["llama_cpp_commit"] == commit
    assert f"commit `{commit}`" in (out / "serve.md").read_text()
    assert len(rep["records"]) == 6
    for r in rep["records"]:
        assert r["ok"], r["error"]
        # One streamed chunk per token, drafts included: the server's own count.
        assert r["streamed_tokens"] == r["usage_completion_tokens"] == r["output_tokens"]
        assert 1 <= r["output_tokens"] <= 8
