"""The tool-call parsers' tests' common pieces: a parse with counted ids, and a stream
whose deltas are checked against the delta protocol and added up (content, reasoning
and calls each from their own deltas only)."""

from __future__ import annotations

import itertools
from typing import Any

from recallspec.server.tool_calls import (
    ContentDelta,
    ParsedOutput,
    ReasoningDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStream,
    ToolFamily,
    parse_tool_calls,
)


def counter_ids() -> Any:
    c = itertools.count()
    return lambda: f"id{next(c)}"


def parse(family: ToolFamily, text: str) -> ParsedOutput:
    return parse_tool_calls(family, text, new_id=counter_ids())


def stream(family: ToolFamily, pieces: list[str]) -> tuple[ParsedOutput, ParsedOutput]:
    """The stream's own result, and the result its deltas add up to (checking the delta
    protocol: a header with an id, name and "" first, then fragments)."""
    s = ToolCallStream(family, new_id=counter_ids())
    events = [e for p in pieces for e in s.feed(p)] + s.finish()
    content = reasoning = ""
    calls: list[list[str]] = []
    for e in events:
        if isinstance(e, ContentDelta):
            assert e.text
            content += e.text
        elif isinstance(e, ReasoningDelta):
            assert e.text and family == "harmony"  # (the only family with reasoning)
            reasoning += e.text
        else:
            assert isinstance(e, ToolCallDelta)
            if e.id is not None:
                assert e.index == len(calls) and e.arguments == "" and e.name
                calls.append([e.id, e.name, ""])
                assert e.to_openai() == {"index": e.index, "id": e.id, "type": "function",
                                         "function": {"name": e.name, "arguments": ""}}
            else:
                assert e.index == len(calls) - 1 and e.arguments
                assert e.to_openai() == {"index": e.index,
                                         "function": {"arguments": e.arguments}}
                calls[-1][2] += e.arguments
    added = ParsedOutput(content or None, tuple(ToolCall(*c) for c in calls),
                         reasoning or None)
    return s.result(), added


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in itertools.pairwise([0, *points, len(text)])]
