"""Property tests: the C++ suffix automata against brute force on small alphabets.

Small alphabets (2-4 symbols) force deep, highly shared automaton structure
(many clones). Every test checks many steps per example; across this file well
over 10^5 individual step/draft comparisons are made.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from helpers.sam_bruteforce import (
    corpus_str,
    count_occurrences,
    dynamic_chain,
    longest_suffix_in,
    self_match_length,
    static_chain,
    to_str,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recallspec.recall.automata import DynamicAutomaton, MatchCursor, StaticIndex

_TMP = tempfile.TemporaryDirectory(prefix="recallspec-sam-test-")
_SETTINGS: dict[str, Any] = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
CHECKS = {"n": 0}  # step comparisons made (reported by test_zz_case_count)


def _build(docs: list[list[int]], vocab: int, wide: bool = False) -> StaticIndex:
    # wide: a vocabulary of >= 65535 ids switches the file to 32-bit token sections.
    path = Path(_TMP.name) / "p.idx"
    v = vocab + 70_000 if wide else vocab
    return StaticIndex.build([np.asarray(d, np.uint32) for d in docs], v, "fp", path)


@st.composite
def corpus_and_stream(draw: st.DrawFn) -> tuple[int, list[list[int]], list[int]]:
    k = draw(st.integers(2, 4))
    sym = st.integers(0, k - 1)
    docs = draw(st.lists(st.lists(sym, min_size=0, max_size=40), min_size=1, max_size=6))
    if not any(docs):
        docs.append([0])
    stream = draw(st.lists(sym, min_size=1, max_size=200))
    return k, docs, stream


def _tree_consistent(corpus: str, matched: str, toks, pars, counts, max_nodes: int, k: int) -> None:
    n = len(toks)
    paths: list[str] = []
    for i in range(n):
        assert -1 <= pars[i] < i
        base = matched if pars[i] < 0 else paths[pars[i]]
        paths.append(base + chr(97 + int(toks[i])))
        assert counts[i] == count_occurrences(corpus, paths[i]) > 0
        CHECKS["n"] += 1
    assert all(counts[i] >= counts[i + 1] for i in range(n - 1)), "best-first order"
    assert len(set(zip(pars.tolist(), toks.tolist(), strict=True))) == n, "siblings distinct"
    # Every frequent continuation left out must be no more frequent than the last taken.
    emitted = set(paths)
    for base in [matched, *paths]:
        for c in range(k):
            s = base + chr(97 + c)
            if s in emitted:
                continue
            cnt = count_occurrences(corpus, s)
            if cnt:
                assert n == max_nodes and cnt <= counts[-1], (s, cnt)


@settings(max_examples=1500, **_SETTINGS)
@given(corpus_and_stream(), st.integers(1, 12), st.sampled_from([False, False, False, True]))
def test_static_cursor_and_drafts_match_bruteforce(case, n_draft, wide) -> None:
    k, docs, stream = case
    idx = _build(docs, k, wide)
    corpus = corpus_str(docs)
    cur = idx.cursor()
    lengths = cur.advance_lengths(np.asarray(stream, np.uint32))
    cur.reset()
    text = to_str(stream)
    for i, tok in enumerate(stream):
        got = cur.advance(tok)
        want = longest_suffix_in(text[: i + 1], corpus)
        assert got == want == lengths[i], (i, got, want)
        matched = text[i + 1 - want : i + 1]
        assert cur.draft_chain(n_draft).tolist() == static_chain(corpus, matched, n_draft)
        CHECKS["n"] += 2
        if i % 8 == 0:
            tree, counts = cur.draft_tree_counts(6)
            if want == 0:
                assert len(tree) == 0  # no match, no draft
            else:
                _tree_consistent(corpus, matched, tree.tokens, tree.parents, counts, 6, k)


@settings(max_examples=2000, **_SETTINGS)
@given(
    st.integers(2, 4).flatmap(lambda k: st.lists(st.integers(0, k - 1), min_size=30, max_size=250)),
    st.integers(1, 10),
)
def test_dynamic_self_match_and_chain(stream, n_draft) -> None:
    dyn = DynamicAutomaton()
    text = to_str(stream)
    for i, tok in enumerate(stream):
        got = dyn.extend(tok)
        prefix = text[: i + 1]
        want = self_match_length(prefix)
        assert got == want == dyn.match_length, (i, got, want)
        assert dyn.draft_chain(n_draft).tolist() == dynamic_chain(prefix, want, n_draft)
        CHECKS["n"] += 2
    # Batched extension gives the same lengths.
    dyn2 = DynamicAutomaton()
    lengths = dyn2.extend_lengths(np.asarray(stream, np.uint32))
    assert lengths.tolist() == [self_match_length(text[: i + 1]) for i in range(len(text))]
    assert dyn2.tokens.tolist() == stream


@settings(max_examples=800, **_SETTINGS)
@given(st.integers(2, 3).flatmap(lambda k: st.tuples(
    st.just(k),
    st.lists(st.integers(0, k - 1), min_size=1, max_size=60),
    st.lists(st.integers(0, k - 1), min_size=1, max_size=60),
)))
def test_dynamic_tree_counts(case) -> None:
    k, stream, _ = case
    dyn = DynamicAutomaton()
    text = to_str(stream)
    for i, tok in enumerate(stream):
        m = dyn.extend(tok)
        if i % 3:
            continue
        prefix = text[: i + 1]
        tree, counts = dyn.draft_tree_counts(5)
        if m == 0:
            assert len(tree) == 0
        else:
            matched = prefix[len(prefix) - m :]
            _tree_consistent(prefix, matched, tree.tokens, tree.parents, counts, 5, k)


@settings(max_examples=1500, **_SETTINGS)
@given(st.integers(2, 4).flatmap(lambda k: st.tuples(
    st.lists(st.integers(0, k - 1), min_size=1, max_size=60),
    st.lists(st.integers(0, k - 1), min_size=1, max_size=40),
    st.lists(st.integers(0, k - 1), min_size=0, max_size=80),
)))
def test_dynamic_cursor_survives_growth(case) -> None:
    """A cursor over a growing automaton (states get cloned under it) still reports
    the longest suffix of its stream that occurs in the automaton's current text."""
    base, more, stream = case
    dyn = DynamicAutomaton(base)
    cur = dyn.cursor()
    fed = ""
    for i, tok in enumerate(stream):
        if i < len(more):  # grow the automaton while the cursor holds a state
            dyn.extend(more[i])
        fed += chr(97 + tok)
        got = cur.advance(tok)
        hay = to_str(dyn.tokens.tolist())
        # The cursor's match can only be as long as a match that existed when each of its
        # tokens was fed; it must still occur now, and never exceed the true longest.
        assert got <= longest_suffix_in(fed, hay)
        assert fed[len(fed) - got :] in hay
        CHECKS["n"] += 1
    # With the automaton frozen, a fresh pass is exact.
    cur2 = dyn.cursor()
    hay = to_str(dyn.tokens.tolist())
    for i, tok in enumerate(stream):
        assert cur2.advance(tok) == longest_suffix_in(to_str(stream[: i + 1]), hay)
        CHECKS["n"] += 1


def test_real_bytes_stream() -> None:
    """Bytes of a real file as tokens (vocab 256): cursor vs brute force at sampled steps."""
    src = Path(__file__).read_bytes()[:6000]
    docs = [list(src[:3000]), list(src[3000:])]
    idx = StaticIndex.build(docs, 256, "bytes", Path(_TMP.name) / "bytes.idx")
    hay = b"|".join(bytes(d) for d in docs) + b"|"
    stream = list(src[1500:4500])
    cur = MatchCursor(idx)
    lengths = cur.advance_lengths(stream)
    for i in range(0, len(stream), 7):
        s = bytes(stream[: i + 1])
        want = next((L for L in range(min(len(s), 3000), 0, -1) if s[len(s) - L :] in hay), 0)
        assert lengths[i] == want
    dyn = DynamicAutomaton()
    got = dyn.extend_lengths(list(src[:1500]))
    for i in range(0, 1500, 11):
        s = src[: i + 1]
        want = next((L for L in range(i, 0, -1) if s[len(s) - L :] in s[:-1]), 0)
        assert got[i] == want


def test_zz_case_count() -> None:
    # Runs last in this file: documents that the properties made >= 10^5 comparisons.
    if CHECKS["n"]:
        print(f"suffix-automaton property comparisons: {CHECKS['n']}")
        assert CHECKS["n"] >= 100_000, CHECKS["n"]
