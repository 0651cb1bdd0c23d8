"""`recallspec datastore build|info`: REST (suffix array) and CREST (n-gram trees) stores."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any

from recallspec.errors import DataError, IndexFileError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("datastore", help="build or inspect a REST / CREST retrieval datastore")
    dsub = p.add_subparsers(dest="datastore_command", required=True, metavar="SUBCOMMAND")

    b = dsub.add_parser("build", help="tokenize a corpus and build a datastore")
    b.add_argument("--kind", choices=["rest", "crest"], required=True)
    src = b.add_mutually_exclusive_group(required=True)
    src.add_argument("--corpus", nargs="+", metavar="FILE",
                     help="corpus files: .jsonl, .json, .txt (optionally .gz)")
    src.add_argument("--from-rest", metavar="PATH",
                     help="crest: take the corpus from this REST datastore (no tokenizing)")
    b.add_argument("--field", default=None, help="take this record field as the document text")
    b.add_argument("--chat-template", action="store_true",
                   help="render each record as a chat with the model's template")
    b.add_argument("--txt-mode", choices=["blocks", "file"], default="blocks")
    b.add_argument("--model", default=None,
                   help="model whose tokenizer to use (default: SmolLM2-135M-Instruct)")
    b.add_argument("--top-t", type=int, default=1000, help="crest: n-grams kept per n")
    b.add_argument("--max-n", type=int, default=4, help="crest: n-grams of length 1..M")
    b.add_argument("--single-n", type=int, default=None,
                   help="crest: keep only n-grams of this length (ablation)")
    b.add_argument("--tree-nodes", type=int, default=64, help="nodes per draft tree")
    b.add_argument("--max-matches", type=int, default=5000)
    b.add_argument("--depth", type=int, default=10, help="tokens taken after each match")
    b.add_argument("--codec", choices=["raw", "zlib", "lzma"], default=None,
                   help="crest: tree encoding (default: raw, see docs/DATASTORE.md)")
    b.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    b.add_argument("--dsn", default=None, help="PostgreSQL connection string (postgres backend)")
    b.add_argument("--table", default=None, help="PostgreSQL table (default recallspec_crest)")
    b.add_argument("--out", default=None, help="file to write (atomically); not for postgres")
    b.add_argument("--no-progress", action="store_true", help="no progress bars")
    b.add_argument("--json", action="store_true", help="print the summary as JSON")
    b.set_defaults(handler=run_build)

    i = dsub.add_parser("info", help="show a datastore's header / metadata")
    i.add_argument("location", metavar="PATH|DSN")
    i.add_argument("--table", default=None, help="PostgreSQL table (default recallspec_crest)")
    i.add_argument("--verify", action="store_true", help="also verify the payload checksum")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.set_defaults(handler=run_info)


def _check_args(args: argparse.Namespace) -> None:
    if args.kind == "rest":
        if args.from_rest:
            raise DataError("--from-rest is for --kind crest")
        if args.backend != "sqlite" or args.dsn:
            raise DataError("--kind rest writes one file: --backend/--dsn are for crest")
    if args.backend == "postgres":
        if not args.dsn:
            raise DataError("--backend postgres needs --dsn")
        if args.out:
            raise DataError("--backend postgres writes a table (--table), not --out")
    elif not args.out:
        raise DataError("--out is required")
    for name in ("top_t", "max_n", "tree_nodes", "max_matches", "depth"):
        if getattr(args, name) < 1:
            raise DataError(f"--{name.replace('_', '-')} must be >= 1")


def run_build(args: argparse.Namespace) -> int:
    from recallspec.recall.datastore.rest import RestDatastore, RetrievalConfig, build_rest

    _check_args(args)
    t0 = time.perf_counter()
    progress = not args.no_progress
    retrieval = RetrievalConfig(max_matches=args.max_matches, depth=args.depth,
                                tree_nodes=args.tree_nodes)
    tmpdir: tempfile.TemporaryDirectory[str] | None = None
    try:
        if args.from_rest:
            rest = RestDatastore.open(args.from_rest)
        else:
            rest_path = args.out
            if args.kind == "crest":
                tmpdir = tempfile.TemporaryDirectory(prefix="recallspec-crest-")
                rest_path = os.path.join(tmpdir.name, "corpus.rest")
            rest = _build_rest_from_corpus(args, rest_path, progress, build_rest)
        if args.kind == "rest":
            summary: dict[str, Any] = {
                "kind": "rest", "path": args.out, "tokens": rest.n_tokens,
                "documents": rest.n_docs, "bytes": rest.file_bytes,
                "seconds": round(time.perf_counter() - t0, 3),
            }
        else:
            summary = _build_crest(args, rest, retrieval, progress, t0)
    finally:
        if tmpdir is not None:
            tmpdir.cleanup()
    if args.json:
        print(json.dumps(summary))
    else:
        print(" ".join(f"{k}={v}" for k, v in summary.items()))
    return 0


def _build_rest_from_corpus(
    args: argparse.Namespace, path: str, progress: bool, build_rest: Any
) -> Any:
    from recallspec.data.corpus_files import chat_template_of
    from recallspec.models import load_tokenizer
    from recallspec.recall.datastore.tokenize import tokenize_corpus

    tok = load_tokenizer(args.model)
    template = chat_template_of(tok, args.chat_template)
    docs = tokenize_corpus(args.corpus, tok, field=args.field, chat_template=template,
                           txt_mode=args.txt_mode, progress=progress)
    if not any(len(d) for d in docs):
        raise DataError("empty corpus: no tokens in " + ", ".join(args.corpus)
                        + " (check the file format or choose a field with --field)")
    meta = {
        "corpus": [os.path.basename(p) for p in args.corpus][:20], "field": args.field,
        "chat_template": bool(args.chat_template),
        "model": str(args.model) if args.model else "default",
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    bar: Any = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(desc="suffix array", unit="doubling")
    rest = build_rest(docs, vocab_size=tok.vocab_size, tokenizer_fingerprint=tok.fingerprint,
                      path=path, metadata=meta,
                      progress=(lambda k: bar.update(1)) if bar is not None else None)
    if bar is not None:
        bar.close()
    return rest


def _build_crest(
    args: argparse.Namespace, rest: Any, retrieval: Any, progress: bool, t0: float
) -> dict[str, Any]:
    from recallspec.recall.datastore.crest import DEFAULT_CODEC, CrestConfig, build_crest
    from recallspec.recall.datastore.store import DEFAULT_TABLE

    try:
        cfg = CrestConfig(max_n=args.max_n, top_t=args.top_t, single_n=args.single_n,
                          codec=args.codec or DEFAULT_CODEC, retrieval=retrieval)
    except ValueError as e:
        raise DataError(str(e)) from None
    out = args.dsn if args.backend == "postgres" else args.out
    table = args.table or DEFAULT_TABLE
    res = build_crest(rest, cfg, out, table=table, progress=progress,
                      extra_metadata={"corpus": rest.metadata.get("corpus")})
    return {
        "kind": "crest", "backend": args.backend,
        "location": args.out if args.backend == "sqlite" else f"table {table}",
        "entries": res.n_entries, "entries_per_n": res.per_n,
        "mean_tree_nodes": round(res.mean_tree_nodes, 2), "bytes": res.storage_bytes,
        "corpus_tokens": rest.n_tokens, "seconds": round(time.perf_counter() - t0, 3),
    }


def run_info(args: argparse.Namespace) -> int:
    from recallspec.recall.datastore.open import open_tree_store
    from recallspec.recall.datastore.store import DEFAULT_TABLE, is_dsn

    loc = args.location
    t0 = time.perf_counter()
    d: dict[str, Any]
    if not is_dsn(loc) and _magic(loc) == b"RSPCREST":
        from recallspec.recall.datastore.rest import RestDatastore

        d = RestDatastore.open(loc, verify=args.verify).info().to_dict()
    else:
        if args.table and not is_dsn(loc):
            raise DataError("--table is for a PostgreSQL DSN")
        store = open_tree_store(loc, table=args.table or DEFAULT_TABLE, verify=args.verify)
        try:
            d = {"kind": "crest", "location": store.location,
                 "storage_bytes": store.storage_bytes(), "verified": bool(args.verify),
                 "metadata": store.metadata}
        finally:
            store.close()
    d["open_seconds"] = round(time.perf_counter() - t0, 6)
    if args.json:
        print(json.dumps(d))
        return 0
    for k, v in d.items():
        if isinstance(v, dict):
            v = json.dumps(v)
        print(f"{k:22} {v}")
    return 0


def _magic(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(8)
    except FileNotFoundError:
        raise IndexFileError(f"{path}: datastore file does not exist") from None
    except IsADirectoryError:
        raise IndexFileError(f"{path}: is a directory, not a datastore file") from None
