"""Brute-force references for the suffix-automaton tests (small alphabets only).

Tokens 0..25 map to letters; a corpus becomes ``doc0|doc1|...|`` which has exactly
the layout of the index's stored text (one separator after each document), so
string positions equal text positions.
"""

from __future__ import annotations

from collections.abc import Sequence


def to_str(tokens: Sequence[int]) -> str:
    return "".join(chr(97 + int(t)) for t in tokens)


def corpus_str(docs: Sequence[Sequence[int]]) -> str:
    return "".join(to_str(d) + "|" for d in docs)


def longest_suffix_in(text: str, hay: str) -> int:
    """Length of the longest suffix of ``text`` occurring in ``hay``."""
    lo = 0
    for L in range(len(text), 0, -1):
        if text[len(text) - L :] in hay:
            return L
    return lo


def count_occurrences(hay: str, sub: str) -> int:
    n, i = 0, hay.find(sub)
    while i >= 0:
        n += 1
        i = hay.find(sub, i + 1)
    return n


def static_chain(corpus: str, matched: str, n: int) -> list[int]:
    """Tokens after the earliest occurrence of ``matched``, up to the document end."""
    if not matched:
        return []
    end = corpus.find(matched) + len(matched)
    out: list[int] = []
    while len(out) < n and end < len(corpus) and corpus[end] != "|":
        out.append(ord(corpus[end]) - 97)
        end += 1
    return out


def self_match_length(text: str) -> int:
    """Longest suffix of ``text`` that also occurs ending before its last position."""
    for L in range(len(text) - 1, 0, -1):
        if text[len(text) - L :] in text[:-1]:
            return L
    return 0


def dynamic_chain(text: str, match_len: int, n: int) -> list[int]:
    """The dynamic automaton's chain draft: the longest suffix length L <= match_len
    whose earliest occurrence has >= n tokens after it, else L = 1 (suffix links
    only climb; within a state all lengths share the earliest end)."""
    if match_len == 0:
        return []
    chosen = 1
    for L in range(match_len, 0, -1):
        end = text.find(text[len(text) - L :]) + L  # index after the earliest occurrence
        if len(text) - end >= n:
            chosen = L
            break
    end = text.find(text[len(text) - chosen :]) + chosen
    return [ord(c) - 97 for c in text[end : end + n]]
