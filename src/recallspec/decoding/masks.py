"""Grammar guides and token masks: what a constrained row may choose, as pure functions.

A ``Guide`` says which texts a request may generate (a JSON schema, any JSON object, a
regular expression, a GBNF or Lark grammar); the grammar package (``grammar/``) compiles
it for a tokenizer into a matcher, which gives each verified row a *mask*: one bit per
token of the vocabulary, set where the token may come next. Masks are numpy int32 arrays
of ``words(V)`` words a row (llguidance's layout): token t is bit ``t & 31`` of word
``t >> 5``; a tree's masks are ``[1 + len(tree), words(V)]``, the root's row first, then
each node's, the rows of its logits.

Where the mask acts: after penalties, before temperature, top-k and top-p. A forbidden
token's logit becomes -inf, so no later step can bring it back, and top-k / top-p choose
among allowed tokens only. Greedy takes the largest allowed logit (the first index of it,
as argmax does); sampling draws from the softmax of the masked row. Masking only removes
tokens, so where the row's own argmax is allowed it is also the masked argmax: greedy
verification reads a row's logits only where its argmax is forbidden.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from recallspec.decoding.tree import DraftTree
from recallspec.errors import DataError

GuideKind = Literal["json_object", "json_schema", "regex", "gbnf", "lark", "llguidance"]
GUIDE_KINDS: tuple[GuideKind, ...] = (
    "json_object", "json_schema", "regex", "gbnf", "lark", "llguidance")
MAX_GUIDE_BYTES = 128 * 1024  # a guide's text at most (a larger one is refused)

Mask = npt.NDArray[np.int32]  # [words(V)] one row, or [rows, words(V)]


@dataclass(frozen=True)
class Guide:
    """What a constrained request may generate.

    ``kind``: "json_object" (any JSON object; ``source`` is "" or a schema the object
    must also satisfy, llama-server's ``response_format.schema``), "json_schema" (the
    schema as compact JSON, ``canonical_json``), "regex", "gbnf" (llama.cpp's grammar
    format), "lark" (llguidance's Lark dialect) or "llguidance" (a grammar as llguidance
    takes it, Lark with ``%llguidance`` options or its JSON format: the tool-call grammars,
    ``server/tool_grammar.py``, with their lazy triggers). Build
    schema guides with ``json_schema`` so that equal schemas give equal guides (the
    compiled-grammar cache is keyed by the guide)."""

    kind: GuideKind
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in GUIDE_KINDS:
            raise DataError(f"unknown guide kind {self.kind!r}: one of {', '.join(GUIDE_KINDS)}")
        if not isinstance(self.source, str):
            raise DataError("a guide's source must be a string")
        if len(self.source.encode()) > MAX_GUIDE_BYTES:
            raise DataError(f"the {self.kind} guide is {len(self.source.encode())} bytes, "
                            f"over the {MAX_GUIDE_BYTES} allowed")
        if self.kind in ("regex", "gbnf", "lark", "llguidance") and not self.source:
            raise DataError(f"a {self.kind} guide needs a non-empty source")

    @staticmethod
    def json_schema(schema: Any) -> Guide:
        """The guide of a JSON schema (a dict, or True for any JSON value)."""
        if not isinstance(schema, dict | bool):
            raise DataError("a JSON schema must be an object (or a boolean)")
        return Guide("json_schema", canonical_json(schema))

    @staticmethod
    def json_object(schema: Any = None) -> Guide:
        """Any JSON object (and, with ``schema``, one that satisfies it)."""
        if schema is None:
            return Guide("json_object")
        if not isinstance(schema, dict):
            raise DataError("a JSON schema must be an object")
        return Guide("json_object", canonical_json(schema))


@dataclass(frozen=True)
class Constrained:
    """A draft tree under a grammar (``step.sequence.Constraint.constrain``)."""

    tree: DraftTree  # the drafter's allowed nodes (in their order), then the forced ones
    masks: Mask  # [1 + len(tree), words(V)]: the root's row, then each node's
    drafted: int  # nodes of ``tree`` that the drafter proposed (its first ones)
    cut: int  # drafter nodes the grammar forbade (with their subtrees), never verified
    # The drafter's tree's index of each of ``tree``'s first ``drafted`` nodes (what its
    # statistics learn by: a cut node there counts as reached and rejected).
    kept: tuple[int, ...] = ()

    @property
    def forced(self) -> int:
        """Nodes the grammar forced (the tree's last ones)."""
        return len(self.tree) - self.drafted

    def truncate(self, max_nodes: int) -> Constrained:
        """The first ``max_nodes`` nodes and their rows (a tree prefix stays a tree)."""
        if max_nodes >= len(self.tree):
            return self
        drafted = min(self.drafted, max_nodes)
        return Constrained(self.tree.truncate(max_nodes), self.masks[: max_nodes + 1],
                           drafted, self.cut, self.kept[:drafted])


def canonical_json(value: Any) -> str:
    """``value`` as compact JSON, its keys in their order: a schema's property order is
    the order the output writes them in (as OpenAI and llama.cpp keep it), so two
    schemas that list properties differently are different guides."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise DataError(f"not JSON: {e}") from None


def words(vocab_size: int) -> int:
    """int32 words a mask row of ``vocab_size`` tokens takes."""
    return (vocab_size + 31) // 32


def allowed(mask: Mask, token: int) -> bool:
    """Whether one row's mask allows ``token``."""
    return bool((int(mask[token >> 5]) >> (token & 31)) & 1)


def allowed_ids(mask: Mask, vocab_size: int) -> npt.NDArray[np.bool_]:
    """One row's mask as a boolean array over the vocabulary."""
    bits = np.unpackbits(np.ascontiguousarray(mask).view(np.uint8), bitorder="little")
    return bits[:vocab_size].astype(bool)


def count_allowed(mask: Mask, vocab_size: int) -> int:
    """How many tokens one row's mask allows."""
    return int(allowed_ids(mask, vocab_size).sum())


def apply(row: Any, mask: Mask) -> npt.NDArray[np.float32]:
    """A float32 copy of one row of logits ([V]) with every forbidden token at -inf.
    Raises when the mask allows no token (a grammar that cannot go on: a bug)."""
    x = np.array(row, dtype=np.float32)
    keep = allowed_ids(mask, len(x))
    if not keep.any():
        raise ValueError("the grammar allows no token here")
    x[~keep] = -np.inf
    return x


def masked_argmax(row: Any, mask: Mask) -> int:
    """The first index of the largest allowed logit of one row."""
    return int(apply(row, mask).argmax())
