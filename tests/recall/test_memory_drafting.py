"""Drafting from the response memory (issue 21 follow-up): the memory's own delta rule
(``memory_delta``, default 0) against the corpora's ``delta``, the choice between
external sources by how far each exceeds its delta, the tau switch of sam+recycling,
and the prompt tail kept in front of each remembered output (``memory_prompt_tail``),
which lets a re-asked prompt draft its earlier answer from the first decoding step."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from helpers import BigramModel, ByteTokenizer

from recallspec.decoding.sampling import SamplingParams
from recallspec.drafters.sam import (
    CORPUS,
    DYNAMIC,
    MEMORY,
    N_BUCKETS,
    NONE,
    RECYCLING,
    SOURCES,
    SamDrafter,
    SamOptions,
    SamRecyclingDrafter,
)
from recallspec.engine import Engine, EngineConfig
from recallspec.recall.memory.response_memory import ResponseMemory
from recallspec.recall.request_cursors import RecallCursors
from recallspec.recall.view import RecallSource, RecallView, ScratchDir, flatten

VOCAB = 100
# The request's text ends with [9, 10, 11]: its own earlier occurrence is [10, 11]
# (l_d = 2, continued by 52); the memory holds [9, 10, 11] (l_m = 3, continued by 60..63).
TEXT = [50, 51, 10, 11, 52, 9, 10, 11]
MEMORY_DOC = [9, 10, 11, 60, 61, 62, 63]
# A corpus whose match is longer still ([52, 9, 10, 11], 4) but not by its delta.
CORPUS_DOC = [52, 9, 10, 11, 70, 71, 72]


@pytest.fixture
def sources() -> Any:
    mem = ResponseMemory(1000, VOCAB, "fp")
    mem.add("t", MEMORY_DOC)
    assert mem.flush(10)
    scratch = ScratchDir()
    tokens, offsets = flatten([np.asarray(CORPUS_DOC, np.uint32)])
    corpus = RecallSource(CORPUS, "c", scratch.build(tokens, offsets, VOCAB, "fp"))
    yield mem.view("t"), (corpus,)
    mem.close()
    scratch.close()


def _draft(d: SamDrafter, view: RecallView) -> tuple[str, list[int]]:
    d._recall = lambda rid: view
    d.start(0, TEXT)
    tree = d.propose(0, 8)
    return d.last_step(0).source, tree.tokens.tolist()


@pytest.mark.parametrize(("memory_delta", "source", "draft"), [
    (0, MEMORY, [60, 61, 62, 63]),  # l_m = 3 > l_d + 0
    (1, DYNAMIC, [52, 9, 10, 11]),  # 3 > 2 + 1 fails: the request's own text
])
def test_memory_delta(sources: Any, memory_delta: int, source: str, draft: list[int]) -> None:
    memory, _ = sources
    d = SamDrafter(SamOptions(memory_delta=memory_delta))
    got_source, got = _draft(d, (memory, ()))
    assert got_source == source and got[:4] == draft
    assert d.last_step(0).memory_length == 3 and d.last_step(0).dynamic_length == 2


def test_corpus_keeps_its_delta_and_memory_wins_by_margin(sources: Any) -> None:
    """The corpus matches longest (4) but not by its delta 5; the memory (3) exceeds its
    delta 0 by more, so it is the external source - and it drafts."""
    memory, corpora = sources
    assert _draft(SamDrafter(SamOptions()), ((), corpora))[0] == DYNAMIC
    assert _draft(SamDrafter(SamOptions(delta=1)), ((), corpora)) == (CORPUS, [70, 71, 72])
    source, got = _draft(SamDrafter(SamOptions()), (memory, corpora))
    assert (source, got) == (MEMORY, [60, 61, 62, 63])
    # Raw lengths alone would have picked the corpus (and then the dynamic draft).
    rc = RecallCursors({MEMORY: 0, CORPUS: 5})
    rc.refresh((memory, corpora), lambda: np.asarray(TEXT, np.uint32))
    assert rc.best is not None and rc.best[0].kind == MEMORY and rc.best_length == 3
    plain = RecallCursors()
    plain.refresh((memory, corpora), lambda: np.asarray(TEXT, np.uint32))
    assert plain.best is not None and plain.best[0].kind == CORPUS and plain.best_length == 4


@pytest.mark.parametrize(("memory_delta", "recycling"), [(0, False), (1, True)])
def test_tau_switch_uses_the_memory_delta(sources: Any, memory_delta: int,
                                          recycling: bool) -> None:
    """sam+recycling drafts the automaton when max(l_d, l_m - memory_delta) >= tau, else
    Token Recycling (whose table is still empty here: no draft)."""
    memory, _ = sources
    d = SamRecyclingDrafter(SamOptions(memory_delta=memory_delta), tau=3)
    source, _ = _draft(d, (memory, ()))
    assert d._auxiliary_turn(d._states[0]) is recycling
    assert source == (NONE if recycling else MEMORY)
    assert d.context(0) // N_BUCKETS == SOURCES.index(RECYCLING if recycling else MEMORY)


def test_bad_memory_delta() -> None:
    with pytest.raises(ValueError):
        SamOptions(memory_delta=-1)
    with pytest.raises(ValueError):
        EngineConfig(memory_tokens=10, memory_prompt_tail=-1)


# ---- the prompt tail in front of each remembered output --------------------------------
PROMPT = list(b"Please answer the very same question once more, in a new chat?")


def _first_memory_step(tail: int) -> tuple[int, int, int]:
    """(tokens the memory holds after one answer, l_m and source-is-memory at the first
    decoding step of the same prompt sent again)."""
    table = torch.randn(256, 256, generator=torch.Generator().manual_seed(0)) * 3
    eng = Engine(BigramModel(table), ByteTokenizer(),
                 EngineConfig(memory_tokens=1000, memory_prompt_tail=tail, max_draft_nodes=8,
                              mode="fixed"))
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    first = eng.generate(PROMPT, params, drafter="sam", tenant="t")
    assert eng.memory is not None and eng.memory.flush(10)
    held = eng.memory_stats()["tenants"]["t"]["tokens"]
    d = eng.drafter("sam")
    assert isinstance(d, SamDrafter)
    rid = eng.add_request(PROMPT, params, drafter="sam", tenant="t")
    while rid not in eng.scheduler.running or not eng.scheduler.running[rid].generated:
        eng.step()  # admission and the prefill (the first token)
    eng.step()  # the first decoding step: drafted once
    step = d.last_step(rid)
    while eng.has_unfinished():
        eng.step()
    again = eng.generate(PROMPT, params, drafter="sam", tenant="t")
    assert again.token_ids == first.token_ids  # lossless
    eng.close()
    return held, step.memory_length, step.source == MEMORY


def test_prompt_tail_anchors_the_earlier_answer() -> None:
    assert len(PROMPT) > 32
    held, l_m, from_memory = _first_memory_step(32)
    assert held == 32 + 20  # the prompt's last 32 tokens, then the output
    assert from_memory and l_m >= 32  # the whole tail (and the first token) matched
    held, l_m, _ = _first_memory_step(0)
    assert held == 20 and l_m <= 1  # the output alone: only the first token to match


# ---- the background worker at interpreter exit ------------------------------------------
EXIT_SCRIPT = """
import time
import numpy as np
from recallspec.recall.memory.response_memory import ResponseMemory
m = ResponseMemory(2_000_000, 50_000, "fp", segments=1)
m.add("t", np.random.default_rng(0).integers(0, 50_000, 1_500_000, dtype=np.uint32))
time.sleep(0.2)  # the worker has taken the job
print("exiting", flush=True)  # while it builds (~1 s)
"""


def test_exit_during_a_build_is_clean() -> None:
    """The interpreter exits while the memory's worker builds: the exit waits for the
    build (an atexit hook) instead of freezing the daemon thread inside C++ (which leaks
    the builder or aborts the process: "terminate called without an active exception")."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "exiting", r.stderr
    assert "leaked" not in r.stderr and "terminate" not in r.stderr, r.stderr
