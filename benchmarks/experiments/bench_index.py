#!/usr/bin/env python
"""Micro-benchmark of the suffix-automaton index (issue 3).

For each corpus kind and size: build time per token, bytes per corpus token on disk,
peak build memory, open time, resident memory after open + matching, match-step time
(batched), chain-draft (40 tokens) and tree-draft (32 nodes) time per call. Also a
pure-Python dict-based automaton (the research-code design) at 1M tokens.

Corpus kinds:
  text    real tokens (the shared data, tokenized with the default tokenizer), repeated
          as needed; every copy after the first gets 1% random substitutions so that
          repeats are not identical documents (identical repeats add no states at all).
  random  uniform random token ids over the vocabulary, 512-token documents.

Every measurement runs in its own subprocess (clean peak-RSS figures). Writes
OUT/bench_index.json and OUT/bench_index.md (OUT also caches the tokenized corpus).

  .venv/bin/python benchmarks/experiments/bench_index.py --out bench_out/index \\
      --sizes 1e6 1e7 1e8

Feeds the notebook docs/history/benchmarks_2026-11.md, "Suffix automaton index (issue 3)".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import write_outputs

from recallspec.markdown import table_lines

VOCAB = 49152  # SmolLM2 vocabulary size
DOC_RANDOM = 512


# -- corpora --------------------------------------------------------------------------
def real_tokens(cache: Path) -> tuple[np.ndarray, np.ndarray, int, str]:
    """All shared-data documents tokenized; cached as .npz. Returns tokens, offsets, vocab, fp."""
    f = cache / "real_tokens.npz"
    if f.is_file():
        z = np.load(f)
        return z["tokens"], z["offsets"], int(z["vocab"]), str(z["fp"])
    from recallspec.data.corpus_files import iter_documents
    from recallspec.data.paths import data_dir
    from recallspec.models import load_tokenizer

    tok = load_tokenizer(None)
    docs: list[str] = []
    for p in sorted(data_dir().rglob("*")):
        if p.is_file() and p.name != "MANIFEST.json" and p.suffix in (".jsonl", ".json", ".gz"):
            docs.extend(iter_documents(p))
    ids = tok.encode_batch(docs)
    arrays = [np.asarray(x, np.uint32) for x in ids if x]
    offsets = np.zeros(len(arrays) + 1, np.int64)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    tokens = np.concatenate(arrays)
    np.savez(f, tokens=tokens, offsets=offsets, vocab=tok.vocab_size, fp=tok.fingerprint)
    return tokens, offsets, tok.vocab_size, tok.fingerprint


def make_corpus(
    kind: str, n: int, cache: Path, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, int]:
    rng = np.random.default_rng(seed)
    if kind == "random":
        toks = rng.integers(0, VOCAB, n, dtype=np.uint32)
        bounds = np.arange(0, n + DOC_RANDOM, DOC_RANDOM, dtype=np.int64)
        bounds[-1] = n
        return toks, np.unique(bounds), VOCAB
    base, base_off, vocab, _ = real_tokens(cache)
    reps = -(-n // len(base))
    parts: list[np.ndarray] = []
    offs: list[np.ndarray] = [np.zeros(1, np.int64)]
    total = 0
    for r in range(reps):
        t = base.copy()
        if r:
            mask = rng.random(len(t)) < 0.01
            t[mask] = rng.choice(base, int(mask.sum()))
        parts.append(t)
        offs.append(base_off[1:] + total)
        total += len(t)
    toks = np.concatenate(parts)[:n]
    off = np.concatenate(offs)
    off = np.append(off[off < n], n)
    return toks, off, vocab


def query_stream(kind: str, corpus: np.ndarray, n: int, seed: int = 1) -> np.ndarray:
    """What a decoder would feed: a corpus slice with 3% substitutions (real), or random."""
    rng = np.random.default_rng(seed)
    if kind == "random":
        return rng.integers(0, VOCAB, n, dtype=np.uint32)
    start = int(rng.integers(0, max(1, len(corpus) - n)))
    q = corpus[start : start + n].copy()
    mask = rng.random(len(q)) < 0.03
    q[mask] = rng.choice(corpus[: 1 << 20], int(mask.sum()))
    return q


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> None:
    """Reset the process's peak-RSS mark (Linux: writing 5 to clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# -- workers (each in a fresh process) --------------------------------------------------
def worker_build(kind: str, n: int, path: str, cache: Path) -> dict[str, Any]:
    from recallspec.recall.automata import IndexBuilder

    toks, offs, vocab = make_corpus(kind, n, cache)
    rss0 = rss_bytes()
    reset_peak_rss()  # count only the build, not corpus generation
    t0 = time.perf_counter()
    b = IndexBuilder(vocab, expected_tokens=n)
    step = 1 << 22  # feed in chunks of whole documents (as the CLI does)
    i = 0
    while i < len(offs) - 1:
        j = int(np.searchsorted(offs, offs[i] + step, side="right")) - 1
        j = max(j, i + 1)
        sub = offs[i : j + 1] - offs[i]
        b.add_flat(toks[offs[i] : offs[j]], sub)
        i = j
    t1 = time.perf_counter()
    n_states, n_edges = b.n_states, b._b.n_edges
    size = b.write(path, "bench", {"kind": kind})
    t2 = time.perf_counter()
    return {
        "kind": kind, "tokens": int(n), "states": int(n_states), "edges": int(n_edges),
        "build_s": t2 - t0, "construct_s": t1 - t0, "write_s": t2 - t1,
        "build_us_per_token": (t2 - t0) / n * 1e6, "file_bytes": size,
        "bytes_per_token": size / n,
        "peak_build_rss_bytes_per_token": (peak_rss_bytes() - rss0) / n,
    }


def worker_query(kind: str, n: int, path: str, cache: Path) -> dict[str, Any]:
    from recallspec.recall.automata import StaticIndex

    toks, _, _ = make_corpus(kind, min(n, 1 << 21), cache) if kind == "text" else (None, 0, 0)
    q = query_stream(kind, toks if toks is not None else np.zeros(1, np.uint32), 1 << 20)
    rss0 = rss_bytes()
    t0 = time.perf_counter()
    idx = StaticIndex.open(path)
    open_s = time.perf_counter() - t0
    opens = []
    for _ in range(20):
        t = time.perf_counter()
        StaticIndex.open(path)
        opens.append(time.perf_counter() - t)
    cur = idx.cursor()
    raw = cur._c
    out_len = np.empty(len(q), np.int64)
    t = time.perf_counter()
    raw.advance_lengths(q, out_len)
    match_first = (time.perf_counter() - t) / len(q)
    raw.reset()
    t = time.perf_counter()
    raw.advance_lengths(q, out_len)
    match_warm = (time.perf_counter() - t) / len(q)
    resident = rss_bytes() - rss0
    # Drafts at 20k points along the stream (the cursor advanced one token between them).
    k = 20000
    chain = np.empty(40, np.int64)
    tt, tp, tc = (np.empty(32, np.int64) for _ in range(3))
    pts = q[:k]
    one = [np.ascontiguousarray(pts[i : i + 1]) for i in range(k)]
    raw.reset()
    t = time.perf_counter()
    for a in one:
        raw.advance(a)
    adv_call = (time.perf_counter() - t) / k
    raw.reset()
    drafted = 0
    t = time.perf_counter()
    for a in one:
        raw.advance(a)
        drafted += raw.draft_chain(chain)
    chain_s = (time.perf_counter() - t) / k - adv_call
    raw.reset()
    nodes = 0
    t = time.perf_counter()
    for a in one:
        raw.advance(a)
        nodes += raw.draft_tree(1 << 40, tt, tp, tc)
    tree_s = (time.perf_counter() - t) / k - adv_call
    # The same through the typed Python wrapper (argument checks included).
    cur.reset()
    t = time.perf_counter()
    for a in one[:5000]:
        cur.advance(a)
        cur.draft_chain_into(chain)
    wrap_s = (time.perf_counter() - t) / 5000
    # Empty-call overhead of one nanobind call, for reference.
    t = time.perf_counter()
    for _ in range(k):
        _ = raw.length
    call_s = (time.perf_counter() - t) / k
    return {
        "open_first_ms": open_s * 1e3, "open_median_ms": float(np.median(opens)) * 1e3,
        "match_step_ns": match_warm * 1e9, "match_step_cold_ns": match_first * 1e9,
        "mean_match_len": float(out_len.mean()),
        "resident_after_queries_MiB": resident / 2**20,
        "resident_bytes_per_token": resident / n,
        "chain40_us": chain_s * 1e6, "chain40_mean_tokens": drafted / k,
        "tree32_us": tree_s * 1e6, "tree32_mean_nodes": nodes / k,
        "advance1_call_us": adv_call * 1e6, "python_call_overhead_us": call_s * 1e6,
        "wrapper_advance_plus_chain_us": wrap_s * 1e6,
    }


class DictSAM:
    """The research-code design: one Python object with a dict per state."""

    __slots__ = ("last", "states")

    class State:
        __slots__ = ("firstpos", "len", "link", "next")

        def __init__(self, length: int, link: int, firstpos: int) -> None:
            self.len, self.link, self.firstpos = length, link, firstpos
            self.next: dict[int, int] = {}

    def __init__(self) -> None:
        self.states = [DictSAM.State(0, -1, -1)]
        self.last = 0

    def extend(self, c: int, pos: int) -> None:
        st = self.states
        cur = len(st)
        st.append(DictSAM.State(st[self.last].len + 1, 0, pos))
        p = self.last
        while p != -1 and c not in st[p].next:
            st[p].next[c] = cur
            p = st[p].link
        if p != -1:
            q = st[p].next[c]
            if st[p].len + 1 == st[q].len:
                st[cur].link = q
            else:
                cl = len(st)
                s = DictSAM.State(st[p].len + 1, st[q].link, st[q].firstpos)
                s.next = dict(st[q].next)
                st.append(s)
                while p != -1 and st[p].next.get(c) == q:
                    st[p].next[c] = cl
                    p = st[p].link
                st[q].link = st[cur].link = cl
        self.last = cur


def worker_python(kind: str, n: int, cache: Path) -> dict[str, Any]:
    toks, offs, _ = make_corpus(kind, n, cache)
    rss0 = rss_bytes()
    t0 = time.perf_counter()
    sam = DictSAM()
    tl = toks.tolist()
    for d in range(len(offs) - 1):
        # Documents joined as one string here (no reset): the reference is for timing and
        # memory only; the classic single-string construction is the research code's.
        for i in range(int(offs[d]), int(offs[d + 1])):
            sam.extend(tl[i], i)
    build = time.perf_counter() - t0
    mem = rss_bytes() - rss0
    q = query_stream(kind, toks, 200_000).tolist()
    st = sam.states
    s, length = 0, 0
    t = time.perf_counter()
    for c in q:
        while s and c not in st[s].next:
            s = st[s].link
            length = st[s].len
        if c in st[s].next:
            s = st[s].next[c]
            length += 1
        else:
            length = 0
    step = (time.perf_counter() - t) / len(q)
    return {"kind": kind, "tokens": n, "states": len(st), "build_us_per_token": build / n * 1e6,
            "bytes_per_token": mem / n, "match_step_ns": step * 1e9}


# -- driver -----------------------------------------------------------------------------
def run_worker(args: list[str], out: Path) -> dict[str, Any]:
    r = subprocess.run([sys.executable, __file__, "--out", str(out), "--worker", *args],
                       capture_output=True, text=True, check=False)
    if r.returncode:
        raise RuntimeError(f"worker {args} failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def markdown(rows: list[dict[str, Any]], py: list[dict[str, Any]]) -> list[str]:
    head = ["corpus", "tokens", "states/tok", "edges/tok", "build µs/tok", "disk B/tok",
            "peak build B/tok", "open ms", "resident MiB", "match step ns", "chain-40 µs",
            "tree-32 µs"]
    body = [[r["kind"], f"{r['tokens']:,}", f"{r['states'] / r['tokens']:.2f}",
             f"{r['edges'] / r['tokens']:.2f}", f"{r['build_us_per_token']:.3f}",
             f"{r['bytes_per_token']:.1f}", f"{r['peak_build_rss_bytes_per_token']:.1f}",
             f"{r['open_median_ms']:.3f}", f"{r['resident_after_queries_MiB']:.1f}",
             f"{r['match_step_ns']:.0f}", f"{r['chain40_us']:.2f}", f"{r['tree32_us']:.2f}"]
            for r in rows]
    body += [[f"{r['kind']} (Python dict SAM)", f"{r['tokens']:,}",
              f"{r['states'] / r['tokens']:.2f}", "-", f"{r['build_us_per_token']:.3f}",
              f"{r['bytes_per_token']:.0f} (RAM)", "-", "-", "-", f"{r['match_step_ns']:.0f}",
              "-", "-"] for r in py]
    return table_lines(head, body)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="bench_out/index")
    ap.add_argument("--sizes", nargs="+", type=float, default=[1e6, 1e7, 1e8])
    ap.add_argument("--kinds", nargs="+", default=["text", "random"])
    ap.add_argument("--python-ref-tokens", type=float, default=1e6)
    ap.add_argument("--keep-index", action="store_true", help="keep the index files")
    ap.add_argument("--worker", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.worker:
        what, kind, n, *rest = a.worker
        if what == "build":
            res = worker_build(kind, int(float(n)), rest[0], out)
        elif what == "query":
            res = worker_query(kind, int(float(n)), rest[0], out)
        else:
            res = worker_python(kind, int(float(n)), out)
        print(json.dumps(res))
        return 0
    real_tokens(out)  # tokenize once, cached
    rows, py = [], []
    for kind in a.kinds:
        for size in a.sizes:
            n = int(size)
            path = str(out / f"{kind}_{n}.idx")
            print(f"[bench] build {kind} {n:,}", file=sys.stderr, flush=True)
            r = run_worker(["build", kind, str(n), path], out)
            print(f"[bench] query {kind} {n:,}", file=sys.stderr, flush=True)
            r.update(run_worker(["query", kind, str(n), path], out))
            rows.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
            if not a.keep_index:
                os.remove(path)
        if a.python_ref_tokens:
            print(f"[bench] python dict SAM {kind}", file=sys.stderr, flush=True)
            py.append(run_worker(["python", kind, str(int(a.python_ref_tokens))], out))
    meta = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": platform.processor()
        or platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
        "command": " ".join(["python", *sys.argv]),
    }
    write_outputs(out / "bench_index", {"meta": meta, "rows": rows, "python_reference": py},
                  markdown(rows, py))
    return 0


if __name__ == "__main__":
    sys.exit(main())
