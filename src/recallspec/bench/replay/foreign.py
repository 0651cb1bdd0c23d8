"""Another model's recorded answers, retokenized for replay (``bench replay
--foreign-answers``).

Input: a FastChat MT-Bench answer file, one JSON object a line with ``question_id``,
``model_id`` and ``choices[0].turns`` (the answer text of each turn; FastChat's
``data/mt_bench/model_answer/*.jsonl``, REST's baselines), and its question file
(``question_id``, ``category``, ``turns``: the user text of each turn).

Each answer becomes the record ``exact.py: load_ar_answers`` gives replay, as if our
engine had decoded that text: turn j's prompt is our own prompt encoding of the
conversation so far (``bench/common/prompting.py: conversation_ids``: user q1, assistant
a1, ..., user qj in the tokenizer's chat template, as every recorded run builds it), its
tokens the answer text encoded without special tokens. An answer is cut at
``max_new_tokens`` (finish "length"; later turns' prompts then hold the cut answer, as a
run's would); an uncut answer ended on EOS. The records carry no times: nothing was
timed here.

What replaying them measures: how model-free drafters accept along THAT model's text,
in our tokenizer's tokens (an approximation of its own token stream: another vocabulary
cuts the text elsewhere). Drafters that need the model (its verification logits, a draft
model) have nothing to replay with and are refused (``model_need``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recallspec.bench.common.method import SIZING_DEFAULT_KEY, method_spec
from recallspec.bench.common.prompting import conversation_ids
from recallspec.bench.replay.policies import probe_drafters
from recallspec.data.corpus_files import iter_jsonl
from recallspec.errors import DataError
from recallspec.models.loader import DEFAULT_MODEL
from recallspec.params import DEFAULT_SIZING

QUESTION_FILE = "question.jsonl"  # FastChat's data/mt_bench/question.jsonl


@dataclass(frozen=True)
class ForeignSource:
    """Where foreign answers come from and how they are retokenized."""

    answers: Path  # the answer file
    questions: Path  # its question file
    tokenizer: str | None = None  # whose tokenizer retokenizes them (--model; None: default)
    max_new_tokens: int | None = None  # cut each answer to this many tokens (None: whole)
    max_len: int | None = None  # KV positions a turn must fit in (None: unchecked)

    def __post_init__(self) -> None:
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise DataError("--max-new-tokens must be >= 1")


@dataclass(frozen=True)
class _Question:
    category: str
    turns: tuple[str, ...]


@dataclass(frozen=True)
class _Answer:
    line: int
    question_id: int | str
    model_id: str | None
    answer_id: str | None
    turns: tuple[str, ...]


def default_questions(answers: Path) -> Path | None:
    """The question file beside the answers' folder (FastChat's layout:
    ``mt_bench/model_answer/X.jsonl`` and ``mt_bench/question.jsonl``), if there is one."""
    path = answers.parent.parent / QUESTION_FILE
    return path if path.is_file() else None


def _lines(path: Path, what: str) -> list[tuple[int, Any]]:
    if not path.is_file():
        raise DataError(f"{what} {path} does not exist")
    with open(path, encoding="utf-8") as f:
        return list(iter_jsonl(f, path))


def _texts(value: Any) -> tuple[str, ...] | None:
    if isinstance(value, list) and value and all(isinstance(t, str) for t in value):
        return tuple(value)
    return None


def _qid(value: Any) -> int | str | None:
    return value if isinstance(value, int | str) and not isinstance(value, bool) else None


def read_questions(path: Path) -> dict[str, _Question]:
    """question id (as text) -> its category and user turns; a line of another shape
    raises DataError naming the file and the line."""
    out: dict[str, _Question] = {}
    for n, rec in _lines(path, "question file"):
        qid = _qid(rec.get("question_id")) if isinstance(rec, dict) else None
        turns = _texts(rec.get("turns")) if isinstance(rec, dict) else None
        cat = rec.get("category") if isinstance(rec, dict) else None
        if qid is None or turns is None or not isinstance(cat, str):
            raise DataError(f"{path}:{n}: not a question (want question_id, category and "
                            "turns, a list of user texts)")
        if str(qid) in out:
            raise DataError(f"{path}:{n}: question {qid} is there twice")
        out[str(qid)] = _Question(cat, turns)
    if not out:
        raise DataError(f"{path} holds no questions")
    return out


def read_foreign_answers(path: Path) -> list[_Answer]:
    """The answers of a FastChat answer file; a line of another shape raises DataError
    naming the file and the line."""
    out: list[_Answer] = []
    for n, rec in _lines(path, "answer file"):
        choices = rec.get("choices") if isinstance(rec, dict) else None
        first = choices[0] if isinstance(choices, list) and choices else None
        turns = _texts(first.get("turns")) if isinstance(first, dict) else None
        qid = _qid(rec.get("question_id")) if isinstance(rec, dict) else None
        if qid is None or turns is None:
            raise DataError(f"{path}:{n}: not an answer of FastChat's shape (want "
                            "question_id and choices[0].turns, a list of answer texts)")
        model, aid = rec.get("model_id"), rec.get("answer_id")
        out.append(_Answer(n, qid, model if isinstance(model, str) else None,
                           aid if isinstance(aid, str) else None, turns))
    if not out:
        raise DataError(f"{path} holds no answers")
    return out


def _retokenize(
    tokenizer: Any, text: str, cap: int | None,
) -> tuple[list[int], str, str]:
    """(answer ids, the answer's text as the conversation goes on with it, finish)."""
    ids = [int(t) for t in tokenizer.encode(text)]
    if cap is not None and len(ids) >= cap:
        # The engine stops at max_new_tokens before it could commit an EOS.
        return ids[:cap], str(tokenizer.decode(ids[:cap])), "length"
    return ids, text, "eos"


def load_foreign_answers(
    src: ForeignSource, tokenizer: Any,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Records of ``src``'s answers for replay (the fields ``load_ar_answers``' records
    give it: ``prompt_ids``, ``token_ids``, ``finish_reason``, ``eos_token_ids``, ...; no
    times) and their settings: where they came from and how they were retokenized.
    ``tokenizer``: ``src.tokenizer``'s."""
    questions = read_questions(src.questions)
    answers = read_foreign_answers(src.answers)
    eos = sorted(int(e) for e in tokenizer.eos_token_ids)
    records: list[dict[str, Any]] = []
    seen: dict[str, int] = {}  # question id -> its answer's line
    cut = 0
    for a in answers:
        q = questions.get(str(a.question_id))
        if q is None:
            raise DataError(f"{src.answers}:{a.line}: question {a.question_id} is not in "
                            f"{src.questions}")
        if len(a.turns) != len(q.turns):
            raise DataError(f"{src.answers}:{a.line}: question {a.question_id} has "
                            f"{len(q.turns)} turns in {src.questions}, the answer "
                            f"{len(a.turns)}")
        if str(a.question_id) in seen:
            raise DataError(f"{src.answers}:{a.line}: question {a.question_id} is answered "
                            f"twice (also on line {seen[str(a.question_id)]})")
        seen[str(a.question_id)] = a.line
        prompts: list[list[int]] = []
        tokens: list[list[int]] = []
        finish: list[str] = []
        texts: list[str] = []
        for j in range(len(q.turns)):
            prompt = conversation_ids(tokenizer, q.turns[: j + 1], texts)
            ids, text, fin = _retokenize(tokenizer, a.turns[j], src.max_new_tokens)
            # (An answer that ends on EOS commits it too.)
            need = len(prompt) + len(ids) + (fin == "eos")
            if src.max_len is not None and need > src.max_len:
                raise DataError(f"{src.answers}:{a.line}: question {a.question_id}, turn "
                                f"{j + 1}: {len(prompt)} prompt and {len(ids)} answer tokens "
                                f"do not fit in {src.max_len} KV positions (raise --max-len "
                                "or cut the answers with --max-new-tokens)")
            cut += fin == "length"
            prompts.append(prompt)
            tokens.append(ids)
            finish.append(fin)
            texts.append(text)
        records.append({
            "question_id": a.question_id, "category": q.category,
            "answer_id": a.answer_id, "model_id": a.model_id, "method": "ar",
            "eos_token_ids": eos,
            "choices": [{
                "index": 0, "turns": texts, "token_ids": tokens, "prompt_ids": prompts,
                "prompt_tokens": [len(p) for p in prompts],
                "new_tokens": [len(t) for t in tokens], "finish_reason": finish,
            }],
        })
    longest = max(len(t) for r in records for t in r["choices"][0]["token_ids"])
    models = sorted({a.model_id for a in answers if a.model_id is not None})
    settings = {
        "foreign_answers": str(src.answers), "questions": str(src.questions),
        "foreign_model": ", ".join(models) or None,
        "retokenized_with": src.tokenizer or DEFAULT_MODEL,
        "tokenizer_fingerprint": getattr(tokenizer, "fingerprint", None),
        # Whole answers fit: the longest and its EOS.
        "max_new_tokens": src.max_new_tokens or longest + 1,
        "cut_turns": cut,
        # Our model (its tokenizer, its cost curve where --curve is not given).
        "model": src.tokenizer,
        # A method named without a sizing means what it means today (no run recorded one).
        SIZING_DEFAULT_KEY: DEFAULT_SIZING,
    }
    return records, settings


def model_need(method: str) -> str | None:
    """What of the model ``method`` needs (None: nothing, it can replay another model's
    answers): its verification logits (``Drafter.needs_logits``: Token Recycling alone,
    in ``sam+recycling`` or in a portfolio with ``recycling=true``) or forwards to draft
    with (``costly_proposals``: a model forward per draft position, the draft model's).
    An oracle needs what any of its drafters needs."""
    for d in probe_drafters(method, method_spec(method)):
        if d.needs_logits:
            return f"{d.name} learns from the model's verification logits"
        if d.costly_proposals:
            return f"{d.name} drafts with a model"
    return None


def refuse_row_fit(row_fit: str | None) -> None:
    """DataError for a time model's row term fitted on a named run (``--fit-rows-on``):
    another model's answers have none ("auto" and None fit nothing on them)."""
    if row_fit not in (None, "auto"):
        raise DataError(f"--fit-rows-on {row_fit}: another model's answers have no "
                        "recorded runs to fit on")


def refuse_model_drafters(methods: Sequence[str], answers: Path) -> None:
    """DataError for the first of ``methods`` that needs the model (``model_need``)."""
    for m in methods:
        need = model_need(m)
        if need is not None:
            raise DataError(f"{m}: {need}, which another model's answers ({answers}) do not "
                            "come with: replay them with model-free drafters only (pld, "
                            "llma, sam, portfolio, rest, crest, oracle:drafters=... of those)")
