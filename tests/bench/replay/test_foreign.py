"""Another model's answers, retokenized and replayed (bench/replay/foreign.py, ``bench
replay --foreign-answers``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import ByteTokenizer, needs_model
from helpers.replay import grid_curve

from recallspec.bench.replay.exact import ReplayConfig, replay_answers
from recallspec.bench.replay.foreign import ForeignSource, load_foreign_answers, model_need
from recallspec.bench.replay.time_model import TimeModel, ar_sims
from recallspec.cli import main
from recallspec.engine.prompts import prompt_ids
from recallspec.errors import DataError

MODEL_ID = "vicuna-7b-v1.5-temperature-0.0-top_p-0"
HAIKU = "Waves fold into foam,\nsalt wind carries gull voices,\nthe tide keeps its time."
CODE = "```python\ndef add(a, b):\n    return a + b\n```\n\nThis returns the sum of a and b."
QUESTIONS: list[dict[str, Any]] = [
    {"question_id": 81, "category": "writing",
     "turns": ["Write a haiku about the sea.", "Now write it twice, one copy per paragraph."]},
    {"question_id": 125, "category": "coding",
     "turns": ["Write a Python function that adds two numbers.", "Rename it to `plus`."]},
]
# Second turns repeat the first (which their prompts hold): model-free drafters accept.
ANSWERS: list[dict[str, Any]] = [
    {"question_id": 81, "answer_id": "a81", "model_id": MODEL_ID, "tstamp": 0.0,
     "choices": [{"index": 0, "turns": [HAIKU, f"{HAIKU}\n\n{HAIKU}"]}]},
    {"question_id": 125, "answer_id": "a125", "model_id": MODEL_ID, "tstamp": 0.0,
     "choices": [{"index": 0, "turns": [CODE, CODE.replace("add(", "plus(")]}]},
]


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _files(tmp_path: Path, answers: list[dict[str, Any]] = ANSWERS) -> tuple[Path, Path]:
    """(answers, questions) in FastChat's layout: mt_bench/model_answer/X.jsonl beside
    mt_bench/question.jsonl."""
    return (_jsonl(tmp_path / "mt_bench" / "model_answer" / f"{MODEL_ID}.jsonl", answers),
            _jsonl(tmp_path / "mt_bench" / "question.jsonl", QUESTIONS))


def _conversation(users: list[str], answers: list[str]) -> list[dict[str, str]]:
    msgs = []
    for i, u in enumerate(users):
        msgs.append({"role": "user", "content": u})
        if i < len(answers):
            msgs.append({"role": "assistant", "content": answers[i]})
    return msgs


@needs_model
def test_records_hold_our_prompt_encoding_and_the_answer_text(tmp_path: Path) -> None:
    """Each turn's prompt is the engine's own encoding of the conversation (chat messages
    through ``engine/prompts.py``); its tokens decode back to the other model's text."""
    from recallspec.models import load_tokenizer

    tok = load_tokenizer()
    answers, questions = _files(tmp_path)
    recs, settings = load_foreign_answers(ForeignSource(answers, questions), tok)
    assert [r["question_id"] for r in recs] == [81, 125]
    assert [r["category"] for r in recs] == ["writing", "coding"]
    longest = 0
    for rec, q, a in zip(recs, QUESTIONS, ANSWERS, strict=True):
        c = rec["choices"][0]
        texts = a["choices"][0]["turns"]
        assert rec["eos_token_ids"] == sorted(tok.eos_token_ids)
        assert c["finish_reason"] == ["eos", "eos"]
        for j in range(2):
            assert c["prompt_ids"][j] == prompt_ids(tok, _conversation(q["turns"][: j + 1],
                                                                       texts[:j]))
            assert tok.decode(c["token_ids"][j]) == texts[j]
            assert not set(c["token_ids"][j]) & set(tok.eos_token_ids)
            longest = max(longest, len(c["token_ids"][j]))
    assert settings["foreign_model"] == MODEL_ID
    assert settings["retokenized_with"] == "smollm2-135m"
    assert settings["tokenizer_fingerprint"] == tok.fingerprint
    assert settings["max_new_tokens"] == longest + 1  # whole answers and their EOS fit
    assert settings["cut_turns"] == 0 and settings["sizing_default"] == "adaptive"

    # Cut at 6 tokens: "length", and the second turn's prompt holds the cut answer.
    cut, cut_settings = load_foreign_answers(ForeignSource(answers, questions,
                                                           max_new_tokens=6), tok)
    for rec, q in zip(cut, QUESTIONS, strict=True):
        c = rec["choices"][0]
        assert [len(t) for t in c["token_ids"]] == [6, 6]
        assert c["finish_reason"] == ["length", "length"]
        first = tok.decode(c["token_ids"][0])
        assert c["turns"][0] == first
        assert c["prompt_ids"][1] == prompt_ids(tok, _conversation(q["turns"], [first]))
    assert cut_settings["cut_turns"] == 4 and cut_settings["max_new_tokens"] == 6


@needs_model
def test_cli_replays_model_free_drafters_on_foreign_answers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    from recallspec.models import load_tokenizer

    answers, questions = _files(tmp_path)
    methods = ("pld:mode=fixed", "llma:mode=fixed")
    # The question file is found beside the answers' folder (FastChat's layout).
    assert main(["bench", "replay", "--foreign-answers", str(answers), "--methods",
                 ",".join(methods), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["foreign"]["foreign_model"] == MODEL_ID
    assert out["foreign"]["questions"] == str(questions)
    recs, settings = load_foreign_answers(ForeignSource(answers, questions), load_tokenizer())
    cfg = ReplayConfig(max_new_tokens=settings["max_new_tokens"])
    for m in methods:
        acc = replay_answers(recs, m.split(":")[0], cfg)
        pooled = [a for r in recs for a in acc[str(r["question_id"])]]
        assert out["mat"][m]["overall"]["mat"] == pytest.approx(sum(pooled) / len(pooled))
        assert out["mat"][m]["overall"]["questions"] == 2
    # The second turns repeat text their prompts hold: prompt lookup accepts.
    assert out["mat"]["pld:mode=fixed"]["overall"]["mat"] > 1.5
    assert main(["bench", "replay", "--foreign-answers", str(answers), "--questions",
                 str(questions), "--methods", "pld:mode=fixed"]) == 0
    text = capsys.readouterr().out
    assert f"answers of {MODEL_ID}" in text and "retokenized with smollm2-135m" in text
    assert "| overall |" in text


@needs_model
def test_cli_predicts_tokens_per_s_from_the_curve_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """--predict-time on another model's answers: priced by --curve alone (nothing to
    fit on), no recorded runs to compare with; cost-aware methods and the oracle too."""
    from recallspec.models import load_tokenizer

    answers, questions = _files(tmp_path)
    curve = grid_curve()
    curve_file = tmp_path / "curve.json"
    curve_file.write_text(json.dumps(curve.to_json()))
    out = tmp_path / "pred.json"
    methods = ["ar", "pld", "llma:mode=fixed", "oracle:drafters=pld+llma"]
    assert main(["bench", "replay", "--foreign-answers", str(answers), "--methods",
                 ",".join(methods), "--predict-time", "--curve", str(curve_file),
                 "--no-policy-time", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| overall |" in text and "[real" not in text and "cost curve alone" in text
    res = json.loads(out.read_text())
    assert res["recorded"] == {} and res["fit"]["source"] == "none"
    assert res["fit"]["row_fit"] is None and res["foreign"]["foreign_model"] == MODEL_ID
    assert list(res["predicted"]) == methods
    for m in methods:
        assert res["predicted"][m]["overall"]["tokens_per_s"] > 0
    assert res["predicted"]["pld"]["overall"]["mat"] > 1.0
    # ar's seconds: the curve's price of its prefills and one-row steps, nothing added.
    recs, _ = load_foreign_answers(ForeignSource(answers, questions), load_tokenizer())
    tm = TimeModel(curve, count_policy_time=False)
    want = sum(tm.turn(t) for ts in ar_sims(recs).values() for t in ts)
    assert res["predicted"]["ar"]["overall"]["seconds"] == pytest.approx(want)


@pytest.mark.parametrize("method", ["recycling", "sam+recycling:mode=fixed",
                                    "portfolio:recycling=true", "draft-model",
                                    "sam+draft-model:layers=2", "oracle:drafters=pld+recycling"])
@pytest.mark.parametrize("predict", [False, True])
def test_methods_that_need_the_model_are_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], method: str, predict: bool,
) -> None:
    # The answer file does not even exist: the refusal comes first.
    missing = str(tmp_path / "none.jsonl")
    argv = ["bench", "replay", "--foreign-answers", missing, "--methods", f"pld,{method}"]
    assert main(argv + (["--predict-time"] if predict else [])) == 2
    err = capsys.readouterr().err
    assert f"{method}: " in err and "model-free drafters only" in err
    assert "does not exist" not in err


def test_what_a_model_free_replay_cannot_do_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    missing = str(tmp_path / "none.jsonl")
    base = ["bench", "replay", "--foreign-answers", missing, "--methods", "pld"]
    assert main([*base, "--predict-time", "--model-topk"]) == 2
    assert "--model-topk" in capsys.readouterr().err
    assert main([*base, "--predict-time", "--fit-rows-on", "pld"]) == 2
    assert "no recorded runs" in capsys.readouterr().err
    assert main(["bench", "replay", "--answers", missing, "--questions", missing]) == 2
    assert "--questions goes with --foreign-answers" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: one source or the other
        main(["bench", "replay", "--answers", missing, "--foreign-answers", missing])
    capsys.readouterr()
    answers = _jsonl(tmp_path / "answers" / "x.jsonl", ANSWERS)  # no question.jsonl above
    assert main(["bench", "replay", "--foreign-answers", str(answers)]) == 2
    assert "pass --questions" in capsys.readouterr().err


def test_model_need_names_what_needs_the_model() -> None:
    for free in ("ar", "pld", "llma:mode=fixed", "sam:index=/nowhere.rsidx", "portfolio",
                 "rest:datastore=/nowhere", "oracle", "oracle:drafters=pld+sam"):
        assert model_need(free) is None, free  # (an index opens at its first request)
    assert model_need("sam+recycling") == "sam+recycling learns from the model's " \
        "verification logits"
    assert model_need("draft-model:gamma=2") == "draft-model drafts with a model"


def test_bad_foreign_files_are_data_errors_naming_file_and_line(tmp_path: Path) -> None:
    tok = ByteTokenizer()
    questions = _jsonl(tmp_path / "question.jsonl", QUESTIONS)
    unknown = [ANSWERS[0], {**ANSWERS[1], "question_id": 99}]
    answers = _jsonl(tmp_path / "a.jsonl", unknown)
    with pytest.raises(DataError, match=r"a\.jsonl:2: question 99 is not in .*question\.jsonl"):
        load_foreign_answers(ForeignSource(answers, questions), tok)
    shapes: list[Any] = [
        {"question_id": 81, "turns": ["no choices"]},
        {"question_id": 81, "choices": [{"turns": "not a list"}]},
        {"question_id": 81, "choices": [{"turns": [1, 2]}]},
        {"choices": [{"turns": ["no id"]}]},
        ["not an object"],
    ]
    for bad in shapes:
        answers = _jsonl(tmp_path / "b.jsonl", [ANSWERS[0], bad])
        with pytest.raises(DataError, match=r"b\.jsonl:2: not an answer of FastChat's shape"):
            load_foreign_answers(ForeignSource(answers, questions), tok)
    answers = _jsonl(tmp_path / "c.jsonl", [{**ANSWERS[0], "choices": [{"turns": [HAIKU]}]}])
    with pytest.raises(DataError, match=r"c\.jsonl:1: question 81 has 2 turns"):
        load_foreign_answers(ForeignSource(answers, questions), tok)
    bad_q = _jsonl(tmp_path / "q2.jsonl", [QUESTIONS[0], {"question_id": 5, "turns": ["x"]}])
    with pytest.raises(DataError, match=r"q2\.jsonl:2: not a question"):
        load_foreign_answers(ForeignSource(_jsonl(tmp_path / "d.jsonl", ANSWERS), bad_q), tok)
    twice = _jsonl(tmp_path / "q3.jsonl", [QUESTIONS[0], QUESTIONS[0]])
    with pytest.raises(DataError, match=r"q3\.jsonl:2: question 81 is there twice"):
        load_foreign_answers(ForeignSource(_jsonl(tmp_path / "e.jsonl", ANSWERS), twice), tok)
    answers = _jsonl(tmp_path / "g.jsonl", [ANSWERS[0], ANSWERS[1], ANSWERS[0]])
    with pytest.raises(DataError, match=r"g\.jsonl:3: question 81 is answered twice"):
        load_foreign_answers(ForeignSource(answers, questions), tok)
    with pytest.raises(DataError, match="do not fit in 40 KV positions"):
        load_foreign_answers(ForeignSource(_jsonl(tmp_path / "f.jsonl", ANSWERS), questions,
                                           max_len=40), tok)
