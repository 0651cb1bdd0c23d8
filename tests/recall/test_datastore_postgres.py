"""The PostgreSQL backend of CREST stores, against a real server (see pg_server.py):
same trees as SQLite, atomic replacement, failed builds leave nothing, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.datastore import DOCS, build, paths
from helpers.engine import FP, PROMPTS, make_fingerprinted_engine
from helpers.pg_server import postgres_dsn, unavailable

from recallspec.cli import main as cli_main
from recallspec.decoding.sampling import SamplingParams
from recallspec.engine import GenerationResult
from recallspec.recall.datastore.crest import CrestConfig, build_crest, compute_rows, top_ngrams
from recallspec.recall.datastore.errors import (
    DatastoreFormatError,
    DatastoreUnreachableError,
    DatastoreWriteError,
)
from recallspec.recall.datastore.open import open_tree_store
from recallspec.recall.datastore.store_postgres import PostgresTreeStore, connect, write_postgres


@pytest.fixture(scope="module")
def pg() -> Iterator[str]:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        unavailable("psycopg is not installed (pip install -e '.[postgres]')")
    with postgres_dsn() as dsn:
        yield dsn


def tables(dsn: str) -> set[str]:
    con = connect(dsn)
    try:
        with con.cursor() as cur:
            cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            return {r[0] for r in cur.fetchall()}
    finally:
        con.close()


def test_postgres_same_trees_as_sqlite(pg: str, tmp_path: Path) -> None:
    ds = build(tmp_path)
    cfg = CrestConfig(max_n=3, top_t=5)
    res = build_crest(ds, cfg, pg, table="t_same")
    build_crest(ds, cfg, str(tmp_path / "c.crest"))
    assert res.storage_bytes > 0 and {"t_same", "t_same_meta"} <= tables(pg)
    store = open_tree_store(pg, table="t_same", expected_fingerprint=FP, verify=True)
    lite = open_tree_store(str(tmp_path / "c.crest"))
    assert isinstance(store, PostgresTreeStore)
    assert store.metadata["payload_hash"] == lite.metadata["payload_hash"]
    assert store.n_entries() == res.n_entries
    for n in (1, 2, 3):
        for g in top_ngrams(ds, n, 5):
            a, b = store.get(g.tokens), lite.get(g.tokens)
            assert a is not None and b is not None and paths(a) == paths(b)
    for ctx in (b"xx the", b"abc", b"zzz", b"dog"):
        n1, t1 = store.longest(list(ctx))
        n2, t2 = lite.longest(list(ctx))
        assert n1 == n2 and (t1 is None) == (t2 is None)
        assert t1 is None or t2 is None or paths(t1) == paths(t2)
    store.close()


def test_postgres_rebuild_is_atomic(pg: str, tmp_path: Path) -> None:
    ds = build(tmp_path)
    rows, per_n, _ = compute_rows(ds, CrestConfig(max_n=2, top_t=3))
    meta = {"format": "recallspec-crest", "version": 1, "tokenizer_fingerprint": FP,
            "vocab_size": 256, "codec": "raw", "token_bytes": 2, "ns": sorted(per_n),
            "payload_hash": "x"}
    write_postgres(pg, rows, meta, table="t_atomic")
    write_postgres(pg, rows[:2], meta, table="t_atomic")  # replaces the old store
    s = open_tree_store(pg, table="t_atomic")
    assert isinstance(s, PostgresTreeStore) and s.n_entries() == 2
    s.close()
    with pytest.raises(DatastoreWriteError, match="nothing written"):
        write_postgres(pg, [rows[0], rows[0]], meta, table="t_atomic")  # fails mid-build
    s = open_tree_store(pg, table="t_atomic")  # the previous store is untouched
    assert isinstance(s, PostgresTreeStore) and s.n_entries() == 2
    s.close()
    assert not any("__building" in t for t in tables(pg))


def test_postgres_errors(pg: str, tmp_path: Path) -> None:
    ds = build(tmp_path)
    build_crest(ds, CrestConfig(max_n=1, top_t=2), pg, table="t_err")
    with pytest.raises(DatastoreFormatError, match="another tokenizer"):
        open_tree_store(pg, table="t_err", expected_fingerprint="other")
    with pytest.raises(DatastoreFormatError, match="no CREST store"):
        open_tree_store(pg, table="t_missing")
    with pytest.raises(DatastoreUnreachableError, match="cannot connect"):
        open_tree_store("postgresql://postgres@127.0.0.1:1/postgres")
    with pytest.raises(ValueError, match="table name"):
        open_tree_store(pg, table="x; drop table t_err")


def test_postgres_crest_drafter_lossless(pg: str, tmp_path: Path) -> None:
    eng = make_fingerprinted_engine(max_draft_nodes=16)
    prompts = [list(p) for p in PROMPTS]
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    ar = eng.generate(prompts, [params] * len(prompts), drafter="none")
    assert isinstance(ar, list)
    docs = [[t for t in list(p) + a.token_ids if t] for p, a in zip(PROMPTS, ar, strict=True)]
    ds = build(tmp_path, docs + DOCS)
    build_crest(ds, CrestConfig(max_n=3, top_t=50), pg, table="t_drafter")
    sp = eng.generate(prompts, [params] * len(prompts), drafter="crest",
                      drafter_options={"datastore": pg, "table": "t_drafter"})
    assert isinstance(sp, list)
    for a, s in zip(ar, sp, strict=True):
        assert isinstance(s, GenerationResult) and s.token_ids == a.token_ids
    assert sum(s.steps for s in sp) < sum(a.steps for a in ar)


def test_postgres_cli(pg: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ds = build(tmp_path)
    rc = cli_main(["datastore", "build", "--kind", "crest", "--from-rest", ds.path,
                   "--top-t", "3", "--max-n", "2", "--backend", "postgres", "--dsn", pg,
                   "--table", "t_cli", "--json", "--no-progress"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["backend"] == "postgres" and out["entries"] > 0
    assert cli_main(["datastore", "info", pg, "--table", "t_cli", "--json", "--verify"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "crest" and info["metadata"]["entries"] == out["entries"]
    p = subprocess.run([sys.executable, "-m", "recallspec", "datastore", "info",
                        "postgresql://postgres@127.0.0.1:1/postgres"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "cannot connect" in p.stderr
