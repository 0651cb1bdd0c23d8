"""REST datastores for the datastore tests: a small byte corpus, building it into a file
(with the fingerprint of ``engine_helpers.FP``), and reading a retrieved tree's paths."""

from __future__ import annotations

from pathlib import Path

from helpers.engine import FP

from recallspec.decoding.tree import DraftTree
from recallspec.recall.datastore.rest import RestDatastore, build_rest

DOCS = [list(b"the quick brown fox jumps over the lazy dog"), list(b"the quick red fox"),
        list(b"lorem ipsum dolor sit amet, the quick"), list(b"abcabcabcabc")]


def paths(tree: DraftTree) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    for i, p in enumerate(tree.parents.tolist()):
        out.append((*(out[p] if p >= 0 else ()), int(tree.tokens[i])))
    return out


def build(tmp_path: Path, docs: list[list[int]] = DOCS, name: str = "c.rest") -> RestDatastore:
    return build_rest(docs, vocab_size=256, tokenizer_fingerprint=FP, path=tmp_path / name,
                      metadata={"test": 1})
