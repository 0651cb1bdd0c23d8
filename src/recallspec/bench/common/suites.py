"""Benchmark suites: which questions a benchmark run asks, read from the shared data.

A suite is a list of ``Question``s (id, category, user turns). Multi-turn questions
(MT-Bench) are answered turn by turn, each later turn conditioned on the method's own
earlier answers, as in Spec-Bench.

Subsets are FIXED so that runs stay comparable: ``--per-category N`` keeps, within
each category in file order, the N questions at evenly spaced positions
``floor(i * n / N)`` for ``i = 0..N-1`` (the first question always included). Even
spacing spreads the choice across a category's sub-categories (Spec-Bench's
``mt_bench`` category holds 8 MT-Bench categories in blocks of 10). ``--limit N`` then
keeps the first N questions of the result.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from recallspec.data.paths import DataNotFoundError, data_dir
from recallspec.errors import DataError, UnknownNameError

MT_BENCH_CATEGORIES = (
    "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
)
SPEC_BENCH_CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


@dataclass(frozen=True)
class Question:
    question_id: int | str
    category: str  # the category reports group by
    turns: tuple[str, ...]  # user turns, answered in order
    subcategory: str | None = None  # e.g. the MT-Bench category inside spec_bench's mt_bench


@dataclass(frozen=True)
class SuiteSelection:
    per_category: int | None = None
    limit: int | None = None
    categories: tuple[str, ...] | None = None  # None = all

    def __post_init__(self) -> None:
        if self.per_category is not None and self.per_category < 1:
            raise DataError("--per-category must be >= 1")
        if self.limit is not None and self.limit < 1:
            raise DataError("--limit must be >= 1")


# ---- readers ----------------------------------------------------------------------


def _require(path: Path) -> Path:
    if not path.is_file():
        raise DataError(f"benchmark data file {path} is missing")
    return path


def _jsonl(path: Path) -> Iterator[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(_require(path), "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: not valid JSON ({e.msg})") from None


def _field(row: dict, key: str, path: Path) -> object:
    if key not in row:
        raise DataError(f"{path}: a record lacks the field {key!r}")
    return row[key]


def _spec_bench(root: Path) -> list[Question]:
    path = root / "spec_bench" / "question.jsonl"
    out = []
    for r in _jsonl(path):
        cat = str(_field(r, "category", path))
        turns = tuple(str(t) for t in _field(r, "turns", path))  # type: ignore[attr-defined]
        qid = _field(r, "question_id", path)
        if cat in MT_BENCH_CATEGORIES:  # Spec-Bench reports MT-Bench as one category
            out.append(Question(qid, "mt_bench", turns, subcategory=cat))  # type: ignore[arg-type]
        else:
            out.append(Question(qid, cat, turns))  # type: ignore[arg-type]
    return out


def _mt_bench(root: Path) -> list[Question]:
    path = root / "mt_bench" / "question.jsonl"
    return [
        Question(
            _field(r, "question_id", path),  # type: ignore[arg-type]
            str(_field(r, "category", path)),
            tuple(str(t) for t in _field(r, "turns", path)),  # type: ignore[attr-defined]
        )
        for r in _jsonl(path)
    ]


def _humaneval(root: Path) -> list[Question]:
    path = root / "humaneval" / "HumanEval.jsonl.gz"
    return [
        Question(
            str(_field(r, "task_id", path)),
            "humaneval",
            (
                "Complete the following Python function. Return the whole function.\n\n"
                f"```python\n{_field(r, 'prompt', path)}```",
            ),
        )
        for r in _jsonl(path)
    ]


def _mbpp(root: Path) -> list[Question]:
    # The standard test split is task_ids 11..510.
    path = root / "mbpp" / "mbpp.jsonl"
    out = []
    for r in _jsonl(path):
        tid = int(_field(r, "task_id", path))  # type: ignore[call-overload]
        if not 11 <= tid <= 510:
            continue
        tests = "\n".join(str(t) for t in _field(r, "test_list", path))  # type: ignore[attr-defined]
        text = f"{_field(r, 'text', path)}\nYour code should pass these tests:\n\n{tests}"
        out.append(Question(tid, "mbpp", (text,)))
    return out


def _gsm8k(root: Path) -> list[Question]:
    path = root / "gsm8k" / "test.jsonl"
    return [
        Question(i, "gsm8k", (str(_field(r, "question", path)),))
        for i, r in enumerate(_jsonl(path))
    ]


def _cnndm(root: Path) -> list[Question]:
    # Rows come in pairs (with / without the article); keep those with the article.
    path = root / "cnn_dailymail" / "cad_cnndm_1_0.jsonl"
    return [
        Question(
            int(_field(r, "input_index", path)),  # type: ignore[call-overload]
            "cnndm",
            ("Summarize the following article in three sentences.\n\n" + str(r["article"]),),
        )
        for r in _jsonl(path)
        if _field(r, "assigned_weight", path) == 1
    ]


def _sentences(text: str) -> list[str]:
    """Whole sentences of a passage (a snippet may start or end mid-sentence: those
    fragments are dropped)."""
    parts = [p.strip() for p in text.replace("? ", "?\n").replace("! ", "!\n")
             .replace(". ", ".\n").split("\n")]
    whole = parts[1:-1] if len(parts) > 2 else []  # the ends may be cut
    return [p for p in whole if len(p.split()) >= 8 and p[0].isupper()]


def _rag_extractive(root: Path) -> list[Question]:
    """Extractive questions over Spec-Bench's RAG passages: each RAG question's passages
    are kept and its question is replaced, alternately, by "quote the sentence of passage
    k that contains <phrase>" (category ``rag_quote``: the answer is one sentence of the
    prompt) and "copy passage k verbatim, then explain how it answers <the original
    question>" (``rag_copy``: a copied paragraph, then free text). Deterministic: k
    cycles through the passages, the sentence is the passage's longest whole sentence,
    the phrase the four words at its middle."""
    out: list[Question] = []
    for q in _spec_bench(root):
        if q.category != "rag":
            continue
        *passages, question = [x for x in q.turns[0].split("\n") if x.strip()]
        if not passages:
            continue
        n = len(out)
        k = n % len(passages)
        body = "\n\n".join(f"Passage {i + 1}: {p}" for i, p in enumerate(passages))
        sents = _sentences(passages[k])
        if n % 2 == 0 and sents:
            words = max(sents, key=len).split()
            mid = len(words) // 2
            phrase = " ".join(words[mid - 2 : mid + 2])
            ask = (f'Quote, word for word, the sentence of passage {k + 1} that contains '
                   f'"{phrase}". Then say in one sentence what it means.')
            out.append(Question(f"{q.question_id}-quote", "rag_quote", (f"{body}\n\n{ask}",)))
        else:
            ask = (f"Copy passage {k + 1} verbatim. Then explain in two sentences how it "
                   f"answers this question: {question}")
            out.append(Question(f"{q.question_id}-copy", "rag_copy", (f"{body}\n\n{ask}",)))
    return out


# Written for this project: prompts where copying from the context pays off, and one
# where it does not. The second turn of "edit" checks multi-turn handling offline.
_DEMO: tuple[Question, ...] = (
    Question(
        "demo-1", "summarise",
        (
            "Summarise this note in two sentences.\n\nNote: The bakery on Mill Road opens at "
            "7 am on weekdays and 8 am on weekends. From June it will also sell sourdough "
            "loaves baked with flour from the local mill, and pre-orders can be placed by "
            "phone until 6 pm the day before.",
        ),
    ),
    Question(
        "demo-2", "edit",
        (
            "Add a docstring to this function and return the whole function.\n\n```python\n"
            "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n"
            "        return hi\n    return x\n```",
            "Now rename the function to `bound`.",
        ),
    ),
    Question(
        "demo-3", "qa",
        (
            "Answer from the text only.\n\nText: The Harbour ferry runs every 20 minutes "
            "between 6 am and 11 pm. Tickets cost 3 euros for adults and 1.50 euros for "
            "children under twelve. Bicycles travel free outside rush hour.\n\n"
            "Question: How much does a ticket cost for a ten-year-old?",
        ),
    ),
    Question("demo-4", "chat", ("Give three tips for learning to play the guitar.",)),
)


def _demo(root: Path | None) -> list[Question]:
    return list(_DEMO)


_READERS: dict[str, Callable[[Path], list[Question]]] = {
    "spec_bench": _spec_bench,
    "mt_bench": _mt_bench,
    "humaneval": _humaneval,
    "mbpp": _mbpp,
    "gsm8k": _gsm8k,
    "cnndm": _cnndm,
    "rag_extractive": _rag_extractive,
}
SUITES: tuple[str, ...] = (*_READERS, "demo")


def select(questions: Sequence[Question], sel: SuiteSelection) -> list[Question]:
    """Apply the fixed category filter / stratified subset / limit (see module doc)."""
    order: list[str] = []
    by_cat: dict[str, list[Question]] = {}
    for q in questions:
        if q.category not in by_cat:
            order.append(q.category)
            by_cat[q.category] = []
        by_cat[q.category].append(q)
    if sel.categories is not None:
        unknown = [c for c in sel.categories if c not in by_cat]
        if unknown:
            raise UnknownNameError(
                f"unknown categories {', '.join(unknown)}; this suite has: {', '.join(order)}"
            )
        order = [c for c in order if c in sel.categories]
    out: list[Question] = []
    for c in order:
        qs = by_cat[c]
        if sel.per_category is not None and sel.per_category < len(qs):
            n, k = len(qs), sel.per_category
            qs = [qs[(i * n) // k] for i in range(k)]
        out.extend(qs)
    if sel.limit is not None:
        out = out[: sel.limit]
    return out


def load_suite(
    name: str, selection: SuiteSelection | None = None, data: str | Path | None = None
) -> list[Question]:
    """The questions of a suite, subset by ``selection``. ``data`` overrides the data dir."""
    sel = selection or SuiteSelection()
    name = name.replace("-", "_")  # rag-extractive = rag_extractive
    if name == "demo":
        return select(_demo(None), sel)
    if name not in _READERS:
        raise UnknownNameError(f"unknown suite {name!r}; available: {', '.join(SUITES)}")
    try:
        root = data_dir(data)
    except DataNotFoundError as e:
        raise DataError(str(e)) from None
    qs = _READERS[name](root)
    if not qs:
        raise DataError(f"suite {name!r} has no questions in {root}")
    return select(qs, sel)
