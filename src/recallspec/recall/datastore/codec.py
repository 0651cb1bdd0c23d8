"""Serialised draft trees (the values of a CREST store).

``raw`` packing: tokens as little-endian uint16 when the vocabulary has < 65536 ids
(uint32 otherwise), then ``parent + 1`` as uint8 (trees have at most 255 nodes, in
the trie's best-first order, so parent < index). ``zlib`` and ``lzma`` compress the
raw packing (lzma in raw LZMA2 format: no container header on small values).
The codec and token width are store-wide metadata, not per value.
"""

from __future__ import annotations

import lzma
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from recallspec.decoding.tree import DraftTree

CODECS = ("raw", "zlib", "lzma")
MAX_TREE_NODES = 255
_INDEX = np.arange(MAX_TREE_NODES, dtype=np.uint8)  # node i may have stored parent+1 <= i
_LZMA_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]


@dataclass(frozen=True)
class TreeCodec:
    name: str  # one of CODECS
    token_bytes: int  # 2 or 4

    def __post_init__(self) -> None:
        if self.name not in CODECS:
            raise ValueError(f"unknown codec {self.name!r}; choose from {', '.join(CODECS)}")
        if self.token_bytes not in (2, 4):
            raise ValueError("token_bytes must be 2 or 4")

    @staticmethod
    def for_vocab(name: str, vocab_size: int) -> TreeCodec:
        return TreeCodec(name, 2 if vocab_size <= 0xFFFF else 4)

    def encode(self, tree: DraftTree) -> bytes:
        n = len(tree)
        if n > MAX_TREE_NODES:
            raise ValueError(f"trees are stored with at most {MAX_TREE_NODES} nodes")
        dt = "<u2" if self.token_bytes == 2 else "<u4"
        raw = tree.tokens.astype(dt).tobytes() + (tree.parents + 1).astype(np.uint8).tobytes()
        return _COMPRESS[self.name](raw)

    def decode(self, blob: bytes, max_nodes: int | None = None) -> DraftTree:
        """The tree of ``blob`` - only its first ``max_nodes`` nodes if given (trees are
        stored best-first, so this is the engine's truncation without decoding the
        rest); ValueError if it is not a valid encoded tree.

        Hot path of every CREST step: the tree invariant (-1 <= parents[i] < i) is
        checked here on the uint8 encoding in one vectorised comparison (stored
        parent + 1 <= i), which makes DraftTree's own, slower check redundant.
        """
        raw = _DECOMPRESS[self.name](blob)
        width = self.token_bytes + 1
        n = len(raw) // width
        if n * width != len(raw) or n > MAX_TREE_NODES:
            raise ValueError(f"bad encoded tree length {len(raw)}")
        k = n if max_nodes is None else max(0, min(n, max_nodes))
        dt = "<u2" if self.token_bytes == 2 else "<u4"
        tokens = np.frombuffer(raw, dt, k).astype(np.int64)
        par1 = np.frombuffer(raw, np.uint8, k, n * self.token_bytes)
        if (par1 > _INDEX[:k]).any():
            raise ValueError("encoded tree has a parent at or after its child")
        parents = np.subtract(par1, 1, dtype=np.int64)
        tree = object.__new__(DraftTree)  # fields validated above; skip __post_init__
        object.__setattr__(tree, "tokens", tokens)
        object.__setattr__(tree, "parents", parents)
        return tree


def _lzma_c(b: bytes) -> bytes:
    return lzma.compress(b, format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)


def _lzma_d(b: bytes) -> bytes:
    return lzma.decompress(b, format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)


_COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "raw": bytes, "zlib": lambda b: zlib.compress(b, 9), "lzma": _lzma_c,
}
_DECOMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "raw": bytes, "zlib": zlib.decompress, "lzma": _lzma_d,
}
