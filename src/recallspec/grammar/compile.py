"""Guides compiled for a tokenizer: llguidance grammars, cached prototypes.

A ``GuideCache`` (one per engine, shared with the server's worker thread) holds one
``llg.LLTokenizer`` per tokenizer (building one walks the whole vocabulary) and a bounded
LRU of compiled prototype matchers keyed by (guide, tokenizer, logits width). A prototype
is never advanced: each request takes its own copy (``CompiledGuide.matcher``).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import llguidance as llg

from recallspec.decoding.masks import Guide
from recallspec.grammar.matcher import GrammarConstraint, GrammarError, RowLayout, grammar_error

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # a TypedDict of the stubs only

# Compact, fixed separators and no free whitespace: the most bytes forced (drafted for free),
# one text per value. Overrides: a schema's own "x-guidance" cannot loosen them. Read only.
JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GuideTokenizer(Protocol):
    """What compiling needs of ``models/tokenizer.py: Tokenizer`` (duck-typed: grammar sits
    beside models and does not import it)."""

    @property
    def fingerprint(self) -> str: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def eos_token_ids(self) -> frozenset[int]: ...

    def backend_json(self) -> str:
        """The tokenizer.json text (llguidance's vocabulary and pre-tokenization)."""
        ...


def tokenizer_json(tokenizer: GuideTokenizer) -> str:
    """The tokenizer.json text behind ``tokenizer``."""
    return tokenizer.backend_json()


def matcher_eos(tokenizer: GuideTokenizer) -> int:
    """The one EOS the matcher knows: the tokenizer's own if it ends a request, else the
    smallest id that does (every one of them is mapped onto it)."""
    ids = tokenizer.eos_token_ids
    if not ids:
        raise GrammarError("a grammar needs a tokenizer with an end-of-sequence token, and "
                           "this model's has none")
    eos = tokenizer.eos_token_id
    return eos if eos is not None and eos in ids else min(ids)


def grammar_text(guide: Guide) -> str:
    """``guide`` as an llguidance grammar (not yet checked: the matcher does that)."""
    try:
        if guide.kind in ("json_object", "json_schema"):
            return llg.LLMatcher.grammar_from_json_schema(json_schema(guide),
                                                          overrides=JSON_OPTIONS)
        if guide.kind == "regex":
            return llg.LLMatcher.grammar_from_regex(guide.source)
        if guide.kind == "lark":
            return llg.LLMatcher.grammar_from_lark(guide.source)
        if guide.kind == "llguidance":  # Lark with %llguidance, or the JSON grammar format
            return guide.source
        return llg.grammar_from("gbnf", guide.source)
    except ValueError as e:
        raise grammar_error(str(e), guide.kind) from None


def json_schema(guide: Guide) -> dict[str, Any]:
    """The schema a JSON guide compiles: "json_object" without a source is any object, and
    with one, that schema with ``"type": "object"`` where it names no type of its own (and
    refused where it names another)."""
    if guide.kind == "json_object" and not guide.source:
        return {"type": "object"}
    try:
        schema = json.loads(guide.source)
    except ValueError as e:
        raise grammar_error(f"not JSON: {e}", guide.kind) from None
    if schema is True:
        return {}
    if not isinstance(schema, dict):
        raise grammar_error("the schema must be an object (or true)", guide.kind)
    if guide.kind == "json_object" and "type" not in schema:
        schema = {"type": "object", **schema}
    if guide.kind == "json_object" and schema.get("type") != "object":
        raise grammar_error(f"a json_object's schema must be of type object, not "
                            f"{schema.get('type')!r}", guide.kind)
    return schema


@dataclass(frozen=True)
class CompiledGuide:
    """A guide compiled for one tokenizer and logits width; ``prototype`` stands at the
    start of the output and is never advanced."""

    guide: Guide
    prototype: llg.LLMatcher
    layout: RowLayout

    def matcher(self) -> GrammarConstraint:
        """A fresh state for one request (a copy of the prototype)."""
        return GrammarConstraint(self.prototype.deep_copy(), self.layout)


class GuideCache:
    """Compiled guides, thread-safe: lookups and inserts under a lock, compiling outside it
    (two threads may compile one guide at once; the first insert wins)."""

    def __init__(self, capacity: int = 64, limits: llg.LLParserLimits | None = None) -> None:
        if capacity < 1:
            raise ValueError("a guide cache holds at least one guide")
        self.capacity = capacity
        # Terse errors: a verbose one prints the parser's state (and the schema) to the client.
        self._limits = limits if limits is not None else llg.LLParserLimits(verbose_errors=False)
        self._lock = threading.Lock()
        self._tokenizers: dict[tuple[str, int, int], llg.LLTokenizer] = {}
        self._guides: OrderedDict[tuple[Any, ...], CompiledGuide] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._guides)

    def compile(self, guide: Guide, tokenizer: GuideTokenizer,
                vocab_size: int | None = None) -> CompiledGuide:
        """``guide`` compiled for ``tokenizer``; ``vocab_size``: the model's logits width if
        wider than the tokenizer's vocabulary (extra tokens forbidden). Raises GrammarError
        (llguidance's reason) for a guide that does not compile or is over the limits."""
        tok_vocab = tokenizer.vocab_size
        width = tok_vocab if vocab_size is None else vocab_size
        if width < tok_vocab:
            raise GrammarError(f"the model's logits width {width} is under its tokenizer's "
                               f"{tok_vocab} tokens: no grammar can mask them")
        eos = matcher_eos(tokenizer)
        tok_key = (tokenizer.fingerprint, tok_vocab, eos)
        key = (guide, *tok_key, tokenizer.eos_token_ids, width)
        with self._lock:
            hit = self._guides.get(key)
            if hit is not None:
                self._guides.move_to_end(key)
                return hit
            lltok = self._tokenizers.get(tok_key)
        if lltok is None:
            lltok = llg.LLTokenizer(tokenizer_json(tokenizer), n_vocab=tok_vocab, eos_token=eos)
            with self._lock:
                lltok = self._tokenizers.setdefault(tok_key, lltok)
        prototype = llg.LLMatcher(lltok, grammar_text(guide), log_level=0, limits=self._limits)
        if prototype.is_error():
            raise grammar_error(prototype.get_error(), guide.kind)
        layout = RowLayout(width, tok_vocab, eos, frozenset(tokenizer.eos_token_ids))
        compiled = CompiledGuide(guide, prototype, layout)
        with self._lock:
            compiled = self._guides.setdefault(key, compiled)
            self._guides.move_to_end(key)
            while len(self._guides) > self.capacity:
                self._guides.popitem(last=False)
        return compiled


def compile_guide(guide: Guide, tokenizer: GuideTokenizer, *, cache: GuideCache,
                  vocab_size: int | None = None) -> CompiledGuide:
    """``cache.compile(guide, tokenizer, vocab_size)``."""
    return cache.compile(guide, tokenizer, vocab_size)


__all__ = ["CompiledGuide", "GrammarError", "GuideCache", "GuideTokenizer", "compile_guide"]
