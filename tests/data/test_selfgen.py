"""Self-generated corpus: answers appended per prompt, resumable, same as uninterrupted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.engine import make_engine

from recallspec.data.corpus_files import iter_documents
from recallspec.data.selfgen import SelfGenConfig, generate_corpus, iter_prompts, read_done
from recallspec.errors import DataError


def _prompts(tmp: Path) -> Path:
    f = tmp / "alpaca.json"
    f.write_text(json.dumps([
        {"instruction": f"say {w} {w} {w}", "input": "", "output": "x"}
        for w in ("abc", "hello", "xyz", "the cat", "one two")
    ]))
    return f


def test_generate_resume_equals_uninterrupted(tmp_path: Path) -> None:
    src = _prompts(tmp_path)
    cfg = SelfGenConfig(max_new_tokens=12, batch_size=2, drafter="pld")
    full = tmp_path / "full.jsonl"
    c = generate_corpus(make_engine(max_batch_size=2), [src], full, cfg)
    assert c["written"] == 5 and c["tokens"] > 0
    # Interrupted: the first 2 prompts, then a torn last line, then resume.
    part = tmp_path / "part.jsonl"
    generate_corpus(make_engine(max_batch_size=2), [src], part,
                    SelfGenConfig(max_new_tokens=12, batch_size=2, limit=2, drafter="pld"))
    with part.open("a") as f:
        f.write('{"question_id": "alpaca.json:2", "cho')
    c2 = generate_corpus(make_engine(max_batch_size=2), [src], part, cfg)
    assert c2["already"] == 2 and c2["written"] == 3
    rows = lambda p: sorted(p.read_text().splitlines())  # noqa: E731
    assert rows(part) == rows(full)
    # The index builder reads the answers (assistant text), not the prompts.
    docs = list(iter_documents(full))
    assert len(docs) == 5 and not any(d.startswith("say ") for d in docs)


def test_bad_inputs(tmp_path: Path) -> None:
    eng = make_engine()
    with pytest.raises(DataError, match="does not exist"):
        generate_corpus(eng, [tmp_path / "missing.json"], tmp_path / "o.jsonl", SelfGenConfig())
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match="no prompts"):
        generate_corpus(eng, [empty], tmp_path / "o.jsonl", SelfGenConfig())
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": "a"}\nnot json\n')
    with pytest.raises(DataError, match="not a corpus record"):
        read_done(bad)
    assert bad.read_text() == '{"question_id": "a"}\nnot json\n'  # nothing lost


def test_per_file_mixes_the_prompt_files(tmp_path: Path) -> None:
    a = _prompts(tmp_path)
    b = tmp_path / "b.jsonl"
    b.write_text("".join(json.dumps({"question": f"what is {i} + {i}?", "answer": "x"}) + "\n"
                         for i in range(4)))
    assert [pid for pid, _ in iter_prompts([a, b], per_file=2)] == [
        "alpaca.json:0", "alpaca.json:1", "b.jsonl:0", "b.jsonl:1"]
    out = tmp_path / "mix.jsonl"
    c = generate_corpus(make_engine(max_batch_size=2), [a, b], out,
                        SelfGenConfig(max_new_tokens=4, batch_size=2, per_file=3, limit=5))
    assert c["prompts"] == 5 and sorted(read_done(out)) == [
        "alpaca.json:0", "alpaca.json:1", "alpaca.json:2", "b.jsonl:0", "b.jsonl:1"]
    with pytest.raises(DataError, match="per_file"):
        SelfGenConfig(per_file=0)
