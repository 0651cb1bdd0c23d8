"""REST / CREST datastores: suffix array, trie, file format and its errors, CREST
n-gram selection and SQLite store, codecs, the rest/crest drafters (lossless on the
bigram double), the `recallspec datastore` CLI."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import needs_model
from helpers.datastore import DOCS, build, paths
from helpers.engine import FP, PROMPTS, make_fingerprinted_engine
from hypothesis import given, settings
from hypothesis import strategies as st

from recallspec.cli import main as cli_main
from recallspec.decoding.sampling import SamplingParams
from recallspec.decoding.tree import DraftTree
from recallspec.drafters import create_drafter
from recallspec.engine import GenerationResult
from recallspec.errors import IndexFileError
from recallspec.recall.datastore.codec import CODECS, TreeCodec
from recallspec.recall.datastore.crest import CrestConfig, build_crest, measure_codecs, top_ngrams
from recallspec.recall.datastore.errors import DatastoreFormatError
from recallspec.recall.datastore.open import open_tree_store
from recallspec.recall.datastore.rest import RestDatastore, RetrievalConfig, build_rest
from recallspec.recall.datastore.store_sqlite import SqliteTreeStore
from recallspec.recall.datastore.suffix_array import match_range, suffix_array
from recallspec.recall.datastore.trie import top_k_trie


# -- suffix array and trie ------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(-1, 3), max_size=60), st.lists(st.integers(0, 3), min_size=1,
                                                           max_size=4))
def test_suffix_array_and_match_range_brute_force(text: list[int], query: list[int]) -> None:
    t = np.asarray(text, np.int32)
    sa = suffix_array(t)
    assert sa.tolist() == sorted((i for i in range(len(text)) if text[i] != -1),
                                 key=lambda i: text[i:])
    lo, hi = match_range(t, sa, query)
    assert sorted(sa[lo:hi].tolist()) == [
        i for i in range(len(text)) if text[i : i + len(query)] == query
    ]


def brute_trie_counts(rows: list[list[int]]) -> collections.Counter[tuple[int, ...]]:
    c: collections.Counter[tuple[int, ...]] = collections.Counter()
    for r in rows:
        for d in range(len(r)):
            if r[d] < 0:
                break
            c[tuple(r[: d + 1])] += 1
    return c


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(-1, 4), min_size=3, max_size=3), max_size=30),
       st.integers(1, 20))
def test_top_k_trie_is_the_most_frequent_prefix_closed_set(rows: list[list[int]], k: int) -> None:
    rows = [[t if -1 not in r[: i + 1] else -1 for i, t in enumerate(r)] for r in rows]
    tree = top_k_trie(np.asarray(rows, np.int64).reshape(len(rows), 3), k)
    counts = brute_trie_counts(rows)
    got = paths(tree)
    assert len(got) == min(k, len(counts)) and len(set(got)) == len(got)
    got_counts = [counts[p] for p in got]
    assert got_counts == sorted(got_counts, reverse=True)  # best-first
    assert sorted(got_counts, reverse=True) == sorted(counts.values(), reverse=True)[: len(got)]
    for p in got:  # prefix-closed (DraftTree checked parents precede children)
        assert len(p) == 1 or p[:-1] in got


# -- REST file ------------------------------------------------------------------
def test_rest_retrieve_brute_force(tmp_path: Path) -> None:
    ds = build(tmp_path)
    assert ds.n_tokens == sum(map(len, DOCS)) and ds.n_docs == 4
    assert ds.info().metadata == {"test": 1}
    cfg = RetrievalConfig(max_query=8, min_query=2, depth=4, tree_nodes=5)
    ctx = list(b"xyz; the quick")
    length, tree = ds.retrieve(ctx, cfg)
    assert length == 8 and bytes(ctx[-8:]) == b"he quick"  # " the quick" is 10 > max_query
    conts = [d[i + 8 : i + 12] + [-1] * max(0, i + 12 - len(d)) for d in DOCS
             for i in range(len(d)) if d[i : i + 8] == ctx[-8:]]
    counts = brute_trie_counts(conts)
    assert [counts[p] for p in paths(tree)] == sorted(counts.values(), reverse=True)[:5]
    assert paths(tree)[0] == (ord(" "),)  # all three occurrences continue with a space
    assert ds.retrieve(list(b"zzzz"), cfg)[0] == 0
    assert len(ds.retrieve(list(b"zzzz"), cfg)[1]) == 0
    # A match at a document end has no continuation; nothing crosses documents.
    assert ds.tree_for(list(b"the quick"), cfg).tokens.tolist()[:1] == [ord(" ")]
    assert len(ds.tree_for(list(b"dog"), cfg)) == 0


def test_rest_max_matches_samples_evenly(tmp_path: Path) -> None:
    ds = build(tmp_path, [[1, 2] * 50 + [3]])
    cfg = RetrievalConfig(max_matches=7, depth=2, tree_nodes=10)
    c = ds.continuations(*match_range(ds.text, ds.sa, [1]), 1, cfg)
    assert c.shape == (7, 2)


def test_rest_file_errors(tmp_path: Path) -> None:
    ds = build(tmp_path)
    path = Path(ds.path)
    ds.close()
    RestDatastore.open(path, expected_fingerprint=FP, verify=True)
    with pytest.raises(IndexFileError, match="another tokenizer"):
        RestDatastore.open(path, expected_fingerprint="other")
    with pytest.raises(IndexFileError, match="vocabulary size"):
        RestDatastore.open(path, expected_vocab_size=100)
    with pytest.raises(IndexFileError, match="does not exist"):
        RestDatastore.open(tmp_path / "missing.rest")
    raw = path.read_bytes()
    cases = {
        "trunc.rest": (raw[:-4], "truncated"),
        "tiny.rest": (raw[:100], "truncated"),
        "magic.rest": (b"XXXXXXXX" + raw[8:], "bad magic"),
        "header.rest": (raw[:40] + bytes([raw[40] ^ 1]) + raw[41:], "header checksum"),
    }
    for name, (data, msg) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(DatastoreFormatError, match=msg):
            RestDatastore.open(tmp_path / name)
    payload = raw[:-1] + bytes([raw[-1] ^ 1])
    (tmp_path / "payload.rest").write_bytes(payload)
    RestDatastore.open(tmp_path / "payload.rest")  # O(1) open does not read the payload
    with pytest.raises(DatastoreFormatError, match="payload checksum"):
        RestDatastore.open(tmp_path / "payload.rest", verify=True)


def test_rest_build_is_atomic(tmp_path: Path) -> None:
    ds = build(tmp_path)
    before = Path(ds.path).read_bytes()
    with pytest.raises(ValueError, match="token ids"):
        build(tmp_path, [[1, 2, 300]])
    with pytest.raises(ValueError, match="metadata"):
        build_rest(DOCS, vocab_size=256, tokenizer_fingerprint=FP, path=ds.path,
                   metadata={"x": "y" * 3000})
    assert Path(ds.path).read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["c.rest"]  # no temporary file left behind


# -- CREST ----------------------------------------------------------------------
def test_top_ngrams_brute_force(tmp_path: Path) -> None:
    ds = build(tmp_path)
    for n in (1, 2, 3):
        c = collections.Counter(tuple(d[i : i + n]) for d in DOCS for i in range(len(d) - n + 1))
        got = top_ngrams(ds, n, 5)
        assert [g.count for g in got] == sorted(c.values(), reverse=True)[:5]
        for g in got:
            assert c[g.tokens] == g.count and len(g.tokens) == n


@pytest.mark.parametrize("codec", CODECS)
def test_codecs_round_trip(codec: str) -> None:
    rng = np.random.default_rng(0)
    for vocab in (256, 70000):
        c = TreeCodec.for_vocab(codec, vocab)
        for n in (0, 1, 17, 255):
            parents = np.asarray([rng.integers(-1, i) if i else -1 for i in range(n)], np.int64)
            t = DraftTree(rng.integers(0, vocab, n).astype(np.int64), parents)
            back = c.decode(c.encode(t))
            assert back.tokens.tolist() == t.tokens.tolist()
            assert back.parents.tolist() == t.parents.tolist()
    bad = TreeCodec("raw", 2)
    with pytest.raises(ValueError, match="parent"):
        bad.decode(b"\x01\x00\x02\x00\x00\x05")  # node 1's parent is node 4
    with pytest.raises(ValueError, match="length"):
        bad.decode(b"\x01\x00")


def build_store(tmp_path: Path, **cfg: Any) -> tuple[RestDatastore, SqliteTreeStore]:
    ds = build(tmp_path)
    out = tmp_path / "c.crest"
    rcfg = RetrievalConfig(tree_nodes=8)
    res = build_crest(ds, CrestConfig(retrieval=rcfg, **cfg), str(out))
    assert res.storage_bytes == out.stat().st_size and res.n_entries > 0
    store = open_tree_store(str(out), expected_fingerprint=FP, verify=True)
    assert isinstance(store, SqliteTreeStore)
    return ds, store


@pytest.mark.parametrize("codec", CODECS)
def test_crest_sqlite_store(tmp_path: Path, codec: str) -> None:
    ds, store = build_store(tmp_path, max_n=3, top_t=4, codec=codec)
    rcfg = RetrievalConfig(tree_nodes=8)
    assert store.metadata["ns"] == [1, 2, 3] and store.n_entries() == store.metadata["entries"]
    for n in (1, 2, 3):
        for g in top_ngrams(ds, n, 4):
            got = store.get(g.tokens)
            want = ds.tree_for(g.tokens, rcfg)
            assert got is not None and paths(got) == paths(want)
    assert store.get([7, 7, 7]) is None
    # Longest stored suffix first: "the" is a top trigram, so "xx the" uses it.
    n, tree = store.longest(list(b"xx the"))
    assert n == 3 and tree is not None
    assert paths(tree) == paths(ds.tree_for(list(b"the"), rcfg))
    n3, cut = store.longest(tuple(b"xx the"), 3)  # decodes only the best-first prefix
    assert n3 == 3 and cut is not None and paths(cut) == paths(tree)[:3]
    assert store.longest(list(b"\x01\x02")) == (0, None)
    assert store.longest([]) == (0, None)


def test_crest_single_n(tmp_path: Path) -> None:
    _, store = build_store(tmp_path, single_n=2, top_t=3)
    assert store.metadata["ns"] == [2] and store.n_entries() == 3
    assert store.longest(list(b"the"))[0] in (0, 2)


def test_crest_store_errors(tmp_path: Path) -> None:
    _, store = build_store(tmp_path, max_n=2, top_t=3)
    store.close()
    path = tmp_path / "c.crest"
    with pytest.raises(IndexFileError, match="another tokenizer"):
        open_tree_store(str(path), expected_fingerprint="other")
    raw = path.read_bytes()
    (tmp_path / "trunc.crest").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DatastoreFormatError, match="truncated"):
        open_tree_store(str(tmp_path / "trunc.crest"))
    (tmp_path / "junk.crest").write_bytes(b"hello, not a database" * 300)
    with pytest.raises(DatastoreFormatError, match="corrupt or not"):
        open_tree_store(str(tmp_path / "junk.crest"))
    (tmp_path / "rest.crest").write_bytes(Path(tmp_path / "c.rest").read_bytes())
    with pytest.raises(DatastoreFormatError):
        open_tree_store(str(tmp_path / "rest.crest"))
    with pytest.raises(DatastoreFormatError, match="does not exist"):
        open_tree_store(str(tmp_path / "missing.crest"))
    # Damage inside a stored tree value: found by verify.
    import sqlite3

    con = sqlite3.connect(path)
    value = max((v for (v,) in con.execute("SELECT tree FROM trees")), key=len)
    con.close()
    bad = bytearray(raw)
    i = raw.find(value)
    assert i > 0
    bad[i] ^= 0x55
    (tmp_path / "bad.crest").write_bytes(bytes(bad))
    with pytest.raises(DatastoreFormatError):
        open_tree_store(str(tmp_path / "bad.crest"), verify=True)


def test_measure_codecs(tmp_path: Path) -> None:
    ds = build(tmp_path)
    trees = [ds.tree_for(g.tokens, RetrievalConfig()) for g in top_ngrams(ds, 1, 10)]
    m = measure_codecs(trees, 256)
    assert set(m) == set(CODECS) and all(v["bytes"] > 0 for v in m.values())


# -- drafters -------------------------------------------------------------------
def bigram_corpus(tmp_path: Path) -> tuple[str, str]:
    """REST and CREST datastores over the bigram engine's own greedy outputs (so drafts
    are accepted) plus unrelated text."""
    eng = make_fingerprinted_engine()
    outs = eng.generate([list(p) for p in PROMPTS],
                        [SamplingParams(max_new_tokens=30, ignore_eos=True)] * len(PROMPTS))
    assert isinstance(outs, list)
    docs = [list(p) + o.token_ids for p, o in zip(PROMPTS, outs, strict=True)] + DOCS
    docs = [[t for t in d if t] for d in docs]  # EOS id 0 is not corpus text
    ds = build(tmp_path, docs)
    build_crest(ds, CrestConfig(max_n=3, top_t=50), str(tmp_path / "c.crest"))
    return ds.path, str(tmp_path / "c.crest")


@pytest.mark.parametrize("batch", [1, 3])
def test_rest_crest_greedy_identical_to_ar_bigram(tmp_path: Path, batch: int) -> None:
    rest, crest = bigram_corpus(tmp_path)
    eng = make_fingerprinted_engine(max_batch_size=batch, max_draft_nodes=16)
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (40, 17, 33, 5)]
    prompts = [list(p) for p in PROMPTS]
    ar = eng.generate(prompts, params, drafter="none")
    assert isinstance(ar, list)
    for name, opts in (("rest", {"datastore": rest}), ("rest", {"datastore": rest, "depth": 3}),
                       ("crest", {"datastore": crest}), ("crest", {"datastore": crest,
                                                                   "max_n": 1})):
        sp = eng.generate(prompts, params, drafter=name, drafter_options=opts)
        assert isinstance(sp, list)
        for a, s in zip(ar, sp, strict=True):
            assert isinstance(s, GenerationResult)
            assert s.token_ids == a.token_ids, (name, opts)
        assert sum(s.steps for s in sp) < sum(a.steps for a in ar), (name, opts)


def test_drafter_checks_tokenizer(tmp_path: Path) -> None:
    rest, crest = bigram_corpus(tmp_path)
    for name, path in (("rest", rest), ("crest", crest)):
        d = create_drafter(name, datastore=path, tokenizer_fingerprint="another-tokenizer")
        with pytest.raises(IndexFileError, match="another tokenizer"):
            d.start(0, [1, 2, 3])
        d = create_drafter(name, datastore=path)
        with pytest.raises(ValueError, match="tokenizer_fingerprint"):
            d.start(0, [1, 2, 3])
        d = create_drafter(name, datastore=path, tokenizer_fingerprint=FP)
        d.start(0, list(b"the quick"))
        tree = d.propose(0, 3)
        assert 0 < len(tree) <= 3
        assert d.last_step(0).match_length > 0  # type: ignore[attr-defined]
        d.stop(0)


# -- CLI ------------------------------------------------------------------------
def run_cli(*args: str) -> tuple[int, str, str]:
    p = subprocess.run([sys.executable, "-m", "recallspec", *args], capture_output=True,
                       text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "junk.rest").write_bytes(b"RSPCREST" + b"\0" * 5000)
    (tmp_path / "junk.db").write_bytes(b"junk" * 2000)
    for args in (["datastore", "info", str(tmp_path / "junk.rest")],
                 ["datastore", "info", str(tmp_path / "junk.db")],
                 ["datastore", "info", str(tmp_path / "nope")],
                 ["datastore", "info", "postgresql://nobody@127.0.0.1:1/none"],
                 ["datastore", "build", "--kind", "rest", "--corpus", "x.json"],
                 ["datastore", "build", "--kind", "crest", "--from-rest", "x.rest",
                  "--backend", "postgres", "--out", "y"]):
        assert cli_main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("recallspec: error: ") and err.count("\n") == 1, err


@needs_model  # the default tokenizer comes with the default model
def test_cli_build_and_info(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(json.dumps({"instruction": f"say {w} twice", "output":
                                            f"{w} {w}. the quick brown fox"})
                                for w in ("hello", "world", "fox", "dog")))
    rest, crest = tmp_path / "c.rest", tmp_path / "c.crest"
    rc, out, err = run_cli("datastore", "build", "--kind", "rest", "--corpus", str(corpus),
                           "--out", str(rest), "--json", "--no-progress")
    assert rc == 0, err
    s = json.loads(out)
    assert s["kind"] == "rest" and s["bytes"] == rest.stat().st_size and s["documents"] == 4
    rc, out, err = run_cli("datastore", "build", "--kind", "crest", "--corpus", str(corpus),
                           "--top-t", "5", "--max-n", "2", "--out", str(crest), "--json")
    assert rc == 0, err
    s = json.loads(out)
    # 2 x top 5; an n-gram seen only at document ends has no tree and is not stored
    assert 8 <= s["entries"] <= 10 and s["bytes"] == crest.stat().st_size
    rc, out, err = run_cli("datastore", "build", "--kind", "crest", "--from-rest", str(rest),
                           "--single-n", "3", "--top-t", "2", "--out", str(crest), "--json",
                           "--codec", "zlib")
    assert rc == 0, err
    assert json.loads(out)["entries"] == 2
    for path, kind in ((rest, "rest"), (crest, "crest")):
        rc, out, err = run_cli("datastore", "info", str(path), "--json", "--verify")
        assert rc == 0, err
        info = json.loads(out)
        assert info["kind"] == kind and info["verified"] is True
    assert json.loads(out)["metadata"]["codec"] == "zlib"
    assert sorted(os.listdir(tmp_path)) == ["c.crest", "c.jsonl", "c.rest"]
