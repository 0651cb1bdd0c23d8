"""``recallspec.integrations.hf.generate`` as transformers' ``custom_generate``.

Greedy: token-for-token equal to ``model.generate`` (same model, same processors) on
SmolLM2 with our fp32 weights and on small random-weight models of other architectures
(Qwen2, Qwen3, Gemma-3 with sliding-window layers), batch 1 and 2 (left padding, rows
accepting different lengths), with eos, a custom stopping criterion and history-dependent
logits processors. Sampling: the distribution of the first three tokens equals the
model's exact one (chi-square).
"""

from __future__ import annotations

import collections
import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.availability import IN_CI

transformers = pytest.importorskip("transformers")

from helpers import needs_model  # noqa: E402
from helpers.stats import chi2_pvalue  # noqa: E402

import recallspec.integrations.hf as rs_hf  # noqa: E402
from recallspec.decoding.sampling import SamplingParams, probabilities  # noqa: E402
from recallspec.decoding.tree import DraftTree  # noqa: E402
from recallspec.drafters import Drafter, create_drafter  # noqa: E402

DRAFTERS = ("pld", "sam", "sam+recycling")
# New tokens per real prompt: each drafter's drafts are accepted and rejected several
# times within them (the tests assert acceptances), at a third less of transformers'
# slow fp32 decoding than 48 (~110 s of CI for these tests).
REAL_NEW_TOKENS = 32


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread() -> Any:
    """transformers models on one torch thread: with the OpenMP team on a shared 2-core
    machine, idle workers spin between the many tiny decode ops and a SmolLM2 step
    takes ~10x longer (``kernels/threads.py`` measured the same for our engine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class Counting(Drafter):
    """Drafter wrapper counting accepted draft tokens (committed - 1 per drafted step)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.needs_logits = inner, inner.name, inner.needs_logits
        self.accepted = 0

    def start(self, rid: int, prompt: Sequence[int]) -> None:
        self.inner.start(rid, prompt)

    def propose(self, rid: int, max_nodes: int) -> DraftTree:
        return self.inner.propose(rid, max_nodes)

    def observe(self, rid: int, accepted: Sequence[int], tree: DraftTree, logits: Any) -> None:
        if len(tree):
            self.accepted += len(accepted) - 1
        self.inner.observe(rid, accepted, tree, logits)

    def stop(self, rid: int) -> None:
        self.inner.stop(rid)


def left_pad(rows: Sequence[Sequence[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    t = max(len(r) for r in rows)
    ids = torch.full((len(rows), t), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), t), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, t - len(r):] = torch.tensor(r)
        mask[i, t - len(r):] = 1
    return ids, mask


def ours(model: Any, ids: torch.Tensor, mask: torch.Tensor, drafter: Any, **kw: Any) -> Any:
    return model.generate(input_ids=ids, attention_mask=mask, custom_generate=rs_hf.generate,
                          drafter=drafter, **kw)


def plain(model: Any, ids: torch.Tensor, mask: torch.Tensor, **kw: Any) -> Any:
    return model.generate(input_ids=ids, attention_mask=mask, **kw)


# -- SmolLM2 with our weights ------------------------------------------------------
@pytest.fixture(scope="module")
def smol() -> tuple[Any, Any]:
    from recallspec.bench.common.hf import hf_model_from_model
    from recallspec.models import load_model

    model, tok = load_model(None, dtype=torch.float32)
    return hf_model_from_model(model), tok


def real_prompts(tok: Any) -> list[list[int]]:
    """Chat-formatted Spec-Bench prompts of three kinds (code, extraction from a given
    text, translation); a built-in prompt when the benchmark data is absent."""
    from recallspec.data.paths import DataNotFoundError, data_dir

    try:
        path = data_dir() / "spec_bench" / "question.jsonl"
        with open(path, encoding="utf-8") as f:
            qs = [json.loads(line) for line in f if line.strip()]
        first = {}
        for q in qs:
            first.setdefault(q["category"], q["turns"][0])
        texts = [first["coding"], first["extraction"], first["translation"]]
    except (DataNotFoundError, OSError, KeyError):
        if IN_CI:  # CI has the data: a fallback there would hide a broken set-up
            raise
        texts = ["Rewrite as a bulleted list: apples, pears, plums, cherries, apples, pears.",
                 "Repeat this sentence twice: the quick brown fox jumps over the lazy dog.",
                 "Translate German to English: Der Hund schläft im Garten."]
    return [tok.encode_prompt(tok.apply_chat_template([{"role": "user", "content": t}],
                                                      add_generation_prompt=True))
            for t in texts]


_REF: dict[tuple[int, ...], torch.Tensor] = {}  # generate's output per prompt


@needs_model
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_smollm2_greedy_batch1(smol: tuple[Any, Any], drafter: str) -> None:
    """Each drafter on three prompts: code, extraction from a given text, translation."""
    hf, tok = smol
    counting = Counting(create_drafter(drafter))
    for p in real_prompts(tok):
        ids, mask = left_pad([p])
        if tuple(p) not in _REF:
            _REF[tuple(p)] = plain(hf, ids, mask, max_new_tokens=REAL_NEW_TOKENS, do_sample=False)
        got = ours(hf, ids, mask, counting, max_new_tokens=REAL_NEW_TOKENS, do_sample=False)
        assert torch.equal(got, _REF[tuple(p)]), drafter
    assert counting.accepted > 0, drafter


@needs_model
def test_smollm2_greedy_batch2(smol: tuple[Any, Any]) -> None:
    """Two prompts of different lengths (left padding), rows accepting differently."""
    hf, tok = smol
    ps = real_prompts(tok)
    ids, mask = left_pad([ps[1], ps[2]], pad=int(hf.generation_config.pad_token_id))
    ref = plain(hf, ids, mask, max_new_tokens=REAL_NEW_TOKENS, do_sample=False)
    for drafter in DRAFTERS:
        got = ours(hf, ids, mask, drafter, max_new_tokens=REAL_NEW_TOKENS, do_sample=False)
        assert torch.equal(got, ref), drafter


@needs_model
def test_fingerprint_matches_ours(smol: tuple[Any, Any], tmp_path: Path) -> None:
    """A transformers fast tokenizer of the same vocabulary (saved and reloaded through
    transformers) has our tokenizer's fingerprint."""
    from transformers import PreTrainedTokenizerFast

    _, tok = smol
    tok._tok.save(str(tmp_path / "tokenizer.json"))
    hf_tok = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    assert rs_hf.tokenizer_fingerprint(hf_tok) == tok.fingerprint


# -- random-weight models of other architectures -----------------------------------
def random_model(kind: str, vocab: int = 49152, **over: Any) -> Any:
    """A 2-layer model with random weights; initializer_range 0.2 spreads the logits so
    that fp rounding cannot flip a greedy choice."""
    torch.manual_seed(0)
    kw: dict[str, Any] = dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, initializer_range=0.2,
        tie_word_embeddings=True, max_position_embeddings=4096)
    kw.update(over)
    cfg = transformers.AutoConfig.for_model(kind, **kw)
    m = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.float32, attn_implementation="sdpa").eval()
    m.generation_config = transformers.GenerationConfig(pad_token_id=0)
    return m


ARCHS = {
    "qwen2": {},
    "qwen3": {},
    # Alternating sliding (window 6) and full layers: the dict-of-masks path.
    "gemma3_text": {"sliding_window": 6, "layer_types": ["sliding_attention", "full_attention"]},
}


def prompt_rows() -> list[list[int]]:
    """Real text in SmolLM2's vocabulary (the tokenizer file only; no weights needed)."""
    from recallspec.models import load_tokenizer

    tok = load_tokenizer(None)
    texts = ["def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(",
             "Rewrite as a list: apples, pears, plums, apples, pears, plums, apples, pears."]
    return [tok.encode(t) for t in texts]


@needs_model
@pytest.mark.parametrize("kind", sorted(ARCHS))
def test_random_arch_greedy(kind: str) -> None:
    m = random_model(kind, **ARCHS[kind])
    rows = prompt_rows()
    counting = Counting(create_drafter("sam+recycling"))
    for batch in ([rows[0]], rows):
        ids, mask = left_pad(batch)
        ref = plain(m, ids, mask, max_new_tokens=40, do_sample=False)
        for drafter in (*DRAFTERS[:2], counting):
            got = ours(m, ids, mask, drafter, max_new_tokens=40, do_sample=False)
            assert torch.equal(got, ref), (kind, len(batch), drafter)
    assert counting.accepted > 0


@needs_model
def test_padding_does_not_change_a_row() -> None:
    """Each row decodes as if alone: the padded row equals its own batch-1 run (for the
    sliding-window model too, whose window we count in positions, not cache columns)."""
    m = random_model("gemma3_text", **ARCHS["gemma3_text"])
    rows = prompt_rows()
    ids, mask = left_pad(rows)
    both = ours(m, ids, mask, "sam", max_new_tokens=24, do_sample=False)
    short = min(range(2), key=lambda i: len(rows[i]))
    ids1, mask1 = left_pad([rows[short]])
    alone = ours(m, ids1, mask1, "sam", max_new_tokens=24, do_sample=False)
    assert both[short, -24:].tolist() == alone[0, -24:].tolist()


@needs_model
def test_eos_stopping_and_processors() -> None:
    """eos inside an accepted draft, a custom stopping criterion, and processors that
    read the history (repetition penalty, no-repeat n-grams, min_new_tokens) - all as
    ``generate`` applies them."""
    m = random_model("qwen2")
    rows = prompt_rows()
    ids, mask = left_pad(rows)
    free = plain(m, ids, mask, max_new_tokens=30, do_sample=False)
    eos = int(free[0, ids.shape[1] + 7])  # row 0 stops at its 8th token (or earlier)
    kw: dict[str, Any] = dict(max_new_tokens=30, do_sample=False, eos_token_id=eos)
    ref = plain(m, ids, mask, **kw)
    assert (ref[0] == 0).any()  # row 0 ended early and was padded
    for d in DRAFTERS:
        assert torch.equal(ours(m, ids, mask, d, **kw), ref), d

    class StopAfter(transformers.StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: Any, **_: Any) -> torch.Tensor:
            return (input_ids[:, -3:] == eos).any(-1)  # two tokens after the eos-token

    crit = transformers.StoppingCriteriaList([StopAfter()])
    kw2: dict[str, Any] = dict(max_new_tokens=30, do_sample=False, stopping_criteria=crit)
    assert torch.equal(ours(m, ids, mask, "sam+recycling", **kw2), plain(m, ids, mask, **kw2))
    kw3: dict[str, Any] = dict(max_new_tokens=30, do_sample=False, repetition_penalty=1.5,
                               no_repeat_ngram_size=3, min_new_tokens=5, eos_token_id=eos)
    ref3 = plain(m, ids, mask, **kw3)
    for d in ("pld", "sam+recycling"):
        assert torch.equal(ours(m, ids, mask, d, **kw3), ref3), d


def test_compaction_and_long_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """A heavily padded batch (prompts of 100 and 2 tokens) starts with more than half
    of the cache as holes, so the cache is compacted; 300 new tokens outgrow the first
    output buffer. Still equal to ``generate``."""
    from recallspec.integrations import _hf_tree

    calls = []
    real = _hf_tree.compact
    monkeypatch.setattr(_hf_tree, "compact", lambda *a: calls.append(1) or real(*a))
    m = random_model("qwen2", vocab=32, hidden_size=32)
    rows = [[1, 2, 3, 4, 5] * 20, [7, 8]]
    ids, mask = left_pad(rows)
    kw: dict[str, Any] = dict(max_new_tokens=300, do_sample=False)
    ref = plain(m, ids, mask, **kw)
    counting = Counting(create_drafter("sam"))
    assert torch.equal(ours(m, ids, mask, counting, **kw), ref)
    assert counting.accepted > 100  # a tiny random model loops: long accepted drafts
    assert calls


# -- sampling ------------------------------------------------------------------------
class FixedTree(Drafter):
    """Proposes one fixed tree at a request's first step, nothing afterwards."""

    name, needs_logits = "fixed", False

    def __init__(self, tree: DraftTree) -> None:
        self.tree, self.fresh, self.accepted = tree, set[int](), 0

    def start(self, rid: int, prompt: Sequence[int]) -> None:
        self.fresh.add(rid)

    def propose(self, rid: int, max_nodes: int) -> DraftTree:
        if rid in self.fresh:
            self.fresh.discard(rid)
            return self.tree.truncate(max_nodes)
        return DraftTree.empty()

    def observe(self, rid: int, accepted: Sequence[int], tree: DraftTree, logits: Any) -> None:
        if len(tree):
            self.accepted += len(accepted) - 1

    def stop(self, rid: int) -> None:
        self.fresh.discard(rid)


def exact_three(m: Any, prompt: list[int], params: SamplingParams) -> dict[tuple[int, ...], float]:
    """Exact probability of every 3-token continuation (support of top-k only), from
    plain full forwards."""
    def dist(prefixes: list[tuple[int, ...]]) -> torch.Tensor:
        x = torch.tensor([prompt + list(p) for p in prefixes])
        with torch.no_grad():
            return probabilities(m(input_ids=x).logits[:, -1].float(), params)

    out: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(3):
        keys = list(out)
        probs = dist(keys)
        out = {(*k, t): out[k] * float(probs[i, t]) for i, k in enumerate(keys)
               for t in torch.nonzero(probs[i]).flatten().tolist()}
    return out


@pytest.mark.parametrize("drafter", ["tree", "pld"])
def test_sampling_distribution(drafter: str) -> None:
    """4000 samples of the first three tokens (temperature 0.9, top-k 4: at most 64
    outcomes) against their exact probabilities. Outcomes expected fewer than 5 times
    share one bin (the chi-square approximation needs >= 5 per bin). p > 1e-3 as in the
    project's other distribution tests; the seed is fixed, so the test is deterministic,
    and test_verify shows the statistic rejects a biased sampler at p < 1e-6. The
    ``tree`` drafter proposes the model's two likeliest first tokens, each with its
    likeliest successor, so drafts are accepted and rejected on every path."""
    m = random_model("qwen2", vocab=32, hidden_size=32, initializer_range=0.5)
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    params = SamplingParams(temperature=0.9, top_k=4)
    exact = exact_three(m, prompt, params)
    with torch.no_grad():
        first = torch.topk(m(input_ids=torch.tensor([prompt])).logits[0, -1], 2).indices.tolist()
        nxt = [int(m(input_ids=torch.tensor([[*prompt, a]])).logits[0, -1].argmax())
               for a in first]
    tree = DraftTree.from_lists([first[0], first[1], nxt[0], nxt[1]], [-1, -1, 0, 1])
    d: Any = FixedTree(tree) if drafter == "tree" else Counting(create_drafter("pld"))
    torch.manual_seed(1234)
    counts: collections.Counter[tuple[int, ...]] = collections.Counter()
    n, b = 4000, 1000
    ids = torch.tensor([prompt] * b)
    for _ in range(n // b):
        out = m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                         temperature=0.9, top_k=4, max_new_tokens=3,
                         custom_generate=rs_hf.generate, drafter=d)
        counts.update(tuple(r) for r in out[:, len(prompt):].tolist())
    assert sum(counts.values()) == n and set(counts) <= set(exact)
    if drafter == "tree":
        assert d.accepted > n // 4  # drafts really were accepted (and rejected)
    big = sorted(k for k, p in exact.items() if p * n >= 5)
    rest = [k for k in exact if k not in set(big)]
    probs = torch.tensor([exact[k] for k in big] + [sum(exact[k] for k in rest)])
    binned = {i: counts[k] for i, k in enumerate(big)}
    binned[len(big)] = sum(counts[k] for k in rest)
    assert chi2_pvalue(binned, probs / probs.sum(), n) > 1e-3


def test_refuses_what_it_cannot_do() -> None:
    m = random_model("qwen2", vocab=32, hidden_size=32)
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="left padding"):
        ours(m, ids, torch.tensor([[1, 1, 0]]), "pld", max_new_tokens=2)
    with pytest.raises(ValueError, match="Engine"):
        ours(m, ids, torch.ones_like(ids), "draft-model", max_new_tokens=2)
    with pytest.raises(NotImplementedError, match="output_scores"):
        ours(m, ids, torch.ones_like(ids), "pld", max_new_tokens=2, output_scores=True,
             return_dict_in_generate=True)


def test_tree_helpers() -> None:
    from recallspec.integrations._hf_tree import ancestors, depths

    t = DraftTree.from_lists([5, 6, 7, 8], [-1, -1, 0, 2])
    assert depths(t).tolist() == [0, 1, 1, 2, 3]
    a = ancestors(t)
    assert a[4].tolist() == [True, True, False, True, True]  # node 3: root, 0, 2, itself
    assert a[2].tolist() == [True, False, True, False, False]
    assert list(itertools.chain.from_iterable(a.tolist())).count(True) == 1 + 2 + 2 + 3 + 4
