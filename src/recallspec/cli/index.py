"""`recallspec index build|info`: corpus suffix-automaton index files."""

from __future__ import annotations

import argparse
import json
import os
import time

from recallspec.errors import DataError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("index", help="build or inspect a corpus suffix-automaton index")
    isub = p.add_subparsers(dest="index_command", required=True, metavar="SUBCOMMAND")

    b = isub.add_parser("build", help="tokenize a corpus and build an index file")
    b.add_argument("--corpus", nargs="+", required=True, metavar="FILE",
                   help="corpus files: .jsonl, .json, .txt (optionally .gz)")
    b.add_argument("--field", default=None, help="take this record field as the document text")
    b.add_argument("--chat-template", action="store_true",
                   help="render each record as a chat with the model's template")
    b.add_argument("--txt-mode", choices=["blocks", "file"], default="blocks",
                   help="plain text: one document per blank-line block (default) or per file")
    b.add_argument("--model", default=None,
                   help="model whose tokenizer to use (default: SmolLM2-135M-Instruct)")
    b.add_argument("--out", required=True, help="index file to write (atomically)")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.add_argument("--json", action="store_true", help="print the summary as JSON")
    b.set_defaults(handler=run_build)

    i = isub.add_parser("info", help="show an index file's header")
    i.add_argument("path")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.add_argument("--verify", action="store_true", help="also verify the payload checksum")
    i.set_defaults(handler=run_info)

    e = isub.add_parser("export", help="write an index's corpus for another engine")
    e.add_argument("path", metavar="INDEX")
    e.add_argument("--format", choices=["sglang"], required=True,
                   help="sglang: JSONL of document strings for SGLang's NGRAM mode "
                        "(--speculative-ngram-external-corpus-path)")
    e.add_argument("--out", required=True, help="file to write (atomically)")
    e.add_argument("--model", default=None,
                   help="model whose tokenizer built the index (default: SmolLM2-135M-Instruct)")
    e.add_argument("--check", action="store_true",
                   help="count documents whose text re-encodes to the indexed tokens")
    e.add_argument("--json", action="store_true", help="print the summary as JSON")
    e.set_defaults(handler=run_export)


def run_build(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from recallspec.data.corpus_files import chat_template_of, iter_corpus
    from recallspec.models import load_tokenizer
    from recallspec.recall.automata import IndexBuilder, StaticIndex

    t0 = time.perf_counter()
    tok = load_tokenizer(args.model)
    template = chat_template_of(tok, args.chat_template)
    total_bytes = sum(os.path.getsize(p) for p in args.corpus if os.path.isfile(p))
    # ~4 bytes of text per token: reserving up front avoids regrowth copies (2x peak).
    builder = IndexBuilder(tok.vocab_size, expected_tokens=total_bytes // 4)
    bar = tqdm(total=total_bytes or None, unit="B", unit_scale=True, desc="tokenize+build",
               disable=args.no_progress)
    batch: list[str] = []
    batch_chars = 0

    def flush() -> None:
        nonlocal batch, batch_chars
        if batch:
            builder.add_documents(tok.encode_batch(batch))
            bar.update(batch_chars)  # progress in (approximate) input bytes
            bar.set_postfix(tokens=builder.n_tokens, refresh=False)
        batch, batch_chars = [], 0

    for doc in iter_corpus(args.corpus, field=args.field, chat_template=template,
                           txt_mode=args.txt_mode):
        batch.append(doc)
        batch_chars += len(doc.encode("utf-8", "replace"))
        if batch_chars >= 1 << 20:
            flush()
    flush()
    if bar.total:  # progress counts document text, which is smaller than the files' bytes
        bar.update(bar.total - bar.n)
    bar.close()
    if builder.n_tokens == 0:
        raise DataError(
            "empty corpus: no tokens in " + ", ".join(args.corpus)
            + " (check the file format or choose a field with --field)"
        )
    meta = {
        "corpus": [os.path.basename(p) for p in args.corpus][:20],
        "field": args.field,
        "chat_template": bool(args.chat_template),
        "model": str(args.model) if args.model else "default",
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    n_states = builder.n_states
    size = builder.write(args.out, tok.fingerprint, meta)
    secs = time.perf_counter() - t0
    info = StaticIndex.open(args.out, expected_fingerprint=tok.fingerprint).info()
    summary = {
        "path": args.out, "tokens": info.n_tokens, "documents": info.n_docs,
        "states": n_states, "edges": info.n_edges, "bytes": size,
        "bytes_per_token": round(size / max(1, info.n_tokens), 2), "seconds": round(secs, 3),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"wrote {args.out}: {summary['tokens']:,} tokens in "
            f"{summary['documents']:,} documents, "
            f"{n_states:,} states, {info.n_edges:,} edges, {size:,} bytes "
            f"({summary['bytes_per_token']} B/token) in {secs:.2f} s"
        )
    return 0


def run_info(args: argparse.Namespace) -> int:
    from recallspec.recall.automata import StaticIndex

    t0 = time.perf_counter()
    info = StaticIndex.open(args.path, verify=args.verify).info()
    secs = time.perf_counter() - t0
    d = info.to_dict()
    d["open_seconds"] = round(secs, 6)
    if args.json:
        print(json.dumps(d))
        return 0
    for k, v in d.items():
        if k == "metadata":
            v = json.dumps(v)
        print(f"{k:22} {v}")
    return 0


def run_export(args: argparse.Namespace) -> int:
    from recallspec.integrations.sglang import export_sglang
    from recallspec.models import load_tokenizer
    from recallspec.recall.automata import StaticIndex

    index = StaticIndex.open(args.path)
    summary = export_sglang(index, load_tokenizer(args.model), args.out, check=args.check)
    if args.json:
        print(json.dumps(summary.to_dict()))
        return 0
    rt = "" if summary.round_trip is None else (
        f"; {summary.round_trip:,} re-encode to the same tokens")
    print(f"wrote {summary.path}: {summary.documents:,} documents, {summary.tokens:,} tokens{rt}")
    print(f"SGLang: python -m sglang.launch_server --model-path MODEL {summary.flags}")
    return 0
