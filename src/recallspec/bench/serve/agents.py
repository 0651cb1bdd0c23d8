"""The tool-call and structured-output workloads of ``recallspec bench serve``: their
sessions (from ``agent_data.py``), what each request adds to its body, and how an
answer is scored.

* ``extract``: one request per session, a CNN/DailyMail article to extract facts from
  under ``response_format`` json_schema (``agent_data.EXTRACTION_SCHEMA``); valid when
  the text parses and fits the schema.
* ``bfcl``: one request per session, a BFCL v4 single-turn question (simple_python,
  multiple, parallel, parallel_multiple, in turn) with its functions as ``tools``;
  every such question is answered by calls, so ``tool_choice`` is "required", with
  ``parallel_tool_calls`` true for the parallel categories only (a small model asked
  for calls repeats its call while parallel calls are allowed); valid when the calls
  pass BFCL's AST check.
* ``bfcl_multiturn``: a BFCL multi_turn_base conversation: each user turn, then while
  the answer calls tools (at most ``MAX_TOOL_STEPS`` requests a turn), the calls are
  executed on BFCL's API classes and their results sent back as ``role: "tool"``
  messages with the transcript; a turn's first request has ``tool_choice`` "required",
  the later ones "auto" (a text answer ends the turn), one call a request; valid when
  the whole conversation passes BFCL's multi-turn check (the session's last record
  carries the verdict).

Every request carries the same fields on every server (``fields``), so the targets
differ only in how they compute the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from recallspec.bench.serve import agent_data as ad

AGENT_WORKLOADS = ("extract", "bfcl", "bfcl_multiturn")
SINGLE_TURN = ("simple_python", "multiple", "parallel", "parallel_multiple")
MAX_TOOL_STEPS = 4  # requests per user turn of bfcl_multiturn (the plan's bound)
RESULT_TOKENS = 256  # context sizing: tokens of one step's tool results, at most (cut to it)
RESULT_CHARS = 600  # a tool result longer than this is cut (BFCL's file listings can be long)
AGENT_MAX_TURNS = {"extract": 1, "bfcl": 1, "bfcl_multiturn": 4}
DESCRIPTIONS = {
    "extract": "JSON-schema extraction (response_format json_schema) over CNN/DailyMail "
               "articles, one request per session",
    "bfcl": "BFCL v4 single-turn tool calls (simple, multiple, parallel, parallel multiple; "
            "tools, tool_choice required), one request per session",
    "bfcl_multiturn": "BFCL v4 multi-turn conversations: the calls executed on BFCL's API "
                      f"classes and fed back as tool messages, <= {MAX_TOOL_STEPS} requests "
                      "a user turn",
}


@dataclass(frozen=True)
class AgentTask:
    """What a session of an agent workload needs beyond its turns."""

    fields: dict[str, Any]  # added to every request body (tools, response_format, ...)
    item: ad.BfclItem | None = None  # bfcl / bfcl_multiturn: the question and its answers

    @property
    def tool_loop(self) -> bool:
        """Whether its calls are executed and fed back (bfcl_multiturn)."""
        return self.item is not None and self.item.multi_turn


def sessions(workload: str, n: int, turns: int, data: str | None
             ) -> list[tuple[str, str, tuple[str, ...], str | None, AgentTask]]:
    """``n`` sessions of ``workload``: (id, source, user turns, system, task)."""
    out: list[tuple[str, str, tuple[str, ...], str | None, AgentTask]] = []
    if workload == "extract":
        for ex in ad.extraction_items(n, data):
            system = next((m["content"] for m in ex.messages if m["role"] == "system"), None)
            user = tuple(m["content"] for m in ex.messages if m["role"] == "user")
            out.append((ex.id, "cnndm", user, system,
                        AgentTask({"response_format": ad.EXTRACTION_RESPONSE_FORMAT})))
        return out
    if workload == "bfcl":
        per = [len(range(i, n, len(SINGLE_TURN))) for i in range(len(SINGLE_TURN))]
        for cat, k in zip(SINGLE_TURN, per, strict=True):
            for it in ad.load_bfcl(cat, k) if k else []:
                out.append((it.id, cat, (_text(it.messages),), None, _tools(it)))
        return out
    if workload == "bfcl_multiturn":
        for it in ad.load_bfcl("multi_turn_base", n):
            user = tuple(_text(t) for t in it.messages)[:turns]
            out.append((it.id, "multi_turn_base", user, None, _tools(it)))
        return out
    raise ValueError(f"not an agent workload: {workload!r}")


def _tools(it: ad.BfclItem) -> AgentTask:
    parallel = it.category in ("parallel", "parallel_multiple")
    return AgentTask({"tools": it.tools, "tool_choice": "required",
                      "parallel_tool_calls": parallel}, it)


def step_fields(fields: dict[str, Any], step: int) -> dict[str, Any]:
    """A ``bfcl_multiturn`` request's fields at ``step`` of its user turn."""
    return {**fields, "tool_choice": "required" if step == 0 else "auto"}


def _text(messages: Sequence[Any]) -> str:
    """A turn's user messages as one text."""
    return "\n".join(m["content"] for m in messages if m.get("role") == "user")


def score_single(workload: str, task: AgentTask, text: str,
                 calls: Sequence[tuple[str, str]]) -> tuple[bool, str]:
    """Whether one answer of ``extract`` / ``bfcl`` is valid, and why not."""
    if workload == "extract":
        ok = ad.valid_extraction(text)
        return ok, "" if ok else "not schema-valid JSON"
    assert task.item is not None
    if not calls:
        return False, "no tool call"
    return ad.check_call(list(calls), task.item)


def score_multi_turn(task: AgentTask, turns: Sequence[Sequence[tuple[str, str]]]
                     ) -> tuple[bool, str]:
    """BFCL's multi-turn verdict on the calls of each user turn."""
    assert task.item is not None
    return ad.check_multi_turn(turns, task.item)


def new_env(task: AgentTask) -> ad.MultiTurnEnv:
    assert task.item is not None
    return ad.MultiTurnEnv(task.item)
