"""EMS-SD's padded batch layouts (``bench/suite/padded_layouts.py``), installed into an engine
through ``Engine.use_runner``, on the bigram double: every layout commits the engine's
own tokens, pads what it says (and counts it), and hands the engine its runner back.
The real model's checks are in ``tests/e2e/test_batching_real.py``."""

from __future__ import annotations

import pytest
import torch
from helpers import BigramModel, ByteTokenizer

from recallspec.bench.suite.padded_layouts import LAYOUTS, PaddedRunner, layout, padded_layout
from recallspec.decoding.sampling import SamplingParams
from recallspec.engine import Engine, EngineConfig
from recallspec.engine.runner import Runner
from recallspec.errors import UnknownNameError
from recallspec.params import BATCH_LAYOUT_WORDS

PROMPTS = [b"abcabcabcab", b"hello hello hello", b"xyz", b"the cat sat on the mat; the cat"]


def _engine(max_batch_size: int = 3) -> Engine:
    table = torch.randn(256, 256, generator=torch.Generator().manual_seed(0)) * 3
    return Engine(BigramModel(table), ByteTokenizer(),  # type: ignore[arg-type]
                  EngineConfig(max_batch_size=max_batch_size, mode="fixed"))


def test_every_layout_commits_the_engines_tokens_and_pads_what_it_says() -> None:
    eng = _engine()
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (40, 17, 33, 25)]
    prompts = [list(p) for p in PROMPTS]
    ar = eng.generate(prompts, params, drafter="none")
    ems_steps: list[list[int]] | None = None  # (LAYOUTS lists ems, the engine's own, first)
    ems_rows = 0
    for name, lay in LAYOUTS.items():
        with padded_layout(eng, name) as pad:
            got = eng.generate(prompts, params, drafter="pld")
        assert [g.token_ids for g in got] == [a.token_ids for a in ar], name
        if ems_steps is None:
            ems_steps, ems_rows = [g.accept_lengths for g in got], eng.stats.rows
        # The same drafts, verified alike: padding changes the cost of a step only...
        assert [g.accept_lengths for g in got] == ems_steps, name
        assert (pad.rows > 0) is lay.pad_inputs and (pad.kv_entries > 0) is lay.pad_kv, name
        # ... and padding rows are rows the forwards fed on top of the engine's own.
        assert eng.stats.rows == ems_rows + pad.rows, name
        assert pad.ratio(eng.stats.new_tokens) == pad.rows / eng.stats.new_tokens
        assert eng.cache.free_slots == 3

def test_padded_layout_installs_a_runner_for_the_block_only() -> None:
    eng = _engine()
    own = eng.runner
    with padded_layout(eng, "ems"):  # the engine's own layout: nothing installed
        assert eng.runner is own
    with padded_layout(eng, "vanilla"):
        assert isinstance(eng.runner, PaddedRunner) and eng.runner.layout.name == "vanilla"
        assert eng.runner.cache is eng.cache
    assert eng.runner is own
    with pytest.raises(UnknownNameError, match="unpad-kv"), padded_layout(eng, "padded"):
        pass
    assert layout(LAYOUTS["vanilla"]) is LAYOUTS["vanilla"]
    # The words the engine refuses as a mode, naming this module, are these layouts.
    assert tuple(LAYOUTS) == BATCH_LAYOUT_WORDS


def test_use_runner_checks_the_runner_and_waits_for_an_idle_engine() -> None:
    eng = _engine()
    other = _engine()
    with pytest.raises(ValueError, match="KV cache"):
        eng.use_runner(PaddedRunner.over(other, "vanilla"))
    rid = eng.add_request(list(PROMPTS[0]), SamplingParams(max_new_tokens=4))
    with pytest.raises(RuntimeError, match="idle"):
        eng.use_runner(PaddedRunner.over(eng, "vanilla"))
    eng.abort(rid)
    eng.use_runner(PaddedRunner.over(eng, "unpad-input"))
    assert isinstance(eng.runner, PaddedRunner)
    eng.use_runner(None)  # the engine's own again
    assert type(eng.runner) is Runner and eng.runner.cache is eng.cache
