"""The grammar package (``grammar/``) on the real SmolLM2 tokenizer: guides compile (or fail
with llguidance's reason), the cache shares prototypes, and ``constrain`` keeps, cuts,
forces and masks exactly what a stepwise matcher along each node's path says."""

from __future__ import annotations

import dataclasses
import json
import threading
from typing import Any

import llguidance as llg
import numpy as np
import pytest

from recallspec.decoding import masks as M
from recallspec.decoding.masks import Constrained
from recallspec.decoding.tree import DraftTree
from recallspec.errors import DataError
from recallspec.grammar import (
    CompiledGuide,
    GrammarConstraint,
    GrammarError,
    GuideCache,
    compile_guide,
)
from recallspec.models.loader import load_tokenizer

# The grammar generates properties in the order the schema lists them.
SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["age", "kind", "name", "tags"],
          "properties": {"age": {"type": "integer"}, "kind": {"enum": ["cat", "dog"]},
                         "name": {"type": "string"},
                         "tags": {"type": "array", "items": {"type": "string"}}}}
OUTPUT = '{"age": 42, "kind": "dog", "name": "Bob Smith", "tags": ["a", "bc"]}'


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="module")
def cache() -> GuideCache:
    return GuideCache()


@pytest.fixture(scope="module")
def schema_guide(cache: GuideCache, tok: Any) -> CompiledGuide:
    return cache.compile(M.Guide.json_schema(SCHEMA), tok)


def encode(tok: Any, text: str) -> list[int]:
    return list(tok._tok.encode(text, add_special_tokens=False).ids)


def ids(mask: np.ndarray, vocab: int) -> set[int]:
    return set(np.flatnonzero(M.allowed_ids(mask, vocab)).tolist())


def at(compiled: CompiledGuide, path: list[int]) -> GrammarConstraint:
    """A fresh matcher advanced along ``path``."""
    g = compiled.matcher()
    g.advance(path)
    return g


def walk_accepts(compiled: CompiledGuide, tokens: list[int]) -> GrammarConstraint:
    g = compiled.matcher()
    for t in tokens:
        row = g.root_mask()
        assert M.allowed(row, t), t
        assert M.allowed(row, compiled.layout.eos_token) == g.is_accepting()
        g.advance([t])
    assert g.is_accepting()
    return g


@pytest.mark.parametrize(("guide", "text"), [
    (M.Guide.json_object(), '{"a": [1, true]}'),
    (M.Guide.json_object({"properties": {"n": {"type": "integer"}}, "required": ["n"]}),
     '{"n": 7}'),
    (M.Guide.json_schema(SCHEMA), OUTPUT),
    (M.Guide.json_schema(True), '"anything"'),
    (M.Guide("regex", "[0-9]{3}-[a-z]+"), "123-abc"),
    (M.Guide("gbnf", 'root ::= "yes" | "no"'), "no"),
    (M.Guide("lark", 'start: "hi " NAME\nNAME: /[a-z]+/'), "hi bob"),
    (M.Guide("llguidance", llg.StructTag.to_grammar([llg.StructTag(  # a special token's
        trigger="<file_sep>", begin="<file_sep>", grammar={"type": "integer"}, end=";")])),
     "say <file_sep>12;"),
    (M.Guide("llguidance", json.dumps({"grammars": [{"json_schema": {"type": "boolean"}}]})),
     "true"),
])
def test_every_kind_compiles_and_masks(cache: GuideCache, tok: Any, guide: M.Guide,
                                       text: str) -> None:
    compiled = cache.compile(guide, tok)
    root = compiled.matcher().root_mask()
    assert root.shape == (M.words(tok.vocab_size),) and root.dtype == np.int32
    assert 0 < M.count_allowed(root, tok.vocab_size) < tok.vocab_size
    g = walk_accepts(compiled, encode(tok, text))
    assert ids(g.root_mask(), tok.vocab_size) >= set(tok.eos_token_ids)


@pytest.mark.parametrize(("guide", "reason"), [
    (M.Guide("json_schema", '{"type":"objectx"}'), "objectx"),
    (M.Guide("json_schema", "false"), "must be an object"),
    (M.Guide("json_schema", '{"$ref":"#/nope"}'), "/nope"),
    (M.Guide("regex", "a(b"), "unclosed group"),
    (M.Guide("gbnf", "root ::= foo"), "foo"),
    (M.Guide("lark", "start: foo"), "unknown name"),
    (M.Guide("llguidance", '{"grammars": 5}'), "expected a sequence"),
])
def test_a_bad_guide_names_its_reason(cache: GuideCache, tok: Any, guide: M.Guide,
                                      reason: str) -> None:
    with pytest.raises(GrammarError, match=f"(?s)invalid {guide.kind} guide: .*{reason}") as e:
        cache.compile(guide, tok)
    assert isinstance(e.value, DataError)


def test_a_grammar_over_the_limits_is_too_complex(tok: Any) -> None:
    small = GuideCache(limits=llg.LLParserLimits(max_grammar_size=10, verbose_errors=False))
    with pytest.raises(GrammarError, match=r"grammar too complex: .*limit"):
        small.compile(M.Guide.json_schema(SCHEMA), tok)


def test_the_cache_shares_prototypes_and_gives_fresh_matchers(tok: Any) -> None:
    cache = GuideCache(capacity=2)
    a = cache.compile(M.Guide.json_schema({"type": "object", "required": ["x"]}), tok)
    b = compile_guide(M.Guide.json_schema({"type": "object", "required": ["x"]}), tok,
                      cache=cache)
    assert a is b and len(cache) == 1
    m1, m2 = a.matcher(), a.matcher()
    before = m2.root_mask()
    m1.advance(encode(tok, '{"'))
    assert np.array_equal(m2.root_mask(), before)
    assert np.array_equal(a.matcher().root_mask(), before)  # the prototype never moves
    cache.compile(M.Guide("regex", "a"), tok)
    cache.compile(M.Guide("regex", "b"), tok)  # evicts the least recently used: a
    assert len(cache) == 2 and cache.compile(M.Guide("regex", "b"), tok) is not a
    assert cache.compile(M.Guide.json_object({"required": ["x"]}), tok) is not a
    wide = cache.compile(M.Guide("regex", "b"), tok, vocab_size=tok.vocab_size + 40)
    assert wide.layout.vocab_size == tok.vocab_size + 40


def test_threads_compiling_one_guide_get_one_prototype(tok: Any) -> None:
    cache = GuideCache()
    got: list[CompiledGuide] = []
    guide = M.Guide("regex", "[a-z]{2,5}")
    threads = [threading.Thread(target=lambda: got.append(cache.compile(guide, tok)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and all(g is got[0] for g in got)


def test_a_grammar_constraint_is_the_step_cores_constraint(schema_guide: CompiledGuide) -> None:
    from recallspec.step.sequence import Constraint

    g: Constraint = schema_guide.matcher()  # mypy checks the protocol here
    assert isinstance(g.constrain(DraftTree.empty(), 4, 4), Constrained)


def test_a_schema_output_walks_to_accepting_and_eos(schema_guide: CompiledGuide,
                                                    tok: Any) -> None:
    tokens = encode(tok, OUTPUT)
    g = walk_accepts(schema_guide, tokens)
    assert ids(g.root_mask(), tok.vocab_size) == set(tok.eos_token_ids)
    with pytest.raises(RuntimeError, match="forbids"):
        g.advance(encode(tok, " x"))
    assert g.is_accepting()
    g.advance([min(tok.eos_token_ids)])
    assert g.is_stopped()
    assert g.mask_rows == len(tokens) + 1 and g.mask_seconds > 0
    fresh = schema_guide.matcher()
    root = fresh.root_mask()
    with pytest.raises(RuntimeError, match="forbids"):
        fresh.advance([tokens[0], tok.vocab_size + 5])
    assert np.array_equal(fresh.root_mask(), root)  # a refused commit moves nothing


def reference(compiled: CompiledGuide, prefix: list[int], tree: DraftTree, room: int,
              depth_limit: int) -> tuple[list[int], list[int], list[np.ndarray], int, int]:
    """``constrain`` by brute force: each node's path checked token by token on a fresh
    matcher, each row that matcher's mask, each chain llguidance's forced tokens there."""
    toks, par = tree.tokens.tolist(), tree.parents.tolist()
    eos = compiled.layout.eos_ids
    V = compiled.layout.vocab_size
    path: list[list[int]] = []
    depth: list[int] = []
    for i, p in enumerate(par):
        path.append(([] if p < 0 else path[p]) + [toks[i]])
        depth.append(1 if p < 0 else depth[p] + 1)
    root = at(compiled, prefix).root_mask()
    rows: dict[int, np.ndarray] = {}
    cut = 0
    if room > 0 and depth_limit > 0:
        for i, p in enumerate(par):
            if depth[i] > depth_limit:
                continue
            if p >= 0 and (p not in rows or toks[p] in eos):
                cut += 1  # below a cut node or an EOS
                continue
            if toks[i] < V and M.allowed(root if p < 0 else rows[p], toks[i]):
                rows[i] = at(compiled, prefix + path[i]).root_mask()
            else:
                cut += 1
    kept = sorted(rows)[:max(room, 0)]
    new = {old: j for j, old in enumerate(kept)}
    out_t = [toks[i] for i in kept]
    out_p = [-1 if par[i] < 0 else new[par[i]] for i in kept]
    out_r = [root] + [rows[i] for i in kept]
    leaves = [(i, new[i]) for i in kept
              if toks[i] not in eos and not any(par[j] == i for j in kept)]
    if not kept and room > 0 and depth_limit > 0:
        leaves = [(-1, -1)]
    for old, parent in leaves:
        lead = prefix + ([] if old < 0 else path[old])
        m = compiled.prototype.deep_copy()
        assert m.consume_tokens(lead)
        row = out_r[parent + 1]
        limit = depth_limit - (0 if old < 0 else depth[old])
        for f in m.compute_ff_tokens()[:limit]:
            if len(out_t) >= room or not M.allowed(row, f):
                break
            out_p.append(parent)
            out_t.append(f)
            parent = len(out_t) - 1
            row = at(compiled, lead + out_forced(out_t, out_p, parent, len(kept))).root_mask()
            out_r.append(row)
    return out_t, out_p, out_r, len(kept), cut


def out_forced(toks: list[int], par: list[int], node: int, drafted: int) -> list[int]:
    """The forced tokens on the path to ``node`` (a chain below a drafter node)."""
    chain = []
    while node >= drafted:
        chain.append(toks[node])
        node = par[node]
    return chain[::-1]


def random_tree(rng: np.random.Generator, compiled: CompiledGuide, prefix: list[int],
                future: list[int], n: int) -> DraftTree:
    """The real continuation as a chain, plus siblings and children: allowed tokens (a
    stepwise matcher's choice), random ones and EOS, in a shuffled topological order."""
    V = compiled.layout.vocab_size
    toks: list[int] = []
    par: list[int] = []
    for j, t in enumerate(future[:rng.integers(0, min(n, len(future)) + 1)]):
        toks.append(t)
        par.append(j - 1)
    while len(toks) < n:
        p = int(rng.integers(-1, len(toks)))
        lead = [] if p < 0 else [toks[i] for i in chain_to(par, p)]
        siblings = {toks[i] for i in range(len(toks)) if par[i] == p}
        t = int(rng.integers(0, V)) if rng.random() < 0.9 else min(compiled.layout.eos_ids)
        if rng.random() < 0.6:
            try:
                options = sorted(ids(at(compiled, prefix + lead).root_mask(), V) - siblings)
            except RuntimeError:  # a forbidden path: anything below it is cut
                options = []
            t = int(rng.choice(options)) if options else t
        if t not in siblings:
            toks.append(t)
            par.append(p)
    return shuffle_topological(rng, toks, par)


def chain_to(par: list[int], node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(node)
        node = par[node]
    return out[::-1]


def shuffle_topological(rng: np.random.Generator, toks: list[int], par: list[int]) -> DraftTree:
    """The same tree in a random topological order (not depth-first)."""
    order: list[int] = []
    ready = [i for i in range(len(toks)) if par[i] < 0]
    while ready:
        i = ready.pop(int(rng.integers(0, len(ready))))
        order.append(i)
        ready += [j for j in range(len(toks)) if par[j] == i]
    new = {old: k for k, old in enumerate(order)}
    return DraftTree.from_lists([toks[i] for i in order],
                                [-1 if par[i] < 0 else new[par[i]] for i in order])


def check(compiled: CompiledGuide, prefix: list[int], tree: DraftTree, room: int,
          depth_limit: int) -> Constrained:
    g = at(compiled, prefix)
    before = g.root_mask()
    got = g.constrain(tree, room, depth_limit)
    assert np.array_equal(g.root_mask(), before)  # the state is where it was
    t, p, r, drafted, cut = reference(compiled, prefix, tree, room, depth_limit)
    assert got.tree.tokens.tolist() == t
    assert got.tree.parents.tolist() == p
    assert (got.drafted, got.cut) == (drafted, cut)
    assert got.masks.shape == (1 + len(t), M.words(compiled.layout.vocab_size))
    assert np.array_equal(got.masks, np.stack(r))
    assert len(got.tree) <= max(room, 0) and got.tree.depth() <= max(depth_limit, 0)
    return got


def test_constrain_equals_a_stepwise_walk_on_random_trees(schema_guide: CompiledGuide,
                                                          tok: Any) -> None:
    rng = np.random.default_rng(0)
    tokens = encode(tok, OUTPUT)
    forced = 0
    for _ in range(40):
        k = int(rng.integers(0, len(tokens)))
        tree = random_tree(rng, schema_guide, tokens[:k], tokens[k:], int(rng.integers(2, 20)))
        room = int(rng.choice([3, 8, 64, 64]))
        depth_limit = int(rng.choice([2, 5, 64, 64]))
        got = check(schema_guide, tokens[:k], tree, room, depth_limit)
        forced += len(got.tree) - got.drafted
    assert forced > 0  # some chains were forced


def test_forced_tokens_go_below_the_root_and_the_leaves(schema_guide: CompiledGuide,
                                                        tok: Any) -> None:
    def forced_after(path: list[int]) -> list[int]:
        m = schema_guide.prototype.deep_copy()
        assert m.consume_tokens(path)
        return list(m.compute_ff_tokens())

    ff = forced_after([])
    assert len(ff) >= 2  # '{"name":' is forced
    got = check(schema_guide, [], DraftTree.empty(), 64, 64)
    assert got.tree.tokens.tolist() == ff and got.tree.is_chain and got.drafted == 0
    assert check(schema_guide, [], DraftTree.empty(), 1, 64).tree.tokens.tolist() == ff[:1]
    assert check(schema_guide, [], DraftTree.empty(), 64, 1).tree.tokens.tolist() == ff[:1]
    # a drafter leaf before a forced key (' "age":'): its chain follows the drafter's node
    tokens = encode(tok, OUTPUT)
    k = next(i for i in range(4, len(tokens)) if forced_after(tokens[:i + 1]))
    got = check(schema_guide, tokens[:k], DraftTree.chain(tokens[k:k + 1]), 64, 64)
    assert got.drafted == 1 and got.tree.parents.tolist() == list(range(-1, len(got.tree) - 1))
    assert got.tree.tokens.tolist()[1:] == forced_after(tokens[:k + 1])


def test_room_and_depth_limits(schema_guide: CompiledGuide, tok: Any) -> None:
    tokens = encode(tok, OUTPUT)
    tree = DraftTree.chain(tokens[:6])
    for room, depth_limit in ((0, 5), (5, 0), (-1, -1)):
        got = schema_guide.matcher().constrain(tree, room, depth_limit)
        assert len(got.tree) == 0 and got.masks.shape == (1, M.words(tok.vocab_size))
        assert (got.drafted, got.cut) == (0, 0)
    got = check(schema_guide, [], tree, 3, 64)
    assert got.tree.tokens.tolist() == tokens[:3] and got.cut == 0
    got = check(schema_guide, [], tree, 64, 2)
    assert got.tree.tokens.tolist() == tokens[:2] and got.cut == 0


def test_eos_ends_a_path_and_cuts_what_hangs_below(schema_guide: CompiledGuide,
                                                   tok: Any) -> None:
    tokens = encode(tok, OUTPUT)
    eos = min(tok.eos_token_ids)
    tree = DraftTree.from_lists([tokens[-1], eos, 11, 12], [-1, 0, 1, 1])
    got = check(schema_guide, tokens[:-1], tree, 64, 64)
    assert got.tree.tokens.tolist() == [tokens[-1], eos] and got.cut == 2
    assert ids(got.masks[2], tok.vocab_size) == set(tok.eos_token_ids)


def test_a_wider_model_vocabulary_forbids_the_extra_tokens(cache: GuideCache,
                                                           tok: Any) -> None:
    V = tok.vocab_size + 40  # not a multiple of 32: a partial last word
    compiled = cache.compile(M.Guide("regex", "[a-z]+"), tok, vocab_size=V)
    extra = tok.vocab_size + 3
    got = check(compiled, [], DraftTree.from_lists([extra, encode(tok, "ab")[0]], [-1, -1]),
                64, 64)
    assert got.masks.shape[1] == M.words(V) and got.cut == 1
    for row in got.masks:  # padding bits too: every bit from the tokenizer's vocabulary on
        assert not M.allowed_ids(row, M.words(V) * 32)[tok.vocab_size:].any()
    with pytest.raises(GrammarError, match="under its tokenizer"):
        cache.compile(M.Guide("regex", "a"), tok, vocab_size=tok.vocab_size - 1)


@dataclasses.dataclass(frozen=True)
class TinyTokenizer:
    """A byte-level BPE of 260 tokens (not a multiple of 32: a partial last mask word) and
    two EOS ids, through ``GuideTokenizer`` and the ``backend_json`` accessor."""

    fingerprint: str
    vocab_size: int
    eos_token_id: int | None
    eos_token_ids: frozenset[int]
    text: str

    def backend_json(self) -> str:
        return self.text


def tiny_tokenizer() -> TinyTokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab |= {"ab": len(vocab), "abc": len(vocab) + 1}
    t = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b"), ("ab", "c")]))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.add_special_tokens(["<eos>", "<eot>"])
    return TinyTokenizer("tiny", t.get_vocab_size(), t.token_to_id("<eos>"),
                         frozenset({t.token_to_id("<eos>"), t.token_to_id("<eot>")}), t.to_str())


def test_a_partial_last_word_and_two_eos_ids() -> None:
    tiny = tiny_tokenizer()
    assert tiny.vocab_size % 32 and len(tiny.eos_token_ids) == 2
    V = tiny.vocab_size + 30
    compiled = GuideCache().compile(M.Guide("regex", "(abc)+"), tiny, vocab_size=V)
    abc = 257  # the merge "abc"
    tree = DraftTree.from_lists([abc, abc, 258, 259, 5], [-1, 0, 1, 1, 3])
    got = check(compiled, [abc], tree, 64, 64)
    assert got.tree.tokens.tolist() == [abc, abc, 258, 259] and got.cut == 1
    for row in got.masks:
        assert not M.allowed_ids(row, M.words(V) * 32)[tiny.vocab_size:].any()
    assert ids(got.masks[1], V) >= {abc} | tiny.eos_token_ids  # after "abcabc": on, or end
    assert ids(got.masks[3], V) == ids(got.masks[4], V) == tiny.eos_token_ids
    g = at(compiled, [abc])
    g.advance([259])
    assert g.is_stopped()


def test_gemma_every_eos_id_mirrors_the_matcher_eos(cache: GuideCache) -> None:
    gemma = load_tokenizer("gemma3-270m")
    assert len(gemma.eos_token_ids) >= 2  # <eos> and <end_of_turn>
    compiled = cache.compile(M.Guide.json_object(), gemma)
    text = json.dumps({"a": 1}, separators=(", ", ": "))
    g = walk_accepts(compiled, encode(gemma, text))
    assert ids(g.root_mask(), gemma.vocab_size) == set(gemma.eos_token_ids)
    start = compiled.matcher().root_mask()
    assert not ids(start, gemma.vocab_size) & set(gemma.eos_token_ids)
    g.advance([max(gemma.eos_token_ids)])
    assert g.is_stopped()
