"""rest and crest on the real model (fp32 greedy): token-identical to AR on Spec-Bench
prompts, with datastores whose corpus makes the drafts matter (AR answers of some of the
prompts, so long drafts are accepted, plus unrelated prompts' text)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers import needs_model

from recallspec.decoding.sampling import SamplingParams
from recallspec.engine import GenerationResult
from recallspec.recall.datastore.crest import CrestConfig, build_crest
from recallspec.recall.datastore.rest import build_rest

NEW_TOKENS = 24


@needs_model
def test_rest_crest_token_identical_on_spec_bench(
    engine: Any, spec_bench_prompts: list[str], tmp_path: Path
) -> None:
    params = SamplingParams(max_new_tokens=NEW_TOKENS)
    prompts = [engine.encode_prompt(p, chat=True) for p in spec_bench_prompts[:6]]
    ar = [engine.generate(p, params, drafter="none") for p in prompts]
    tok = engine.tokenizer
    # Answers of prompts 0-2 are in the corpus; 3-5 are only matched by generic text.
    docs = [list(p) + r.token_ids for p, r in zip(prompts[:3], ar[:3], strict=True)]
    docs += [tok.encode(t) for t in spec_bench_prompts[6:]]
    rest = build_rest(docs, vocab_size=tok.vocab_size, tokenizer_fingerprint=tok.fingerprint,
                      path=tmp_path / "c.rest")
    build_crest(rest, CrestConfig(max_n=4, top_t=300), str(tmp_path / "c.crest"))
    accepted = {}
    for name in ("rest", "crest"):
        opts = {"datastore": str(tmp_path / f"c.{name}")}
        acc = 0
        for p, a in zip(prompts, ar, strict=True):
            r = engine.generate(p, params, drafter=name, drafter_options=opts)
            assert isinstance(r, GenerationResult) and isinstance(a, GenerationResult)
            assert r.token_ids == a.token_ids, (name, tok.decode(a.token_ids))
            acc += sum(r.accept_lengths) - r.steps
        accepted[name] = acc
    assert accepted["rest"] > 0 and accepted["crest"] > 0, accepted  # drafts were used
