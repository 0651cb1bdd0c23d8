"""Benchmark suite: suites, answer files, report arithmetic, resume, CLI errors.

Most tests run the real ``Engine`` on a tiny deterministic fake model (next token =
a fixed permutation of the current one) so they are fast and exact; one smoke test
runs the real default model on the demo suite.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from helpers import needs_model
from helpers.availability import requires
from helpers.bench import FakeModel, FakeTokenizer, fake_engine

from recallspec.bench.common.answers import answers_path, read_answers, validate_record
from recallspec.bench.common.suites import SUITES, SuiteSelection, load_suite, select
from recallspec.bench.suite.report import OVERALL, write_report
from recallspec.bench.suite.runner import BenchConfig, run_bench
from recallspec.cli import main
from recallspec.engine import Engine, EngineConfig
from recallspec.errors import DataError, UnknownNameError

# ---- suites ------------------------------------------------------------------------


def test_demo_suite_and_selection() -> None:
    qs = load_suite("demo")
    assert len(qs) >= 3 and any(len(q.turns) == 2 for q in qs)
    assert [q.question_id for q in load_suite("demo", SuiteSelection(limit=2))] == [
        qs[0].question_id, qs[1].question_id,
    ]
    with pytest.raises(UnknownNameError):
        load_suite("nope")
    with pytest.raises(UnknownNameError):
        load_suite("demo", SuiteSelection(categories=("nope",)))


def test_per_category_is_fixed_and_stratified() -> None:
    from recallspec.bench.common.suites import Question

    qs = [Question(i, "a" if i < 80 else "b", ("x",), subcategory=str(i // 10)) for i in range(90)]
    sel = select(qs, SuiteSelection(per_category=8))
    a = [q for q in sel if q.category == "a"]
    assert len(a) == 8 and {q.subcategory for q in a} == {str(i) for i in range(8)}
    assert sel == select(qs, SuiteSelection(per_category=8))  # the same every time
    assert len([q for q in sel if q.category == "b"]) == 8


def _have_data() -> bool:
    try:
        from recallspec.data.paths import data_dir

        return (data_dir() / "spec_bench" / "question.jsonl").is_file()
    except FileNotFoundError:
        return False


@requires(_have_data(), "shared benchmark data not present")
def test_real_suites_load() -> None:
    sb = load_suite("spec_bench", SuiteSelection(per_category=20))
    cats: dict[str, int] = {}
    for q in sb:
        cats[q.category] = cats.get(q.category, 0) + 1
    assert cats == {c: 20 for c in
                    ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")}
    mt = [q for q in sb if q.category == "mt_bench"]
    assert all(len(q.turns) == 2 for q in mt) and len({q.subcategory for q in mt}) == 8
    for name in SUITES:
        assert load_suite(name, SuiteSelection(limit=2))
    for name in ("spec_bench", "mt_bench", "humaneval", "mbpp", "gsm8k", "cnndm",
                 "rag_extractive"):  # every workload of issue 22 has >= 16 prompts
        assert len(load_suite(name)) >= 16, name


@requires(_have_data(), "shared benchmark data not present")
def test_rag_extractive_suite_quotes_its_passages() -> None:
    qs = load_suite("rag-extractive", SuiteSelection(per_category=8))
    assert [q.category for q in qs] == ["rag_quote"] * 8 + ["rag_copy"] * 8
    assert qs == load_suite("rag_extractive", SuiteSelection(per_category=8))  # fixed
    for q in qs:
        text = q.turns[0]
        body, ask = text.rsplit("\n\n", 1)
        k = int(ask.split("passage ")[1].split()[0])
        passage = body.split(f"Passage {k}: ", 1)[1].split("\n\nPassage ")[0]
        if q.category == "rag_quote":
            assert ask.split('"')[1] in passage  # the phrase to quote is in that passage
        else:
            assert ask.startswith(f"Copy passage {k} verbatim")


def test_missing_data_dir(tmp_path: Path) -> None:
    with pytest.raises(DataError):
        load_suite("gsm8k", data=tmp_path / "missing")
    with pytest.raises(DataError):
        load_suite("gsm8k", data=tmp_path)  # exists but holds no gsm8k/test.jsonl


# ---- run + report on the fake model ----------------------------------------------------


def _spec_bench_speed(recs: list[dict[str, Any]]) -> float:
    """Spec-Bench speed.py: mean over questions of sum(new_tokens) / sum(wall_time)."""
    return statistics.mean(
        sum(r["choices"][0]["new_tokens"]) / sum(r["choices"][0]["wall_time"]) for r in recs
    )


def _mat(recs: list[dict[str, Any]]) -> float:
    pooled = [a for r in recs for a in r["choices"][0]["accept_lengths"]]
    return sum(pooled) / len(pooled)


def _run_fake(out: Path, methods: tuple[str, ...] = ("ar", "pld"), **kw: Any) -> None:
    cfg = BenchConfig(suite="demo", methods=methods, max_new_tokens=24, **kw)
    run_bench(cfg, out, engine=fake_engine(), progress=False, log=lambda m: None)


def test_run_report_schema_and_arithmetic(tmp_path: Path) -> None:
    _run_fake(tmp_path, repeats=2)
    rep = write_report(tmp_path)
    ar = read_answers(answers_path(tmp_path, "ar"))
    pld = read_answers(answers_path(tmp_path, "pld"))
    assert len(ar) == len(pld) == len(load_suite("demo"))
    for rec in ar + pld:
        assert validate_record(rec) is None
        c = rec["choices"][0]
        for key in ("question_id", "category", "answer_id", "model_id", "tstamp"):
            assert key in rec
        assert len(c["wall_time_repeats"][0]) == 2
        assert c["new_tokens"] == [len(t) for t in c["token_ids"]]
        assert len(c["prompt_ids"]) == len(c["turns"])
        # Every turn from a cold prefill, as the peers answer: the engine's prefix cache
        # (on here) would otherwise hand pld, and every second repeat, the KV an earlier
        # answer left for the same prompt.
        assert [t["cached_tokens"] for t in c["timing"]] == [0] * len(c["turns"])
    assert all(a == 1 for r in ar for a in r["choices"][0]["accept_lengths"])
    # The fake model is lossless under any drafter: PLD output == AR output.
    assert [r["choices"][0]["token_ids"] for r in ar] == [r["choices"][0]["token_ids"] for r in pld]
    s = rep["methods"]["pld"]["stats"][OVERALL]
    assert s["mat"] == pytest.approx(_mat(pld))
    assert s["mat"] > 1.0
    assert s["tokens_per_s"] == pytest.approx(_spec_bench_speed(pld))
    assert s["speedup"] == pytest.approx(_spec_bench_speed(pld) / _spec_bench_speed(ar))
    assert s["identical"] == 1.0 and s["identical_to_ar"] == 1.0
    for cat in {r["category"] for r in pld}:
        sub = [r for r in pld if r["category"] == cat]
        base = [r for r in ar if r["category"] == cat]
        st = rep["methods"]["pld"]["stats"][cat]
        assert st["mat"] == pytest.approx(_mat(sub))
        assert st["speedup"] == pytest.approx(_spec_bench_speed(sub) / _spec_bench_speed(base))
    md = (tmp_path / "report.md").read_text().splitlines()
    assert sum(line.startswith("| pld | ar |") for line in md) == 1
    assert json.loads((tmp_path / "report.json").read_text())["methods"].keys() == {"ar", "pld"}
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "speedup.png").is_file() and (tmp_path / "accept_hist.png").is_file()


def test_overwrite_discards_the_whole_earlier_run(tmp_path: Path) -> None:
    """--overwrite starts over: a method of the earlier run that is not run again does
    not stay behind to join the new report."""
    _run_fake(tmp_path)
    run_bench(BenchConfig(suite="demo", methods=("ar",), max_new_tokens=24), tmp_path,
              overwrite=True, engine=fake_engine(), progress=False, log=lambda m: None)
    assert not answers_path(tmp_path, "pld").exists()
    assert answers_path(tmp_path, "ar").is_file()


def test_resume_skips_done_and_refuses_corrupt(tmp_path: Path) -> None:
    _run_fake(tmp_path)
    path = answers_path(tmp_path, "pld")
    before = path.read_text()
    # Without --resume / --overwrite, completed answers are never touched.
    with pytest.raises(DataError, match="--resume"):
        _run_fake(tmp_path)
    # Resume with everything done: nothing appended.
    run_bench(BenchConfig(suite="demo", methods=("ar", "pld"), max_new_tokens=24), tmp_path,
              resume=True, engine=fake_engine(), progress=False, log=lambda m: None)
    assert path.read_text() == before
    # Drop the last answer (and the newline before it): resume redoes exactly that
    # question, on a line of its own.
    lines = before.splitlines(keepends=True)
    path.write_text("".join(lines[:-1]).rstrip("\n"))
    run_bench(BenchConfig(suite="demo", methods=("pld",), max_new_tokens=24), tmp_path,
              resume=True, engine=fake_engine(), progress=False, log=lambda m: None)
    redone = path.read_text().splitlines()
    assert len(redone) == len(lines)
    assert json.loads(redone[-1])["question_id"] == json.loads(lines[-1])["question_id"]
    # A corrupt line: clear error naming file and line, file untouched.
    corrupt = "".join(lines[:1]) + '{"question_id": 1, "choi\n' + "".join(lines[1:])
    path.write_text(corrupt)
    with pytest.raises(DataError, match=rf"{path.name}:2"):
        run_bench(BenchConfig(suite="demo", methods=("pld",), max_new_tokens=24), tmp_path,
                  resume=True, engine=fake_engine(), progress=False, log=lambda m: None)
    assert path.read_text() == corrupt
    # Different settings on resume are refused.
    path.write_text(before)
    with pytest.raises(DataError, match="max_new_tokens"):
        run_bench(BenchConfig(suite="demo", methods=("pld",), max_new_tokens=8), tmp_path,
                  resume=True, engine=fake_engine(), progress=False, log=lambda m: None)


def test_run_file_records_the_sizing_of_unlabeled_methods(tmp_path: Path) -> None:
    """run.json records how methods named without a sizing were sized. A directory written
    before it did (no key: ``pld`` was fixed there) is neither resumed nor written into
    beside its answers by an engine sizing them cost-aware: the error says to use a fresh
    --out or --overwrite; nothing is touched."""
    from dataclasses import replace

    _run_fake(tmp_path)  # fake_engine(): mode="fixed"
    run = tmp_path / "run.json"
    meta = json.loads(run.read_text())
    assert meta["settings"]["sizing_default"] == "fixed"
    del meta["settings"]["sizing_default"]  # as written before the key existed
    run.write_text(json.dumps(meta))
    before = answers_path(tmp_path, "pld").read_text()
    adaptive = Engine(FakeModel(), FakeTokenizer(), EngineConfig(max_len=1024))
    cfg = BenchConfig(suite="demo", methods=("ar", "pld"), max_new_tokens=24)
    quiet: dict[str, Any] = {"progress": False, "log": lambda m: None}
    with pytest.raises(DataError, match=r"before cost-aware sizing.*fresh --out.*--overwrite"):
        run_bench(cfg, tmp_path, resume=True, engine=adaptive, **quiet)
    with pytest.raises(DataError, match="before cost-aware sizing"):  # beside its answers
        run_bench(replace(cfg, methods=("llma",)), tmp_path, engine=adaptive, **quiet)
    assert answers_path(tmp_path, "pld").read_text() == before
    assert not answers_path(tmp_path, "llma").exists()
    assert "sizing_default" not in json.loads(run.read_text())["settings"]
    # An engine sizing them fixed, as they were, resumes it (and records that).
    run_bench(cfg, tmp_path, resume=True, engine=fake_engine(), **quiet)
    assert json.loads(run.read_text())["settings"]["sizing_default"] == "fixed"
    with pytest.raises(DataError, match="records methods named without a sizing as sized fixed"):
        run_bench(cfg, tmp_path, resume=True, engine=adaptive, **quiet)
    # --overwrite starts over, under this run's meaning.
    run_bench(replace(cfg, methods=("ar",)), tmp_path, overwrite=True, engine=adaptive, **quiet)
    assert json.loads(run.read_text())["settings"]["sizing_default"] == "adaptive"


# ---- CLI errors: exit code 2, one line, nothing lost ---------------------------------------


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    return rc, err


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--suite", "nope"], "unknown suite"),
        (["--suite", "demo", "--methods", "ar,warp"], "unknown method"),
        (["--suite", "gsm8k", "--data-dir", "/nonexistent/data"], "does not exist"),
    ],
)
def test_cli_bad_inputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    rc, err = _cli(["bench", *extra, "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and needle in err and len(err.splitlines()) == 1


def test_cli_corrupt_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run_fake(tmp_path)
    path = answers_path(tmp_path, "ar")
    text = path.read_text() + "not json\n"
    path.write_text(text)
    n = len(text.splitlines())
    rc, err = _cli(["bench", "--suite", "demo", "--methods", "ar", "--max-new-tokens", "24",
                    "--out", str(tmp_path), "--resume"], capsys)
    assert rc == 2 and f"ar.jsonl:{n}" in err and len(err.splitlines()) == 1
    assert path.read_text() == text


def test_method_options(tmp_path: Path) -> None:
    """``name:key=value`` methods: drafter options and the sizing reach the engine."""
    from recallspec.bench.common.method import method_spec

    spec = method_spec("sam:index=/a/b.rsidx:delta=3:tree=true")
    assert (spec.name, spec.kwargs, spec.sizing) == (
        "sam", {"index": "/a/b.rsidx", "delta": 3, "tree": True}, None)
    specs = ("ar", "pld:max_ngram=2", "llma:mode=adaptive")
    fake = fake_engine()
    from recallspec.cost.curve import CostCurve

    fake.use_cost_curve(CostCurve((1, 64), (1.0, 1.0), 0.0))
    run_bench(BenchConfig(suite="demo", methods=specs, max_new_tokens=24), tmp_path,
              engine=fake, progress=False, log=lambda m: None)
    rep = write_report(tmp_path)
    for m in specs:
        assert rep["methods"][m]["stats"][OVERALL]["identical_to_ar"] == 1.0
    assert rep["methods"]["pld:max_ngram=2"]["stats"][OVERALL]["mat"] > 1.0
    with pytest.raises(UnknownNameError, match="bad options"):
        run_bench(BenchConfig(suite="demo", methods=("pld:warp=1",)), tmp_path / "x",
                  engine=fake, progress=False, log=lambda m: None)
    with pytest.raises(DataError, match="peer methods take no options"):
        run_bench(BenchConfig(suite="demo", methods=("hf-pld:a=1",)), tmp_path / "x",
                  engine=fake, progress=False, log=lambda m: None)


def test_cli_report_subcommand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run_fake(tmp_path)
    assert main(["bench", "report", "--out", str(tmp_path)]) == 0
    assert "| pld |" in capsys.readouterr().out


# ---- the real default model ----------------------------------------------------------------




@needs_model
def test_demo_smoke_real_model(tmp_path: Path) -> None:
    methods = ("ar", "pld")
    rc = main(["bench", "--suite", "demo", "--limit", "2", "--max-new-tokens", "16",
               "--methods", ",".join(methods), "--out", str(tmp_path), "--no-progress"])
    assert rc == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    for m in methods:
        recs = read_answers(answers_path(tmp_path, m))
        assert len(recs) == 2
        assert all(validate_record(r) is None for r in recs)
        assert rep["methods"][m]["stats"][OVERALL]["mat"] == pytest.approx(_mat(recs))
    assert rep["methods"]["pld"]["stats"][OVERALL]["identical_to_ar"] == 1.0
    assert (tmp_path / "report.md").is_file()


@needs_model
@pytest.mark.skipif(not importlib.util.find_spec("transformers"), reason="transformers missing")
def test_hf_greedy_same_weights_same_tokens(tmp_path: Path) -> None:
    # Same (fp32 reference) weights, prompt ids and EOS handling: greedy outputs agree
    # with ar on the fp32 path (hf-* peers always run the fp32 weights).
    rc = main(["bench", "--suite", "demo", "--limit", "1", "--max-new-tokens", "12",
               "--dtype", "float32",
               "--methods", "ar,hf-greedy,hf-pld", "--out", str(tmp_path), "--no-progress"])
    assert rc == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["methods"]["hf-greedy"]["stats"][OVERALL]["identical_to_ar"] == 1.0
    assert rep["methods"]["hf-pld"]["baseline"] == "hf-greedy"
    hf_pld = read_answers(answers_path(tmp_path, "hf-pld"))[0]["choices"][0]
    # Accept lengths derived from transformers' forwards cover every token but the first.
    assert sum(hf_pld["accept_lengths"]) == hf_pld["new_tokens"][0] + (
        hf_pld["finish_reason"][0] == "eos") - 1
