"""Peer methods in child processes: a peer that crashes fails alone, the run goes on.

The children here are small scripts: ones that speak the peer protocol
(``bench/peers/worker.py``, the hf-* children), one answering every prompt and one
segfaulting (a real SIGSEGV, as llama.cpp's AMX kernels do under some hypervisors)
after a given number of prompts; and a stand-in for native ``llama-server``
(``tests/fake_llama_server.py``, the llamacpp-* methods) that segfaults the same way.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.bench import fake_engine
from helpers.fake_llama_server import install

from recallspec.bench.common.answers import answers_path, read_answers
from recallspec.bench.common.llamacpp import BIN_ENV, ServerConfig
from recallspec.bench.common.method import Method
from recallspec.bench.common.suites import load_suite
from recallspec.bench.peers.methods import ChildMethod, PeerCrashed, ServerMethod
from recallspec.bench.suite.methods import MethodFactory
from recallspec.bench.suite.report import write_report
from recallspec.bench.suite.runner import BenchConfig, run_bench

WORKER = """
import ctypes, json, sys
crash_after = int(sys.argv[1])
print(json.dumps({"ready": True, "info": {"fake": True}}), flush=True)
n = 0
for line in sys.stdin:
    req = json.loads(line)
    if n >= crash_after:
        sys.stderr.write("fake peer: about to crash\\n"); sys.stderr.flush()
        ctypes.string_at(0)  # SIGSEGV
    n += 1
    ids = [(t % 200) + 1 for t in req["prompt_ids"][-req["max_new_tokens"]:]]
    print(json.dumps({"token_ids": ids, "accept_lengths": [], "wall_time": 0.01,
                      "finish_reason": "length"}), flush=True)
"""


def _worker(tmp_path: Path) -> Path:
    p = tmp_path / "fake_peer.py"
    p.write_text(WORKER)
    return p


class FakePeers(MethodFactory):
    """hf-greedy: a child that crashes after ``crash_after`` prompts; hf-pld: a child that
    never crashes. Our own methods as usual."""

    def __init__(self, engine: Any, worker: Path, crash_after: int) -> None:
        super().__init__(engine, None)
        self.worker, self.crash_after = worker, crash_after

    def create(self, name: str) -> Method:
        if name.startswith("hf-"):
            n = self.crash_after if name == "hf-greedy" else 10**6
            cmd = [sys.executable, str(self.worker), str(n)]
            return ChildMethod(name, cmd, self.engine.tokenizer, "hf-greedy")
        return super().create(name)


def test_crashing_peer_fails_alone(tmp_path: Path) -> None:
    worker = _worker(tmp_path)
    out = tmp_path / "run"
    logs: list[str] = []
    engine = fake_engine()
    # 1 warm-up prompt + 2 prompts answered, then the segfault on the next one.
    cfg = BenchConfig(suite="demo", methods=("ar", "hf-greedy", "hf-pld", "pld"),
                      max_new_tokens=8)
    run_bench(cfg, out, engine=engine, progress=False, log=logs.append,
              factory=FakePeers(engine, worker, crash_after=3))
    n = len(load_suite("demo"))
    assert n >= 4
    for m in ("ar", "hf-pld", "pld"):
        assert len(read_answers(answers_path(out, m))) == n, m
    kept = read_answers(answers_path(out, "hf-greedy"))
    # The answers given before the crash stay on disk (2 prompts: a question or two,
    # depending on the demo questions' turns).
    assert 1 <= len(kept) < n
    crash_lines = [line for line in logs if line.startswith("hf-greedy failed")]
    assert len(crash_lines) == 1
    assert "killed by SIGSEGV" in crash_lines[0] and "about to crash" in crash_lines[0]
    rep = write_report(out)  # the report covers every method, the crashed one included
    assert {"ar", "hf-greedy", "hf-pld", "pld"} <= set(rep["methods"])


def test_peer_crash_at_start_is_one_clear_error(tmp_path: Path) -> None:
    worker = _worker(tmp_path)
    logs: list[str] = []
    engine = fake_engine()
    cfg = BenchConfig(suite="demo", methods=("ar", "hf-greedy"), max_new_tokens=8)
    run_bench(cfg, tmp_path / "run", engine=engine, progress=False, log=logs.append,
              factory=FakePeers(engine, worker, crash_after=0))  # dies on its warm-up
    assert len(read_answers(answers_path(tmp_path / "run", "ar"))) == len(load_suite("demo"))
    assert any(line.startswith("hf-greedy failed") and "SIGSEGV" in line for line in logs)


def test_child_that_exits_before_ready(tmp_path: Path) -> None:
    engine = fake_engine()
    cmd = [sys.executable, "-c", "import sys; sys.stderr.write('no model here\\n'); sys.exit(3)"]
    try:
        ChildMethod("hf-greedy", cmd, engine.tokenizer, "hf-greedy")
    except PeerCrashed as e:
        assert "exited with status 3" in str(e) and "no model here" in str(e)
    else:
        raise AssertionError("a child that exits at start must raise PeerCrashed")


class FakeServers(MethodFactory):
    """llamacpp-*: a stand-in llama-server each (it ignores the GGUF path)."""

    def create(self, name: str) -> Method:
        if name.startswith("llamacpp-"):
            spec = None if name == "llamacpp-greedy" else name.removeprefix("llamacpp-")
            cfg = ServerConfig("unused.gguf", 1, spec_type=spec)
            return ServerMethod(name, cfg, self.engine.tokenizer, "llamacpp-greedy")
        return super().create(name)


def test_crashing_llama_server_fails_alone(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BIN_ENV, str(install(tmp_path / "bin")))
    monkeypatch.setenv("FAKE_LLAMA_CRASH_AFTER", "3")  # the warm-up + 2 prompts answered
    out = tmp_path / "run"
    logs: list[str] = []
    engine = fake_engine()
    cfg = BenchConfig(suite="demo", methods=("ar", "llamacpp-greedy"), max_new_tokens=8)
    run_bench(cfg, out, engine=engine, progress=False, log=logs.append,
              factory=FakeServers(engine, None))
    assert len(read_answers(answers_path(out, "ar"))) == len(load_suite("demo"))
    kept = read_answers(answers_path(out, "llamacpp-greedy"))
    assert 1 <= len(kept) < len(load_suite("demo"))
    # The server's own timings are the turn's time; the client's are kept beside them.
    c = kept[0]["choices"][0]
    assert c["wall_time"][0] == pytest.approx(0.010) and c["peer"][0]["client_s"] > 0
    (line,) = [m for m in logs if m.startswith("llamacpp-greedy failed")]
    assert "killed by SIGSEGV" in line and "about to crash" in line


def test_headline_against_native_llamacpp() -> None:
    """The report's headline: our fastest method vs llama-server greedy and its fastest
    n-gram type, per category, with identical-answer counts for both sides."""
    from recallspec.bench.suite.report import OVERALL, render_markdown

    def st(tps: float, n: int = 10, identical: float | None = None,
           to_ar: float | None = None) -> dict[str, object]:
        return {"tokens_per_s": tps, "questions": n, "identical": identical,
                "identical_to_ar": to_ar}

    def method(per_cat: float, overall: float, **kw: float) -> dict[str, object]:
        return {"baseline": None, "accept_length_histogram": {},
                "stats": {"qa": st(per_cat, **kw), OVERALL: st(overall, **kw)}}

    rep = {"categories": ["qa"], "machine": {"cpu": "c", "torch_threads": 2}, "methods": {
        "ar": method(100.0, 100.0),
        "pld": method(120.0, 130.0, to_ar=1.0),
        "portfolio:mode=adaptive": method(150.0, 140.0, to_ar=1.0),
        "llamacpp-greedy": method(50.0, 50.0),
        "llamacpp-ngram-simple": method(40.0, 45.0, identical=0.8),
        "llamacpp-ngram-mod": method(60.0, 44.0, identical=0.9),
    }}
    md = render_markdown(rep)
    assert "## Against native llama.cpp (same run)" in md
    head = next(ln for ln in md.splitlines() if ln.startswith("| category | ours:"))
    # the fastest over the whole run on each side, not per category
    assert "portfolio:mode=adaptive" in head and "llamacpp-ngram-simple" in head
    qa = next(ln for ln in md.splitlines() if ln.startswith("| qa | 150.0"))
    assert qa == "| qa | 150.0 | 50.0 | 40.0 | 3.00x | 3.75x | 10/10 | 8/10 |"
