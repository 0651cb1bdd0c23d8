"""server/tool_grammar.py: the call grammars compile in llguidance on SmolLM2's
tokenizer, accept the calls of the request's tools in each family's syntax, reject any
other name, schema or spacing, and what they accept parses back into those calls."""

from __future__ import annotations

import json
from typing import Any

import llguidance  # (a pinned runtime dependency: imported, never skipped)
import numpy as np
import pytest

from recallspec.decoding.masks import GUIDE_KINDS, Guide, allowed
from recallspec.errors import DataError
from recallspec.models.tokenizer import Tokenizer
from recallspec.server.tool_calls import (
    TOOL_FAMILIES,
    ToolChoice,
    ToolChoiceMode,
    ToolFamily,
    parse_tool_calls,
    validate_tools,
)
from recallspec.server.tool_grammar import (
    FAMILY_MARKERS,
    call_schema,
    special_marker_ids,
    tool_grammar,
    tool_guide,
)

TOOLS = validate_tools([
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "now"}},
])


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    from recallspec.models.loader import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="module")
def lltok(tok: Tokenizer) -> Any:
    return llguidance.LLTokenizer(tok._tok.to_str(), n_vocab=tok.vocab_size,
                                  eos_token=tok.eos_token_id)


def matcher(lltok: Any, grammar: str) -> Any:
    ok, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, lltok)
    assert not ok and not messages, messages
    m = llguidance.LLMatcher(lltok, grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    return m


def walk(tok: Tokenizer, lltok: Any, grammar: str, ids: list[int]) -> int | None:
    """Feed ``ids`` then EOS to a fresh matcher, checking each token's mask bit before
    consuming it (a forbidden consume would poison the matcher): the index of the first
    forbidden token, or None when all are allowed."""
    m = matcher(lltok, grammar)
    assert tok.eos_token_id is not None
    for k, t in enumerate([*ids, tok.eos_token_id]):
        mask = np.frombuffer(m.compute_bitmask(), dtype=np.int32)
        if not allowed(mask, t):
            return k
        assert m.consume_token(t), m.get_error()
    assert m.is_accepting() or m.is_stopped()
    return None


def accepts(tok: Tokenizer, lltok: Any, grammar: str, text: str) -> bool:
    return walk(tok, lltok, grammar, tok.encode(text)) is None


def rejected_at(tok: Tokenizer, lltok: Any, grammar: str, text: str) -> str | None:
    """The text accepted before the first forbidden token, None if all is accepted."""
    ids = tok.encode(text)
    k = walk(tok, lltok, grammar, ids)
    return None if k is None else tok.decode(ids[:k])


def call(family: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    key = "parameters" if family == "llama3" else "arguments"
    return {"name": name, key: args}


def output(family: str, calls: list[tuple[str, dict[str, Any]]]) -> str:
    """Model output holding ``calls`` in ``family``'s syntax, compact JSON as tojson writes."""
    objs = [call(family, n, a) for n, a in calls]
    if family == "hermes":
        return "\n".join(f"<tool_call>\n{json.dumps(o)}\n</tool_call>" for o in objs)
    if family == "mistral":
        return "[TOOL_CALLS]" + json.dumps([{**o, "id": f"abcdefgh{i}"}
                                            for i, o in enumerate(objs)])
    if family == "llama3":
        assert len(objs) == 1
        return json.dumps(objs[0])
    if family == "harmony":  # one call a turn (<|call|>, an EOS, ends it); as the template
        assert len(calls) == 1
        name, args = calls[0]
        return (f" to=functions.{name}<|channel|>commentary json<|message|>"
                + json.dumps(args))
    return json.dumps({"tool_calls": objs})


PARIS: tuple[str, dict[str, Any]] = ("get_weather", {"city": "Paris"})
SUM: tuple[str, dict[str, Any]] = ("add", {"a": 2, "b": 3})


@pytest.mark.parametrize("family", TOOL_FAMILIES)
@pytest.mark.parametrize("mode", ["auto", "required"])
def test_grammar_accepts_valid_calls_and_parses_back(tok: Tokenizer, lltok: Any,
                                                     family: ToolFamily, mode: str) -> None:
    grammar = tool_grammar(TOOLS, ToolChoice(mode), family=family)  # type: ignore[arg-type]
    assert grammar is not None
    cases: list[list[tuple[str, dict[str, Any]]]] = [[PARIS], [SUM], [("now", {})], [PARIS, SUM]]
    for calls in cases:
        if family in ("llama3", "harmony") and len(calls) > 1:
            continue  # one call a turn
        text = output(family, calls)
        assert rejected_at(tok, lltok, grammar, text) is None, text
        parsed = parse_tool_calls(family, text)
        assert parsed.content is None
        assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == calls


@pytest.mark.parametrize("family", TOOL_FAMILIES)
@pytest.mark.parametrize("mode", ["auto", "required"])
def test_grammar_rejects_unknown_names_and_bad_arguments(tok: Tokenizer, lltok: Any,
                                                         family: ToolFamily, mode: str) -> None:
    grammar = tool_grammar(TOOLS, ToolChoice(mode), family=family)  # type: ignore[arg-type]
    assert grammar is not None
    good = output(family, [PARIS])
    bad_name = good.replace("get_weather", "get_wether")
    prefix = rejected_at(tok, lltok, grammar, bad_name)
    assert prefix is not None and bad_name.startswith(prefix)
    name_at = good.index("get_weather" if family == "harmony" else '"name"')
    assert len(prefix) > name_at  # refused within the name
    for bad in (good.replace('"Paris"', "7"),  # the schema's type
                good.replace('"city": "Paris"', '"town": "Paris"'),  # an unknown property
                good.replace('": "', '":"'),  # not compact as tojson writes it
                good.replace('{"city": "Paris"}', "{}")):  # a required property missing
        assert rejected_at(tok, lltok, grammar, bad) is not None, bad


@pytest.mark.parametrize("family", ["hermes", "mistral", "llama3"])
def test_auto_leaves_text_free(tok: Tokenizer, lltok: Any, family: ToolFamily) -> None:
    auto = tool_grammar(TOOLS, ToolChoice("auto"), family=family)
    required = tool_grammar(TOOLS, ToolChoice("required"), family=family)
    assert auto is not None and required is not None
    for text in ("Hello there! <tool and [TOOL, but no call.", "", "Line one\nline two"):
        assert accepts(tok, lltok, auto, text)
        assert not accepts(tok, lltok, required, text) or text == ""
    assert rejected_at(tok, lltok, required, "Hello") == ""


@pytest.mark.parametrize("family", ["hermes", "mistral"])
def test_auto_text_then_a_call(tok: Tokenizer, lltok: Any, family: ToolFamily) -> None:
    grammar = tool_grammar(TOOLS, ToolChoice("auto"), family=family)
    assert grammar is not None
    call_text = output(family, [PARIS])
    text = "Let me check.\n" + call_text
    assert accepts(tok, lltok, grammar, text)
    parsed = parse_tool_calls(family, text)
    assert parsed.content == "Let me check."
    assert [c.name for c in parsed.calls] == ["get_weather"]
    # once the trigger is written the call grammar holds: a wrong name, or more text
    # after the call, is refused
    bad = "Let me check.\n" + call_text.replace("get_weather", "get_wether")
    assert rejected_at(tok, lltok, grammar, bad) is not None
    assert rejected_at(tok, lltok, grammar, text + " Done.") is not None


def test_llama3_auto_trigger_is_the_first_brace(tok: Tokenizer, lltok: Any) -> None:
    grammar = tool_grammar(TOOLS, ToolChoice("auto"), family="llama3")
    assert grammar is not None
    assert accepts(tok, lltok, grammar, 'The JSON {"a": 1} is text here.')
    assert not accepts(tok, lltok, grammar, '{"a": 1}')
    assert not accepts(tok, lltok, grammar, '  {"name": "get_weather"')


def test_generic_auto_allows_a_response(tok: Tokenizer, lltok: Any) -> None:
    auto = tool_grammar(TOOLS, ToolChoice("auto"), family="generic")
    required = tool_grammar(TOOLS, ToolChoice("required"), family="generic")
    assert auto is not None and required is not None
    text = json.dumps({"response": 'Hi "there"\nSecond line'})
    assert accepts(tok, lltok, auto, text)
    assert parse_tool_calls("generic", text).content == 'Hi "there"\nSecond line'
    assert not accepts(tok, lltok, required, text)
    assert not accepts(tok, lltok, auto, "Plain text")
    assert not accepts(tok, lltok, auto, '{"tool_calls": []}')


@pytest.mark.parametrize("family", TOOL_FAMILIES)
def test_parallel_tool_calls(tok: Tokenizer, lltok: Any, family: ToolFamily) -> None:
    if family in ("llama3", "harmony"):
        return  # one call a turn whatever parallel_tool_calls says
    one = tool_grammar(TOOLS, ToolChoice("required"), family=family,
                       parallel_tool_calls=False)
    many = tool_grammar(TOOLS, ToolChoice("required"), family=family)
    assert one is not None and many is not None
    two = output(family, [PARIS, SUM])
    assert accepts(tok, lltok, many, two)
    assert not accepts(tok, lltok, one, two)
    assert accepts(tok, lltok, one, output(family, [SUM]))


@pytest.mark.parametrize("family", TOOL_FAMILIES)
def test_named_function(tok: Tokenizer, lltok: Any, family: ToolFamily) -> None:
    grammar = tool_grammar(TOOLS, ToolChoice("function", "add"), family=family)
    assert grammar is not None
    assert accepts(tok, lltok, grammar, output(family, [SUM]))
    assert not accepts(tok, lltok, grammar, output(family, [PARIS]))
    assert not accepts(tok, lltok, grammar, "Sure.")


def test_forced_bytes(lltok: Any) -> None:
    """Compact JSON forces everything but the values: after the trigger, a one-tool
    grammar forces the call up to its first argument's value."""
    grammar = tool_grammar(TOOLS, ToolChoice("function", "get_weather"), family="hermes")
    assert grammar is not None
    m = matcher(lltok, grammar)
    assert m.compute_ff_bytes() == b'<tool_call>\n{"name": "get_weather", "arguments": {"city": "'


def test_special_token_markers(tok: Tokenizer, lltok: Any) -> None:
    """Markers that are special tokens are token references: the token, not its text."""
    # SmolLM2 has no <tool_call> token: stand two of its special tokens in for the markers
    special = {"<tool_call>": 11, "</tool_call>": 12}
    assert all(lltok.is_special_token(i) for i in special.values())
    modes: tuple[ToolChoiceMode, ...] = ("auto", "required")
    for mode in modes:
        grammar = tool_grammar(TOOLS, ToolChoice(mode), family="hermes",
                               special_tokens=special)
        assert grammar is not None and "<[11]>" in grammar and "<[12]>" in grammar
        body = tok.encode("\n" + json.dumps(call("hermes", *PARIS)) + "\n")
        ids = [11, *body, 12]
        assert walk(tok, lltok, grammar, ids) is None
        if mode == "required":  # the markers' text is no call (under "auto", free text)
            assert walk(tok, lltok, grammar, tok.encode(output("hermes", [PARIS]))) is not None
        else:
            assert walk(tok, lltok, grammar, tok.encode("Hi ") + ids) is None
    markers: tuple[tuple[ToolFamily, str], ...] = (
        ("mistral", "[TOOL_CALLS]"), ("llama3", "<|python_tag|>"))
    for family, marker in markers:
        grammar = tool_grammar(TOOLS, ToolChoice("auto"), family=family,
                               special_tokens={marker: 11})
        assert grammar is not None and "<[11]>" in grammar
        rest = output(family, [PARIS]).removeprefix("[TOOL_CALLS]")
        assert walk(tok, lltok, grammar, [11, *tok.encode(rest)]) is None


def test_special_marker_ids() -> None:
    ids = {"<tool_call>": 5, "[TOOL_CALLS]": 6}
    assert special_marker_ids("hermes", ids.get) == {"<tool_call>": 5}
    assert special_marker_ids("mistral", ids.get) == {"[TOOL_CALLS]": 6}
    assert special_marker_ids("generic", ids.get) == {}
    assert special_marker_ids("harmony", {"<|channel|>": 7, "<|call|>": 8}.get) == {
        "<|channel|>": 7}  # (<|call|> ends the turn: an EOS, never in the grammar)
    assert set(FAMILY_MARKERS) == set(TOOL_FAMILIES)


def test_tool_guide() -> None:
    assert "llguidance" in GUIDE_KINDS
    assert tool_guide(TOOLS, ToolChoice("none"), family="hermes") is None
    guide = tool_guide(TOOLS, ToolChoice("auto"), family="hermes")
    assert guide == Guide("llguidance", tool_grammar(TOOLS, ToolChoice("auto"),
                                                     family="hermes") or "")
    assert guide is not None and guide.source.startswith("%llguidance {}\n")
    # equal requests give equal guides (the compiled-grammar cache's key)
    again = tool_guide(validate_tools([t.to_openai() for t in TOOLS]), ToolChoice("auto"),
                       family="hermes")
    assert again == guide and hash(again) == hash(guide)
    with pytest.raises(DataError, match="not among the tools"):
        tool_guide(TOOLS, ToolChoice("function", "missing"), family="hermes")
    with pytest.raises(DataError, match="needs tools"):
        tool_guide((), ToolChoice("required"), family="hermes")
    huge = validate_tools([{"type": "function", "function": {"name": f"t{i}", "parameters": {
        "type": "object", "description": "x" * 2000}}} for i in range(100)])
    with pytest.raises(DataError, match="bytes, over the"):
        tool_guide(huge, ToolChoice("auto"), family="hermes")


def test_call_schema_orders_name_first() -> None:
    schema = call_schema(TOOLS[:2])
    assert [list(o["properties"]) for o in schema["anyOf"]] == [["name", "arguments"]] * 2
    assert schema["anyOf"][0]["properties"]["name"] == {"const": "get_weather"}
    single = call_schema(TOOLS[2:], arguments_key="parameters")
    assert single["properties"] == {"name": {"const": "now"},
                                    "parameters": {"type": "object"}}
    assert single["required"] == ["name", "parameters"]
