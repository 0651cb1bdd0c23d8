"""Live corpora (issue 21): documents and index files added to and removed from a
running engine, loaded in the background; drafts come from a ready corpus and stop when
it is removed; bad corpora are refused with clear errors."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import BigramModel, ByteTokenizer
from helpers.real_model import TEST_DTYPE

from recallspec.decoding.sampling import SamplingParams
from recallspec.drafters.sam import CORPUS, SamDrafter
from recallspec.engine import Engine, EngineConfig, GenerationResult
from recallspec.errors import DataError, IndexFileError
from recallspec.recall.automata import StaticIndex
from recallspec.recall.live_corpora import CorpusInfo, is_within

NEW_TOKENS = 32


@pytest.fixture(scope="module")
def real(engine: Any, spec_bench_prompts: list[str]) -> tuple[Engine, list[list[int]], list[Any]]:
    """A fresh engine on the session's model, 2 short prompts and their AR outputs."""
    prompts = sorted((engine.encode_prompt(p, chat=True) for p in spec_bench_prompts),
                     key=len)[:2]
    ar = engine.generate(prompts, SamplingParams(max_new_tokens=NEW_TOKENS), drafter="none")
    eng = Engine(engine.model, engine.tokenizer,
                 EngineConfig(max_batch_size=2, max_len=512, dtype=TEST_DTYPE, mode="fixed"))
    return eng, prompts, ar


def run(eng: Engine, prompts: list[list[int]], **kw: Any) -> list[GenerationResult]:
    got = eng.generate(prompts, SamplingParams(max_new_tokens=NEW_TOKENS), drafter="sam", **kw)
    assert isinstance(got, list)
    return got


def corpus_drafts(eng: Engine) -> int:
    d = eng.drafter("sam")
    assert isinstance(d, SamDrafter)
    return d.source_counts[CORPUS]


def test_documents_ready_then_drafted_from_then_removed(real: Any) -> None:
    eng, prompts, ar = real
    answer = eng.tokenizer.decode(ar[0].token_ids)
    info = eng.corpora.add_documents("answers", [answer, "Unrelated text about tea."])
    assert isinstance(info, CorpusInfo) and info.kind == "documents"
    assert info.status in ("loading", "ready") and info.error is None
    ready = eng.corpora.wait(info.id, 30)
    assert ready.status == "ready" and ready.tokens > 0 and ready.created == info.created
    assert [c.id for c in eng.corpora.list()] == [info.id]
    assert eng.memory_stats()["corpora"]["tokens"] == ready.tokens
    got = run(eng, prompts)
    assert [g.token_ids for g in got] == [a.token_ids for a in ar]
    used = corpus_drafts(eng)
    assert used > 0 and got[0].steps < ar[0].steps
    # Operator data: every tenant sees it, with or without response memory.
    run(eng, prompts[:1], tenant="someone", memory=False)
    assert corpus_drafts(eng) > used
    removed = eng.corpora.remove(info.id)
    assert removed.id == info.id and eng.corpora.list() == []
    used = corpus_drafts(eng)
    again = run(eng, prompts)
    assert [g.token_ids for g in again] == [a.token_ids for a in ar]
    assert corpus_drafts(eng) == used  # no drafts from a removed corpus


def test_index_file_attached_and_detached(real: Any, tmp_path: Path) -> None:
    eng, prompts, ar = real
    path = tmp_path / "answers.idx"
    StaticIndex.build([a.token_ids for a in ar], int(eng.model.config.vocab_size),
                      eng.tokenizer.fingerprint, path)
    info = eng.corpora.add_index("offline", path)
    assert info.kind == "index" and info.tokens == sum(len(a.token_ids) for a in ar)
    assert eng.corpora.wait(info.id, 30).status == "ready"  # checksum verified
    before = corpus_drafts(eng)
    got = run(eng, prompts)
    assert [g.token_ids for g in got] == [a.token_ids for a in ar]
    assert corpus_drafts(eng) > before
    assert sum(g.steps for g in got) < sum(a.steps for a in ar)
    eng.corpora.remove(info.id)
    assert eng.corpora.view() == ()


# ---- refusals -----------------------------------------------------------------------
class _FP(ByteTokenizer):
    fingerprint = "byte-fp"


def bigram_engine(tokenizer: Any = None) -> Engine:
    import torch

    table = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    return Engine(BigramModel(table), tokenizer or _FP(), EngineConfig(mode="fixed"))


class _Gated(_FP):
    """Encodes only once ``go`` is set: a corpus's background load waits on the test."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()

    def encode(self, text: str) -> list[int]:
        assert self.go.wait(60), "the test never let the load go on"
        return super().encode(text)


def test_adding_returns_before_the_load() -> None:
    """Adding a corpus returns while its tokenizing and building are still to come (they
    run in the background), "loading"; it becomes ready once they can run."""
    tok = _Gated()
    eng = bigram_engine(tok)
    info = eng.corpora.add_documents("c", ["some text", "more text"])
    assert info.status == "loading" and eng.corpora.get(info.id).status == "loading"
    assert eng.corpora.view() == ()
    tok.go.set()
    ready = eng.corpora.wait(info.id, 30)
    assert ready.status == "ready" and ready.tokens == len(b"some text" b"more text")
    assert len(eng.corpora.view()) == 1
    eng.close()


def test_unknown_ids_and_empty_corpora_are_refused() -> None:
    eng = bigram_engine()
    for call in (eng.corpora.remove, eng.corpora.get, eng.corpora.wait):
        with pytest.raises(DataError, match="unknown corpus id 'nope'"):
            call("nope")
    for texts in ([], ["", "  \n"]):
        with pytest.raises(DataError, match="empty"):
            eng.corpora.add_documents("c", texts)
    for bad in ("just a string", [1, 2], None):
        with pytest.raises(DataError, match="list of strings"):
            eng.corpora.add_documents("c", bad)  # type: ignore[arg-type]
    with pytest.raises(DataError, match="name"):
        eng.corpora.add_documents("", ["text"])
    assert eng.corpora.list() == []


def test_bad_index_files_are_refused(tmp_path: Path) -> None:
    eng = bigram_engine()
    other = tmp_path / "other.idx"
    StaticIndex.build([list(b"some text")], 256, "another-tokenizer", other)
    with pytest.raises(IndexFileError, match="different tokenizer"):
        eng.corpora.add_index("x", other)
    wide = tmp_path / "wide.idx"
    StaticIndex.build([list(b"some text")], 300, "byte-fp", wide)
    with pytest.raises(IndexFileError, match="vocabulary size"):
        eng.corpora.add_index("x", wide)
    with pytest.raises(IndexFileError, match="does not exist"):
        eng.corpora.add_index("x", tmp_path / "missing.idx")
    good = tmp_path / "good.idx"
    StaticIndex.build([list(b"some text") * 50], 256, "byte-fp", good)
    truncated = tmp_path / "truncated.idx"
    truncated.write_bytes(good.read_bytes()[:-100])
    with pytest.raises(IndexFileError):
        eng.corpora.add_index("x", truncated)
    assert eng.corpora.list() == []
    # A flipped payload byte passes the O(1) header check; the background checksum
    # verification fails the corpus, which never becomes visible.
    data = bytearray(good.read_bytes())
    data[-8] ^= 0xFF
    corrupt = tmp_path / "corrupt.idx"
    corrupt.write_bytes(bytes(data))
    info = eng.corpora.add_index("x", corrupt)
    failed = eng.corpora.wait(info.id, 30)
    assert failed.status == "failed" and failed.error and "checksum" in failed.error
    assert eng.corpora.view() == ()
    no_fp = bigram_engine(ByteTokenizer())
    with pytest.raises(DataError, match="fingerprint"):
        no_fp.corpora.add_index("x", good)


def test_decoding_goes_on_while_a_corpus_loads_and_removal_abandons_it() -> None:
    """A large corpus loads in the background while the engine steps; removing it
    while it loads abandons it (it never becomes visible)."""
    eng = bigram_engine()
    texts = [f"document {i}: " + "lorem ipsum dolor sit amet " * 20 for i in range(4000)]
    info = eng.corpora.add_documents("big", texts)
    eng.add_request(list(b"hello"), SamplingParams(max_new_tokens=200, ignore_eos=True),
                    drafter="sam")
    steps_while_loading = 0
    while eng.has_unfinished():
        eng.step()
        steps_while_loading += eng.corpora.get(info.id).status == "loading"
    assert steps_while_loading > 0  # the engine did not wait for the load
    assert eng.corpora.wait(info.id, 60).status == "ready"
    second = eng.corpora.add_documents("big again", texts)
    eng.corpora.remove(second.id)
    with pytest.raises(DataError, match="unknown"):
        eng.corpora.wait(second.id, 60)
    time.sleep(0.2)
    assert [c.id for c in eng.corpora.list()] == [info.id]
    assert [s.name for s in eng.corpora.view()] == [info.id]
    eng.close()


def test_is_within_the_allowed_directory(tmp_path: Path) -> None:
    allowed = tmp_path / "corpora"
    allowed.mkdir()
    inside = allowed / "a.idx"
    inside.write_bytes(b"x")
    outside = tmp_path / "b.idx"
    outside.write_bytes(b"x")
    link = allowed / "escape.idx"
    os.symlink(outside, link)
    assert is_within(inside, allowed)
    assert not is_within(outside, allowed)
    assert not is_within(allowed / ".." / "b.idx", allowed)
    assert not is_within(link, allowed)  # a symlink out of the directory
    assert not is_within(allowed / "missing.idx", allowed)
    assert not is_within(allowed, allowed)  # a directory, not a file
