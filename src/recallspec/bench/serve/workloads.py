"""The workloads of ``recallspec bench serve``: sessions of chat requests, built from the
shared data (reading files only: no server, model or network).

A session is one client's work: its requests go one after another, each once the answer
to the previous one has ended (``client.run_sessions``); sessions start at the
Poisson arrival times. What request ``k`` of a session carries is ``messages``:

* ``spec_bench``: one request each, a Spec-Bench first turn (``--per-category`` ...):
  the single-request load of the earlier runs, unchanged;
* ``multiturn``: chats. Half the sessions are MT-Bench questions (its two turns), half
  ShareGPT first human turns (of at most ``SHAREGPT_MAX_CHARS``) followed by fixed
  follow-up asks: the shared ShareGPT files hold first human turns only (the one file
  with more, FastChat's dummy conversation, is synthetic identity small talk). Every
  request re-sends the transcript so far with the server's own earlier answers;
* ``agent``: a coding agent's loop over HumanEval and MBPP tasks (half each): a system
  prompt, the task, then after each answer one more message holding a tool result made
  from the task's own tests (a first test failing, the last one failing, all passing),
  the whole transcript re-sent each step. The result goes as a user message: our server
  takes no ``tool`` role (agents on models without tool calls do the same);
* ``rag``: questions over shared documents: ``documents`` CNN/DailyMail articles, each
  read by several sessions (session i reads document i mod documents). Every request is
  the system prompt, then a user message of the document and one question: no
  transcript (a RAG app retrieves again per question), so all the requests over one
  document share a prefix of hundreds of tokens and differ in the question at its end;
* ``extract``, ``bfcl``, ``bfcl_multiturn``: structured outputs and tool calls
  (``agents.py``): their requests carry ``response_format`` or ``tools``, and their
  answers are scored (schema-valid JSON, BFCL's AST and multi-turn checks).

Deterministic: the items are evenly spaced over each source (as ``suites.select``), the
tool results and questions are fixed functions of the item, and one shuffle seeded by
``seed`` orders the sessions.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from recallspec.bench.common.suites import SuiteSelection, load_suite
from recallspec.bench.serve import agents
from recallspec.data.corpus_files import iter_records, record_messages
from recallspec.data.paths import DataNotFoundError, data_dir
from recallspec.errors import DataError

WORKLOADS = ("spec_bench", "multiturn", "agent", "rag", *agents.AGENT_WORKLOADS)
DESCRIPTIONS = {
    "spec_bench": "Spec-Bench first turns, one request per session",
    "multiturn": "chats: MT-Bench's two turns and ShareGPT first turns with follow-ups, "
                 "each turn re-sending the transcript with the server's own answers",
    "agent": "a coding agent's loop over HumanEval / MBPP tasks: each step re-sends the "
             "transcript plus one tool result (test-run output made from the task's tests)",
    "rag": "questions over shared CNN/DailyMail documents: system prompt + document, then "
           "a different question per request (sessions share documents)",
    **agents.DESCRIPTIONS,
}
# Turns each workload can make (ShareGPT: its first turn + the follow-ups; agent: the
# task + the tool results; rag: the questions).
MAX_TURNS = {"spec_bench": 1, "multiturn": 4, "agent": 4, "rag": 6, **agents.AGENT_MAX_TURNS}
SHAREGPT_FILE = "sharegpt/mlenergy_ShareGPT_V3_filtered_500.json"
SHAREGPT_MAX_CHARS = 2000  # 484 of its 500 first turns: a chat then fits a 2048 context
FOLLOW_UPS = (
    "Can you explain that in more detail?",
    "Summarize your answer in three bullet points.",
    "Give one concrete example.",
)
AGENT_SYSTEM = ("You are a coding agent. Write Python code for the task. After each of your "
                "answers you get the output of running the tests on your code: fix the code "
                "until every test passes, then say in two sentences what you changed.")
AGENT_TESTS = 5  # asserts of a HumanEval task kept for its test run
RAG_SYSTEM = ("Answer the question about the document below. Be brief, and quote the "
              "document where you can.")
RAG_QUESTIONS = (
    "Summarize the document in three sentences.",
    "List the people named in the document and say in a few words who each one is.",
    "What happened, where and when? Answer in two sentences.",
    "Quote the first sentence of the document word for word.",
    "Which numbers does the document mention, and what does each one count?",
    "Write a headline for the document and a one-sentence lead.",
)
# Context sizing (``context_needed``): characters per token, below the means of
# SmolLM2's tokenizer over each of these workloads' texts, so that a session's longest
# request, rendered by the chat template, stays under the estimate in every workload;
# the template's tokens per message (role markers: 4-5 under ChatML) and the default
# system prompt it adds to a request without one.
CHARS_PER_TOKEN = 2.5
TOKENS_PER_MESSAGE = 8
TEMPLATE_TOKENS = 32
DEFAULT_CONTEXT = 2048  # the floor, and spec_bench's context (its prompts fit)


@dataclass(frozen=True)
class Workload:
    """Which sessions a run sends (validated here; ``load_sessions`` builds them)."""

    name: str = "spec_bench"  # one of WORKLOADS
    sessions: int = 16  # multiturn / agent / rag: sessions per rate
    turns: int = 4  # requests per session (MT-Bench: at most its 2; spec_bench: 1)
    documents: int = 4  # rag: documents the sessions share
    selection: SuiteSelection = field(  # spec_bench: which first turns
        default_factory=lambda: SuiteSelection(per_category=2))

    def __post_init__(self) -> None:
        if self.name not in WORKLOADS:
            raise DataError(f"unknown workload {self.name!r}; available: {', '.join(WORKLOADS)}")
        if self.sessions < 1 or self.documents < 1:
            raise DataError("--sessions and --documents must be >= 1")
        # (Workloads of one request a session ignore --turns.)
        if MAX_TURNS[self.name] > 1 and not 1 <= self.turns <= MAX_TURNS[self.name]:
            raise DataError(f"--turns must be in 1..{MAX_TURNS[self.name]} for {self.name}")

    @property
    def description(self) -> str:
        return DESCRIPTIONS[self.name]


@dataclass(frozen=True)
class Session:
    id: str  # unique within a run
    source: str  # the data: a Spec-Bench category, mt_bench, sharegpt, humaneval, mbpp, cnndm
    turns: tuple[str, ...]  # the new text of each request, in order (>= 1)
    system: str | None = None  # a system message first, when set
    history: bool = True  # requests carry the earlier turns with the server's answers
    prefix: str = ""  # put before each turn's text in its user message (rag: the document)
    # Agent workloads: the fields every request adds (tools, response_format) and the
    # item its answers are scored against (``agents.AgentTask``); None elsewhere.
    task: agents.AgentTask | None = field(default=None, repr=False, compare=False)

    def record(self) -> dict[str, Any]:
        """The session as the report keeps it (its task's fields, not its item)."""
        out = {k: getattr(self, k) for k in ("id", "source", "turns", "system", "history",
                                             "prefix")}
        if self.task is not None:
            out["fields"] = self.task.fields
        return out


def messages(s: Session, k: int, answers: Sequence[str]) -> list[dict[str, str]]:
    """The chat messages of request ``k`` (0-based) of ``s``; ``answers``: the server's
    answers to requests 0..k-1 (read only with ``s.history``)."""
    if not 0 <= k < len(s.turns) or (s.history and len(answers) < k):
        raise ValueError(f"request {k} of session {s.id!r}: no such turn or missing answers")
    out = [{"role": "system", "content": s.system}] if s.system else []
    if s.history:
        for turn, answer in zip(s.turns[:k], answers[:k], strict=True):
            out += [{"role": "user", "content": turn}, {"role": "assistant", "content": answer}]
    out.append({"role": "user", "content": s.prefix + s.turns[k]})
    return out


def load_sessions(w: Workload, seed: int, data: str | None = None) -> list[Session]:
    """``w``'s sessions in arrival order (one shuffle seeded by ``seed``, so sources mix
    over the arrivals)."""
    if w.name == "spec_bench":
        out = [Session(str(q.question_id), q.category, (q.turns[0],))
               for q in load_suite("spec_bench", w.selection, data)]
    elif w.name in agents.AGENT_WORKLOADS:
        out = [Session(sid, src, turns, system, task=task) for sid, src, turns, system, task
               in agents.sessions(w.name, w.sessions, w.turns, data)]
    else:
        root = _root(data)
        build = {"multiturn": _multiturn, "agent": _agent, "rag": _rag}[w.name]
        out = build(w, root)
    random.Random(seed).shuffle(out)
    return out


def context_needed(sessions: Sequence[Session], max_tokens: int) -> int:
    """KV positions a slot needs for the longest request of ``sessions`` and its answer:
    text at ``CHARS_PER_TOKEN`` (an over-estimate), every earlier answer at
    ``max_tokens``, the template's tokens per message; rounded up to 256."""
    def tokens(text: str) -> int:
        return math.ceil(len(text) / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE

    need = 0
    for s in sessions:
        system = tokens(s.system) if s.system else 0
        steps = 1  # requests per turn
        if s.task is not None:  # the tools (or the schema) rendered into the prompt
            system += tokens(json.dumps(s.task.fields))
            if s.task.tool_loop:  # tool steps: each answer and its results
                steps = agents.MAX_TOOL_STEPS
        for k in range(len(s.turns)):
            n = system + sum(tokens(t) for t in s.turns[:k + 1]) if s.history else (
                system + tokens(s.prefix + s.turns[k]))
            loop = s.task is not None and s.task.tool_loop
            answers = (k + 1) * steps - 1 if loop else k
            earlier = answers * (max_tokens + TOKENS_PER_MESSAGE) if s.history else 0
            if loop:
                earlier += answers * agents.RESULT_TOKENS
            need = max(need, n + earlier + max_tokens + TEMPLATE_TOKENS)
    return 256 * math.ceil(need / 256)


def default_context(w: Workload, sessions: Sequence[Session], max_tokens: int) -> int:
    """The context every server gets when ``--context`` is not given: ``DEFAULT_CONTEXT``
    for spec_bench (as before), else what the longest session needs, at least that."""
    if w.name == "spec_bench":
        return DEFAULT_CONTEXT
    return max(DEFAULT_CONTEXT, context_needed(sessions, max_tokens))


# ---- the sources ------------------------------------------------------------------------

T = TypeVar("T")


def _spread(items: Sequence[T], k: int) -> list[T]:
    """``k`` items at evenly spaced positions ``floor(i * n / k)`` (all when fewer)."""
    n = len(items)
    return list(items) if k >= n else [items[(i * n) // k] for i in range(k)]


def _halves(k: int) -> tuple[int, int]:
    return (k + 1) // 2, k // 2


def _root(data: str | None) -> Path:
    try:
        return data_dir(data)
    except DataNotFoundError as e:
        raise DataError(str(e)) from None


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise DataError(f"benchmark data file {path} is missing")
    return list(iter_records(path))


def _interleave(a: Sequence[Session], b: Sequence[Session]) -> list[Session]:
    out = [x for pair in zip(a, b, strict=False) for x in pair]
    return out + list(a[len(b):]) + list(b[len(a):])


def _multiturn(w: Workload, root: Path) -> list[Session]:
    n_mt, n_sg = _halves(w.sessions)
    mt = [Session(f"mt_bench-{q.question_id}", "mt_bench", q.turns[:w.turns])
          for q in _spread(load_suite("mt_bench", SuiteSelection(), root), n_mt)]
    chats: list[tuple[str, list[str]]] = []
    for rec in _records(root / SHAREGPT_FILE):
        human = [m["content"] for m in record_messages(rec) if m["role"] == "user"]
        if human and len(human[0]) <= SHAREGPT_MAX_CHARS:
            chats.append((str(rec.get("id", len(chats))), human))
    sg = [Session(f"sharegpt-{cid}", "sharegpt", (*human, *FOLLOW_UPS)[:w.turns])
          for cid, human in _spread(chats, n_sg)]
    return _interleave(mt, sg)


@dataclass(frozen=True)
class _Task:
    source: str
    id: str
    prompt: str  # the task as the first user message
    function: str  # the function under test
    asserts: tuple[str, ...]  # its tests, one assert each (>= 1)


def _agent(w: Workload, root: Path) -> list[Session]:
    n_he, n_mb = _halves(w.sessions)
    he = [_agent_session(t, w.turns) for t in _spread(_humaneval(root), n_he)]
    mb = [_agent_session(t, w.turns) for t in _spread(_mbpp(root), n_mb)]
    return _interleave(he, mb)


def _humaneval(root: Path) -> list[_Task]:
    out = []
    for r in _records(root / "humaneval" / "HumanEval.jsonl.gz"):
        fn = str(r["entry_point"])
        asserts = tuple(line.strip().replace("candidate(", f"{fn}(")
                        for line in str(r["test"]).splitlines()
                        if line.strip().startswith("assert"))[:AGENT_TESTS]
        prompt = ("Complete the following Python function. Return the whole function.\n\n"
                  f"```python\n{r['prompt']}```")
        out.append(_Task("humaneval", str(r["task_id"]), prompt, fn, asserts or ("assert True",)))
    return out


def _mbpp(root: Path) -> list[_Task]:
    out = []
    for r in _records(root / "mbpp" / "mbpp.jsonl"):
        if not 11 <= int(r["task_id"]) <= 510:  # the standard test split (as common/suites.py)
            continue
        asserts = tuple(str(t).strip() for t in r["test_list"]) or ("assert True",)
        # The function under test: the first one the first assert calls that the
        # reference code defines (asserts wrap it in set(), math.isclose(), ...).
        defined = re.findall(r"def\s+(\w+)\s*\(", str(r["code"]))
        called = [f for f in re.findall(r"([A-Za-z_]\w*)\s*\(", asserts[0]) if f in defined]
        fn = called[0] if called else (defined[-1] if defined else "solution")
        prompt = f"{r['text']}\nYour code should pass these tests:\n\n" + "\n".join(asserts)
        out.append(_Task("mbpp", str(r["task_id"]), prompt, fn, asserts))
    return out


def tool_results(function: str, asserts: Sequence[str]) -> tuple[str, str, str]:
    """What the agent's test runs print after its 1st, 2nd and 3rd answer: the first test
    failing, then the last one, then all passing (pytest's quiet format)."""
    n = len(asserts)
    head = f"Tool result (run_tests):\n$ python -m pytest -q test_{function}.py\n"

    def failing(i: int) -> str:
        dots = "".join("F" if j == i else "." for j in range(n))
        return (f"{head}{dots}\nFAILED test_{function}.py::test_{i + 1} - AssertionError\n"
                f"    {asserts[i]}\n1 failed, {n - 1} passed in 0.02s")

    return failing(0), failing(n - 1), f"{head}{'.' * n}\n{n} passed in 0.02s"


def _agent_session(t: _Task, turns: int) -> Session:
    steps = (t.prompt, *tool_results(t.function, t.asserts))
    return Session(f"{t.source}-{t.id}", t.source, steps[:turns], system=AGENT_SYSTEM)


def rag_questions(article: str) -> tuple[str, ...]:
    """The questions asked about one document: ``RAG_QUESTIONS``, then one per name it
    mentions (a run of capitalised words not opening a sentence, 4+ characters), in
    order of first mention, so that its readers ask different ones."""
    names: dict[str, None] = {}
    for m in re.finditer(r"(?<=[a-z,;] )[A-Z][\w'-]*(?: [A-Z][\w'-]*)*", article):
        if len(m.group()) >= 4:
            names.setdefault(m.group())
    return (*RAG_QUESTIONS, *(f"What does the document say about {n}?" for n in names))


def _rag(w: Workload, root: Path) -> list[Session]:
    # Rows come in pairs, with and without the article (as suites._cnndm): keep those with.
    arts = [r for r in _records(root / "cnn_dailymail" / "cad_cnndm_1_0.jsonl")
            if r.get("assigned_weight") == 1]
    docs = _spread(arts, w.documents)
    out = []
    for i in range(w.sessions):
        d, j = i % len(docs), i // len(docs)  # session i is the j-th reader of document d
        art = docs[d]
        qs = rag_questions(str(art["article"]))
        # Reader j asks the next `turns` questions after reader j - 1's (cycling).
        asks = tuple(qs[(j * w.turns + k) % len(qs)] for k in range(w.turns))
        out.append(Session(f"rag-{art['input_index']}-{j}", "cnndm",
                           tuple(f"Question: {q}" for q in asks), system=RAG_SYSTEM,
                           history=False, prefix=f"Document:\n{art['article']}\n\n"))
    return out
