"""Penalties (``decoding/penalties.py``): the values against a plain per-token reference,
the same bits however the history splits into committed text and draft path, and
verification of penalised rows: greedy equal to a plain penalised greedy loop, sampling
equal to plain penalised sampling under the same generator and exactly distributed."""

from __future__ import annotations

import collections
import random
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from helpers.stats import chi2_pvalue

from recallspec.decoding.penalties import Penalties
from recallspec.decoding.sampling import SamplingParams, probabilities
from recallspec.decoding.tree import DraftTree
from recallspec.decoding.verify import sample, verify_greedy, verify_sampling

V = 12
PENALTIES = [
    {"presence_penalty": 0.8},
    {"frequency_penalty": 0.6},
    {"presence_penalty": -0.5, "frequency_penalty": 1.5},
    {"repeat_penalty": 1.3, "repeat_last_n": 3},
    {"repeat_penalty": 0.7, "repeat_last_n": -1},
    {"repeat_penalty": 1.5, "repeat_last_n": 64, "presence_penalty": 0.4,
     "frequency_penalty": 0.3},
]


def reference(row: np.ndarray, prompt: Sequence[int], generated: Sequence[int],
              p: SamplingParams) -> np.ndarray:
    """The definition one token at a time: llama.cpp's repeat penalty over the last
    repeat_last_n tokens of prompt + generated, then OpenAI's presence and frequency
    penalties over the generated tokens only, in float32."""
    out = row.astype(np.float32).copy()
    if p.repeat_penalty != 1.0 and p.repeat_last_n != 0:
        text = [*prompt, *generated]
        window = text if p.repeat_last_n < 0 else text[-p.repeat_last_n:]
        r = np.float32(p.repeat_penalty)
        for t in set(window):
            out[t] = out[t] / r if out[t] > 0 else out[t] * r
    for t, c in collections.Counter(generated).items():
        out[t] -= np.float32(c) * np.float32(p.frequency_penalty) + np.float32(
            p.presence_penalty)
    return out


def test_off_by_default_and_when_neutral() -> None:
    assert Penalties.of(SamplingParams(), [1, 2], [3]) is None
    assert Penalties.of(SamplingParams(repeat_penalty=1.5, repeat_last_n=0), [1], [1]) is None
    assert Penalties.of(SamplingParams(presence_penalty=0.1), [1], []) is not None


def test_semantics_on_a_small_row() -> None:
    row = np.array([2.0, -2.0, 1.0, 3.0, -1.0], dtype=np.float32)
    # repeat: positive logits divided, negative multiplied, the prompt counts.
    rep = Penalties.of(SamplingParams(repeat_penalty=2.0), [0, 1], [])
    assert rep is not None
    assert rep.apply(row).tolist() == [1.0, -4.0, 1.0, 3.0, -1.0]
    # presence / frequency: generated tokens only, counted.
    pf = Penalties.of(SamplingParams(presence_penalty=0.5, frequency_penalty=0.25),
                      [0, 1, 2], [3, 3, 4])
    assert pf is not None
    assert pf.apply(row).tolist() == [2.0, -2.0, 1.0, 2.0, -1.75]
    # a draft path counts as generated text, and the repeat window slides over it
    win = Penalties.of(SamplingParams(repeat_penalty=2.0, repeat_last_n=2), [0, 1], [2])
    assert win is not None
    assert win.apply(row, [3]).tolist() == [2.0, -2.0, 0.5, 1.5, -1.0]
    assert row.tolist() == [2.0, -2.0, 1.0, 3.0, -1.0]  # the input row is left as it is


@pytest.mark.parametrize("kw", PENALTIES)
def test_matches_the_reference_however_the_history_splits(kw: dict[str, float]) -> None:
    """Committed text + draft path gives the same bits as the whole text committed: the
    property that keeps speculation exact."""
    rng = random.Random(0)
    p = SamplingParams(**kw)  # type: ignore[arg-type]
    for _ in range(200):
        row = np.asarray(torch.randn(V, generator=torch.Generator().manual_seed(
            rng.randrange(10**6))) * 3, dtype=np.float32)
        prompt = [rng.randrange(V) for _ in range(rng.randrange(1, 8))]
        text = [rng.randrange(V) for _ in range(rng.randrange(0, 10))]
        cut = rng.randrange(len(text) + 1)
        want = reference(row, prompt, text, p)
        pen = Penalties.of(p, prompt, text[:cut])
        assert pen is not None
        np.testing.assert_array_equal(pen.apply(row, text[cut:]), want)
        whole = Penalties.of(p, prompt, text)
        assert whole is not None
        np.testing.assert_array_equal(whole.apply(torch.from_numpy(row)), want)


def _bigram(seed: int) -> torch.Tensor:
    return torch.randn(V, V, generator=torch.Generator().manual_seed(seed)) * 2


def _tree_logits(table: torch.Tensor, root: int, tree: DraftTree) -> torch.Tensor:
    """A bigram model's rows for a tree: each row depends on its node's token."""
    return table[[root, *tree.tokens.tolist()]]


def _random_tree(rng: random.Random, n: int, chain: Sequence[int] = ()) -> DraftTree:
    """``chain`` from the root, then ``n`` nodes at random places (siblings distinct)."""
    tokens: list[int] = []
    parents: list[int] = []
    used: dict[int, set[int]] = collections.defaultdict(set)
    for t in chain:
        used[len(tokens) - 1].add(t)
        parents.append(len(tokens) - 1)
        tokens.append(t)
    for _ in range(n):
        p = rng.randrange(-1, len(tokens))
        t = rng.choice([t for t in range(V) if t not in used[p]])
        used[p].add(t)
        tokens.append(t)
        parents.append(p)
    return DraftTree.from_lists(tokens, parents)


def _chain_under(tree: DraftTree, path: Sequence[int], bonus: int) -> bool:
    """Whether ``bonus`` is no child of the path's last node (the walk went all the way)."""
    last = path[-1] if path else -1
    return all(not (p == last and t == bonus)
               for t, p in zip(tree.tokens.tolist(), tree.parents.tolist(), strict=True))


@pytest.mark.parametrize("kw", PENALTIES)
def test_greedy_verification_is_the_penalised_greedy_loop(kw: dict[str, float]) -> None:
    rng = random.Random(1)
    p = SamplingParams(**kw)  # type: ignore[arg-type]
    table = _bigram(2)
    for _ in range(100):
        prompt = [rng.randrange(V) for _ in range(4)]
        generated = [rng.randrange(V) for _ in range(rng.randrange(1, 6))]
        # A tree holding the penalised greedy chain for a while, plus random nodes (a
        # path at most 4 + 6 deep: the loop's 12 tokens cover any verdict).
        want: list[int] = []
        for _ in range(12):
            text = [*generated, *want]
            pen = Penalties.of(p, prompt, text)
            assert pen is not None
            want.append(int(pen.apply(table[text[-1]]).argmax()))
        depth = rng.randrange(0, 5)
        tree = _random_tree(rng, rng.randrange(0, 7), want[:depth])
        logits = _tree_logits(table, generated[-1], tree)
        v = verify_greedy(tree, logits, Penalties.of(p, prompt, generated))
        assert list(v.tokens) == want[: len(v.tokens)]
        assert len(v.tokens) >= depth + 1
        assert _chain_under(tree, v.accepted_nodes, v.tokens[-1])


@pytest.mark.parametrize("kw", [{}, *PENALTIES[::2]])
def test_sampling_verification_draws_what_plain_sampling_draws(kw: dict[str, float]) -> None:
    """The same generator gives the same tokens with a draft tree as one token at a
    time (the coupling that makes a seed reproducible whatever the drafts)."""
    rng = random.Random(3)
    p = SamplingParams(temperature=0.9, **kw)  # type: ignore[arg-type]
    table = _bigram(4)
    accepted = 0
    for trial in range(200):
        prompt = [rng.randrange(V) for _ in range(3)]
        generated = [rng.randrange(V)]
        tree = _random_tree(rng, rng.randrange(0, 8))
        v = verify_sampling(tree, _tree_logits(table, generated[-1], tree), p,
                            np.random.default_rng(trial), Penalties.of(p, prompt, generated))
        g = np.random.default_rng(trial)
        plain: list[int] = []
        for _ in v.tokens:
            text = [*generated, *plain]
            plain.append(sample(table[text[-1]], p, g, Penalties.of(p, prompt, text)))
        assert list(v.tokens) == plain
        accepted += len(v.accepted_nodes)
    assert accepted > 20  # drafts were accepted, not only bonus tokens drawn


def test_penalised_sampling_follows_the_penalised_distribution() -> None:
    """Tree root -> {a, b}, a -> {c}: the first token follows the penalised root row, the
    token after a follows a's row penalised with a counted (chi-square)."""
    p = SamplingParams(temperature=1.0, presence_penalty=1.0, frequency_penalty=0.5,
                       repeat_penalty=1.4, repeat_last_n=4)
    table = _bigram(5)[:, :6] * 0.5  # a small vocabulary, every token likely enough
    prompt, generated = [0, 1, 2], [1, 3]
    a, b, c = 1, 3, 4
    tree = DraftTree.from_lists([a, b, c], [-1, -1, 0])
    logits = table[[generated[-1], a, b, c]]
    pen = Penalties.of(p, prompt, generated)
    assert pen is not None
    gen = np.random.default_rng(0)
    n = 20000
    first: collections.Counter[int] = collections.Counter()
    after_a: collections.Counter[int] = collections.Counter()
    for _ in range(n):
        verdict = verify_sampling(tree, logits, p, gen, pen)
        first[verdict.tokens[0]] += 1
        if verdict.tokens[0] == a:
            after_a[verdict.tokens[1]] += 1
    p_root = probabilities(torch.from_numpy(pen.apply(logits[0])), p)
    p_a = probabilities(torch.from_numpy(pen.apply(logits[1], [a])), p)
    assert not torch.allclose(p_root, probabilities(logits[0], p), atol=1e-3)  # it moved
    assert chi2_pvalue(first, p_root, n) > 1e-3
    assert chi2_pvalue(after_a, p_a, sum(after_a.values())) > 1e-3
