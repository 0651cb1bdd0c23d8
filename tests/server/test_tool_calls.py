"""server/tool_calls.py: tool validation, template families and support, the shipped
ChatML template, and the call parsers (whole and streamed) of every family."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from helpers.tool_stream import counter_ids, parse, split, stream
from hypothesis import given, settings
from hypothesis import strategies as st

from recallspec.errors import DataError
from recallspec.models.tokenizer import Tokenizer
from recallspec.server.tool_calls import (
    MAX_TOOLS,
    PROBE_TOOL_NAME,
    TOOL_FAMILIES,
    ContentDelta,
    ParsedOutput,
    ToolCall,
    ToolCallDelta,
    ToolCallStream,
    ToolChoice,
    ToolChoiceMode,
    ToolFamily,
    detect_family,
    needs_descriptions,
    new_call_id,
    new_mistral_call_id,
    parse_tool_calls,
    shipped_template,
    supports_tools,
    validate_tool_choice,
    validate_tools,
)

# ---- families ------------------------------------------------------------------------------

QWEN_LIKE = ('{%- if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}'
             '{{ "<tool_call>\\n" }}')
LLAMA31_LIKE = '{{- "<|python_tag|>" + tool_call.name }}<|eom_id|><|eot_id|>'
LLAMA32_LIKE = ('Respond in the format {"name": function name, "parameters": dictionary}.'
                '{{- "<|eot_id|>" }}')
MISTRAL_LIKE = '{{- "[AVAILABLE_TOOLS]" }}{{- "[TOOL_CALLS]" }}'
GPT_OSS_LIKE = ('{{- "<|start|>assistant to=functions." + tool_call.name + '
                '"<|channel|>commentary json<|message|>" }}')


@pytest.mark.parametrize("source, family", [
    (QWEN_LIKE, "hermes"), (LLAMA31_LIKE, "llama3"), (LLAMA32_LIKE, "llama3"),
    (MISTRAL_LIKE, "mistral"), (GPT_OSS_LIKE, "harmony"), ("{{ messages }}", "generic"),
    (None, "generic"),
    ('"parameters" without the turn end', "generic"),
])
def test_detect_family(source: str | None, family: str) -> None:
    assert detect_family(source) == family


def test_detect_family_of_real_templates(smollm: Tokenizer) -> None:
    assert detect_family(smollm.chat_template) == "generic"
    assert detect_family(shipped_template()) == "hermes"


# ---- ids -------------------------------------------------------------------------------------

def test_ids() -> None:
    ids = {new_call_id() for _ in range(50)}
    assert len(ids) == 50 and all(re.fullmatch(r"call_[0-9a-f]{24}", i) for i in ids)
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", new_mistral_call_id()) for _ in range(50))
    # the default factory per family
    hermes = parse_tool_calls("hermes", '<tool_call>\n{"name": "f", "arguments": {}}\n'
                                        '</tool_call>')
    mistral = parse_tool_calls("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {}, '
                                          '"id": "abcdefghi"}]')
    assert re.fullmatch(r"call_[0-9a-f]{24}", hermes.calls[0].id)
    # the model's own id is read over: the stream sends an id before the model writes it
    assert re.fullmatch(r"[A-Za-z0-9]{9}", mistral.calls[0].id)


# ---- parsers per family ----------------------------------------------------------------------

WEATHER = '{"city": "Paris", "days": [1, 2], "opts": {"unit": "C}"}}'


@pytest.mark.parametrize("family, text, content, calls", [
    ("hermes", f'<tool_call>\n{{"name": "get_weather", "arguments": {WEATHER}}}\n</tool_call>',
     None, [("get_weather", WEATHER)]),
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
               '<tool_call>\n{"name": "b.c-d", "arguments": {"x": "<tool_call>"}}\n'
               '</tool_call>',
     "Let me look.", [("a", "{}"), ("b.c-d", '{"x": "<tool_call>"}')]),
    ("hermes", '<tool_call>{"name":"a","arguments":{"k":1}}</tool_call>', None,
     [("a", '{"k":1}')]),
    ("hermes", '<tool_call>\n{"name": "a", "arguments": {}}', None, [("a", "{}")]),
    ("hermes", "just text, <tool_ and no call", "just text, <tool_ and no call", []),
    ("hermes", "", None, []),
    ("llama3", f'{{"name": "get_weather", "parameters": {WEATHER}}}', None,
     [("get_weather", WEATHER)]),
    ("llama3", '<|python_tag|>{"type": "function", "name": "a", "parameters": {"x": 1}}; '
               '{"name": "b", "arguments": {}}', None, [("a", '{"x": 1}'), ("b", "{}")]),
    ("llama3", "  \n" + '{"name": "a", "parameters": {}}', None, [("a", "{}")]),
    ("llama3", 'The answer is {"name": "a", "parameters": {}}',
     'The answer is {"name": "a", "parameters": {}}', []),
    ("mistral", f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {WEATHER}, '
                f'"id": "abcDEF123"}}]', None, [("get_weather", WEATHER)]),
    ("mistral", 'Sure.[TOOL_CALLS] [{"name": "a", "arguments": {}}, {"name": "b", '
                '"arguments": {"y": [true, null]}, "id": "zzzzzzzzz"}]',
     "Sure.", [("a", "{}"), ("b", '{"y": [true, null]}')]),
    ("generic", f'{{"tool_calls": [{{"name": "get_weather", "arguments": {WEATHER}}}, '
                f'{{"name": "b", "arguments": {{}}}}]}}', None,
     [("get_weather", WEATHER), ("b", "{}")]),
    ("generic", '{"response": "Hi \\"you\\"\\n\\u00e9\\ud83d\\ude00"}',
     'Hi "you"\n\u00e9\U0001f600', []),
    ("generic", "not JSON at all", "not JSON at all", []),
])
def test_parse(family: ToolFamily, text: str, content: str | None,
               calls: list[tuple[str, str]]) -> None:
    out = parse(family, text)
    assert out.content == content
    assert [(c.name, c.arguments) for c in out.calls] == calls
    assert [c.id for c in out.calls] == [f"id{i}" for i in range(len(calls))]
    for c in out.calls:
        assert isinstance(json.loads(c.arguments), dict)
        assert c.to_openai() == {"id": c.id, "type": "function",
                                 "function": {"name": c.name, "arguments": c.arguments}}
    # the stream, one character at a time, gives the same
    got, added = stream(family, list(text))
    assert got == added == out


@pytest.mark.parametrize("family, text", [
    ("hermes", 'Hi <tool_call>\n{"name": "a", "arguments": {"k": tru}}\n</tool_call> there'),
    ("hermes", '<tool_call>\n{"name": 5, "arguments": {}}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"arguments": {}, "name": "a"}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "a", "arguments": [1]}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "a", "arguments": {"k": 1}'),  # cut off
    ("hermes", '<tool_call>\n{"name": "a", "arguments": {"k": 1} x\n</tool_call>'),
    ("llama3", '{"name": "a", "parameters": {"k": }}'),
    ("llama3", '{"name": "a", "parameters": {"k": 1}'),
    ("mistral", '[TOOL_CALLS][{"name": "a", "arguments": {"k" 1}}]'),
    ("generic", '{"tool_calls": [{"name": "a", "arguments": {,}}]}'),
    ("generic", '{"tool_calls": [{"name": "a"}]}'),
    ("harmony", ' to=functions.a<|channel|>commentary json<|message|>{"k": tru}<|call|>'),
    ("harmony", ' to=functions.a<|channel|>commentary json<|message|>[1]<|call|>'),
    ("harmony", ' to=functions.a<|channel|>commentary json<|message|>{"k": 1'),  # cut off
    ("harmony", ' to=functions.a<|channel|>commentary json<|message|>{"k": 1} x<|call|>'),
    ("harmony", ' to=functions.a<|channel|>commentary json<|message|>'),  # no arguments
    ("harmony", ' to=functions.<|channel|>commentary json<|message|>{}'),  # no name
    ("harmony", ' to=functions.a<|channel|>final<|message|>{}'),  # not a call's channel
    ("harmony", '<|channel|>commentary to=functions.a<|constrain|>json'),  # cut off
])
def test_invalid_calls_stay_content(family: ToolFamily, text: str) -> None:
    assert parse(family, text) == ParsedOutput(text, ())


def test_invalid_second_call_keeps_the_first() -> None:
    out = parse("mistral", '[TOOL_CALLS][{"name": "a", "arguments": {}}, '
                           '{"name": "b", "arguments": {oops}}]')
    assert [c.name for c in out.calls] == ["a"]
    assert out.content == ', {"name": "b", "arguments": {oops}}]'
    out = parse("hermes", '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
                          '<tool_call>\n{"name": "b", "arguments": {oops}}\n</tool_call>')
    assert [c.name for c in out.calls] == ["a"]
    assert out.content == '<tool_call>\n{"name": "b", "arguments": {oops}}\n</tool_call>'


def test_stream_holds_back_a_possible_trigger() -> None:
    s = ToolCallStream("hermes", new_id=counter_ids())
    assert s.feed("Hi <tool") == [ContentDelta("Hi")]
    assert s.feed("box>") == [ContentDelta(" <toolbox>")]
    assert s.feed("\n<tool_call>\n{\"na") == []  # whitespace before a call is held back
    assert s.feed('me": "f", "arguments": {"a"') == [
        ToolCallDelta(0, "", "id0", "f"), ToolCallDelta(0, '{"a"')]
    assert s.feed(': 1}}\n</tool_call>') == [ToolCallDelta(0, ": 1}")]
    assert s.finish() == []
    assert s.calls == (ToolCall("id0", "f", '{"a": 1}'),)
    assert s.result().content == "Hi <toolbox>"
    with pytest.raises(ValueError):
        s.feed("more")


def test_stream_break_after_the_header() -> None:
    """A call that breaks once its header went out stays, cut short; the rest is content
    (the whole-text parse has it all as content)."""
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1} nope'
    got, added = stream("hermes", [text])
    assert got == added
    assert got.calls == (ToolCall("id0", "f", '{"a": 1}'),)
    assert got.content == " nope"
    assert parse("hermes", text) == ParsedOutput(text, ())


@pytest.mark.parametrize("family, text", [
    ("hermes", "word <tool " * 900 + '\n<tool_call>\n{"name": "f", "arguments": {"a": "'
     + "x" * 9000 + '"}}\n</tool_call>\n<tool_call>\n{"name": "g", "arguments": {}}'),
    ("mistral", "[TOOL " * 1500 + '[TOOL_CALLS][{"name": "f", "arguments": {}}]'),
    ("generic", '{"response": "' + "line\\n\\u00e9 " * 2000 + '"}'),
    ("llama3", "plain " * 2000),
    ("harmony", "<|channel|>analysis<|message|>" + "thinking <|en " * 900 + "<|end|>"
     "<|start|>assistant<|channel|>commentary<|message|>" + "preamble <| " * 900 + "<|end|>"
     '<|start|>assistant<|channel|>commentary to=functions.f json<|message|>{"a": "'
     + "x" * 9000 + '"}<|call|><|start|>assistant to=functions.g<|channel|>analysis'
     "<|message|>{}"),
])
def test_long_outputs_stream_the_same(family: ToolFamily, text: str) -> None:
    """The stream drops the text it has decided (past a few KiB) and still adds up."""
    whole = parse(family, text)
    assert whole.calls or family in ("generic", "llama3")
    got, added = stream(family, [text[i:i + 3] for i in range(0, len(text), 3)])
    assert got == added == whole


# ---- streaming equals the whole parse (random splits) ---------------------------------------

NAMES = st.from_regex(r"[A-Za-z0-9_.-]{1,12}", fullmatch=True)
SCALARS = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(
    allow_nan=False, allow_infinity=False, width=32) | st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8) | \
    st.sampled_from(['"}', "<tool_call>", "\\", "[TOOL_CALLS]", "]}", "\n"])
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=5), inner, max_size=3), max_leaves=8)
ARGS = st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=4)
# content that holds near-triggers but no whole one
CONTENT = st.lists(st.sampled_from(
    ["Hi", " ", "\n", "<", "<tool", "<tool_call", "[TOOL", "[TOOL_CALLS", "{", '"', "é", "x"]),
    max_size=8).map("".join)
DUMPS = st.sampled_from([{}, {"separators": (",", ":")}, {"ensure_ascii": False},
                         {"indent": 1}])


def _render(family: str, content: str, calls: list[tuple[str, str]], variant: int) -> str:
    """A model output of ``calls`` (name, arguments text) in ``family``'s syntax."""
    if family == "hermes":
        blocks = [f'<tool_call>\n{{"name": {json.dumps(n)}, "arguments": {a}}}\n</tool_call>'
                  for n, a in calls]
        return content + ("\n" if content and calls else "") + "\n".join(blocks)
    if family == "mistral":
        items = [f'{{"name": {json.dumps(n)}, "arguments": {a}'
                 + (f', "id": "abc{i:06d}"' if variant % 2 else "") + "}"
                 for i, (n, a) in enumerate(calls)]
        return content + ("[TOOL_CALLS][" + ", ".join(items) + "]" if calls else "")
    if family == "llama3":
        key = "parameters" if variant % 2 else "arguments"
        items = [f'{{"name": {json.dumps(n)}, "{key}": {a}}}' for n, a in calls]
        return ("<|python_tag|>" if variant % 3 == 0 else "") + "; ".join(items)
    if family == "harmony":  # content as a preamble before calls, else as the final message
        if not calls:
            return "<|channel|>final<|message|>" + content
        heads = (" to=functions.{}<|channel|>commentary json<|message|>",  # the template's
                 "<|channel|>commentary to=functions.{} <|constrain|>json<|message|>",
                 "<|channel|>analysis to=functions.{}<|message|>")
        messages = ([f"<|channel|>commentary<|message|>{content}<|end|>"] if content else [])
        messages += [heads[(variant + i) % 3].format(n) + a + "<|call|>"
                     for i, (n, a) in enumerate(calls)]
        return "<|start|>assistant".join(messages)
    items = [f'{{"name": {json.dumps(n)}, "arguments": {a}}}' for n, a in calls]
    return '{"tool_calls": [' + ", ".join(items) + "]}"


@settings(max_examples=300, deadline=None)
@given(family=st.sampled_from(TOOL_FAMILIES), content=CONTENT,
       calls=st.lists(st.tuples(NAMES, ARGS, DUMPS), max_size=3),
       variant=st.integers(0, 5), cuts=st.lists(st.integers(0, 10**4), max_size=12))
def test_stream_equals_whole_parse(family: ToolFamily, content: str,
                                   calls: list[tuple[str, dict[str, Any], dict[str, Any]]],
                                   variant: int, cuts: list[int]) -> None:
    written = [(n, json.dumps(a, **d)) for n, a, d in calls]
    if family in ("llama3", "generic"):
        content = ""  # the call is the whole turn
        if not written:
            return
    text = _render(family, content, written, variant)
    whole = parse(family, text)
    assert [(c.name, c.arguments) for c in whole.calls] == written
    if family == "harmony":  # a message's text, as written
        assert whole.content == (content or None)
    else:
        assert whole.content == ((content.rstrip(" \n") if written else content) or None)
    got, added = stream(family, split(text, cuts))
    assert got == added == whole


@settings(max_examples=200, deadline=None)
@given(response=st.text(max_size=30), ascii_only=st.booleans(),
       cuts=st.lists(st.integers(0, 10**4), max_size=12))
def test_generic_response_streams_decoded(response: str, ascii_only: bool,
                                          cuts: list[int]) -> None:
    text = '{"response": ' + json.dumps(response, ensure_ascii=ascii_only) + "}"
    whole = parse("generic", text)
    assert whole == ParsedOutput(response or None, ())
    got, added = stream("generic", split(text, cuts))
    assert got == added == whole


PIECES = st.sampled_from([
    "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>", '{"name": "f", ',
    '"arguments": ', '"parameters": ', '{"tool_calls": [', '{"response": "', "{", "}", "[",
    "]", ",", ";", '"', "\\", "\\u00", "\n", " ", "x", ":", '"id": "abcdefghi"',
    "<|channel|>", "<|message|>", "<|end|>", "<|start|>assistant", "<|call|>", "<|constrain|>",
    " to=functions.f", " to=python", "analysis", "commentary", "final", " json", "<|en",
])


@settings(max_examples=400, deadline=None)
@given(family=st.sampled_from(TOOL_FAMILIES), pieces=st.lists(PIECES, max_size=25),
       cuts=st.lists(st.integers(0, 10**4), max_size=12))
def test_any_text_streams_the_same_however_split(family: ToolFamily, pieces: list[str],
                                                 cuts: list[int]) -> None:
    """Whatever the text (broken calls included): no error, and the deltas do not depend
    on the split; the whole parse's calls all have object arguments."""
    text = "".join(pieces)
    whole = parse(family, text)
    assert all(isinstance(json.loads(c.arguments), dict) for c in whole.calls)
    one, one_added = stream(family, [text])
    many, many_added = stream(family, split(text, cuts))
    assert one == one_added == many == many_added
    if all(_is_object(c.arguments) for c in one.calls) and len(one.calls) == len(whole.calls):
        assert [c.arguments for c in one.calls] == [c.arguments for c in whole.calls]


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


# ---- validation ------------------------------------------------------------------------------

def tool(name: Any = "get_weather", **fn: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, **fn}}


def test_validate_tools() -> None:
    params = {"type": "object", "properties": {"city": {"type": "string"}}}
    tools = validate_tools([tool(description="Weather", parameters=params, strict=True),
                            tool("a.b-c_9")])
    assert [t.name for t in tools] == ["get_weather", "a.b-c_9"]
    assert tools[0].parameters == params and tools[0].description == "Weather"
    assert tools[0].strict is True
    assert tools[1].parameters == {"type": "object"}  # none given: any object
    assert list(json.loads(tools[0].parameters_json)["properties"]) == ["city"]
    assert tools[0].to_openai() == tool(description="Weather", parameters=params, strict=True)
    assert tools[0].to_openai(described=True) == tools[0].to_openai()
    # without a description: none rendered, or "" for a template that needs one
    assert tools[1].to_openai() == tool("a.b-c_9", parameters={"type": "object"})
    assert tools[1].to_openai(described=True) == tool("a.b-c_9", description="",
                                                      parameters={"type": "object"})
    assert validate_tools(None) == () and validate_tools([]) == ()
    assert len(validate_tools([tool(f"t{i}") for i in range(MAX_TOOLS)])) == MAX_TOOLS
    hash(tools)  # usable as a cache key


@pytest.mark.parametrize("tools, message", [
    ({"type": "function"}, "tools must be a list"),
    ([tool(f"t{i}") for i in range(MAX_TOOLS + 1)], "129 tools, over the 128"),
    (["x"], r"tools\[0\] must be an object"),
    ([{"type": "retrieval", "function": {"name": "a"}}], r"tools\[0\]\.type must be"),
    ([{"type": "function"}], r"tools\[0\]\.function must be an object"),
    ([tool("ok"), tool("has space")], r"tools\[1\]\.function\.name must be 1-64"),
    ([tool("")], r"tools\[0\]\.function\.name"),
    ([tool("x" * 65)], r"tools\[0\]\.function\.name"),
    ([tool(7)], r"tools\[0\]\.function\.name"),
    ([tool("a"), tool("b"), tool("a")], r"tools\[2\] \('a'\): the function name 'a' is given"),
    ([tool(description=3)], r"tools\[0\] \('get_weather'\)\.function\.description"),
    ([tool(strict="yes")], r"\.function\.strict must be a boolean"),
    ([tool(parameters=[1])], r"\.function\.parameters must be a JSON schema object"),
    ([tool(parameters={"type": "string"})], r"\.function\.parameters must describe an object"),
    ([tool(parameters={"type": "object", "default": float("nan")})],
     r"\.function\.parameters is not JSON"),
])
def test_validate_tools_errors(tools: Any, message: str) -> None:
    with pytest.raises(DataError, match=message):
        validate_tools(tools)


def test_validate_tool_choice() -> None:
    tools = validate_tools([tool("a"), tool("b")])
    assert validate_tool_choice(None, tools) == ToolChoice("auto")
    assert validate_tool_choice(None, ()) == ToolChoice("none")
    assert validate_tool_choice("none", ()) == ToolChoice("none")
    modes: tuple[ToolChoiceMode, ...] = ("none", "auto", "required")
    for mode in modes:
        assert validate_tool_choice(mode, tools) == ToolChoice(mode)
    named = {"type": "function", "function": {"name": "b"}}
    assert validate_tool_choice(named, tools) == ToolChoice("function", "b")


@pytest.mark.parametrize("choice, tools, message", [
    ("sometimes", ["a"], "tool_choice must be"),
    ("auto", [], "tool_choice 'auto' needs tools"),
    ("required", [], "tool_choice 'required' needs tools"),
    ({"type": "function", "function": {"name": "c"}}, ["a"], "'c', which is not among"),
    ({"type": "function", "function": {"name": "a"}}, [], "no tools are given"),
    ({"type": "function"}, ["a"], "must be {\"type\": \"function\""),
    ({"type": "tool", "function": {"name": "a"}}, ["a"], "must be {\"type\": \"function\""),
    (3, ["a"], "a string or an object"),
])
def test_validate_tool_choice_errors(choice: Any, tools: list[str], message: str) -> None:
    with pytest.raises(DataError, match=re.escape(message) if "{" in message else message):
        validate_tool_choice(choice, validate_tools([tool(n) for n in tools]))


# ---- the shipped template and the probe ------------------------------------------------------

@pytest.fixture(scope="module")
def smollm() -> Tokenizer:
    from recallspec.models.loader import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="module")
def ours(smollm: Tokenizer) -> Tokenizer:
    return Tokenizer(smollm._tok, chat_template=shipped_template(),
                     bos_token=smollm.bos_token, eos_token=smollm.eos_token)


WEATHER_TOOL = tool(description="The weather in a city", parameters={
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
CHAT: list[dict[str, Any]] = [
    {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Weather in Paris and Rome?"}]


def test_template_without_tools_renders_as_smollm2s_own(smollm: Tokenizer,
                                                        ours: Tokenizer) -> None:
    for chat in (CHAT, [{"role": "system", "content": "Be brief."}, *CHAT]):
        for prompt in (True, False):
            assert ours.apply_chat_template(chat, prompt) == smollm.apply_chat_template(
                chat, prompt)
    assert ours.eos_token_ids == smollm.eos_token_ids


def test_template_renders_tools_calls_and_results(ours: Tokenizer) -> None:
    chat: list[dict[str, Any]] = [*CHAT,
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"id": "call_2", "type": "function",
                 # (The server parses a call's JSON text before rendering: an object.)
                 "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
            {"role": "assistant", "content": "Sunny in Paris, rain in Rome.", "tool_calls": []}]
    text = ours.apply_chat_template(chat, tools=[WEATHER_TOOL])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face\n\n# Tools\n\nYou may call one or more functions to assist with the user query."
        "\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{json.dumps(WEATHER_TOOL)}\n</tools>\n\nFor each function call, return a "
        "json object with function name and arguments within <tool_call></tool_call> XML "
        'tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", '
        '"arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n"
        "</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nSunny in Paris, rain in Rome.<|im_end|>\n"
        "<|im_start|>assistant\n")
    system = ours.apply_chat_template([{"role": "system", "content": "Be brief."}, *CHAT],
                                      tools=[WEATHER_TOOL])
    assert system.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert system.count("<|im_start|>system") == 1


@settings(max_examples=50, deadline=None)
@given(content=st.sampled_from(["", "Let me check."]),
       calls=st.lists(st.tuples(NAMES, ARGS), min_size=1, max_size=3))
def test_template_calls_parse_back(ours: Tokenizer, content: str,
                                   calls: list[tuple[str, dict[str, Any]]]) -> None:
    """An assistant turn the template writes is what the Hermes parser reads: the model's
    continuation after the generation prompt, up to <|im_end|>."""
    turn = {"role": "assistant", "content": content, "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
        for i, (n, a) in enumerate(calls)]}
    prompt = ours.apply_chat_template(CHAT, add_generation_prompt=True)
    full = ours.apply_chat_template([*CHAT, turn], add_generation_prompt=False)
    assert full.startswith(prompt) and full.endswith("<|im_end|>\n")
    out = parse("hermes", full[len(prompt):-len("<|im_end|>\n")])
    assert out.content == (content or None)
    assert [(c.name, json.loads(c.arguments)) for c in out.calls] == calls
    assert [c.arguments for c in out.calls] == [json.dumps(a, ensure_ascii=False)
                                                for _, a in calls]


def test_supports_tools(smollm: Tokenizer, ours: Tokenizer) -> None:
    def render(tok: Tokenizer) -> Any:
        return lambda messages, tools: tok.apply_chat_template(messages, tools=tools)

    assert not supports_tools(smollm.chat_template, render(smollm))
    assert supports_tools(ours.chat_template, render(ours))
    assert not supports_tools(None, render(ours))
    # a template that lists tools but cannot render a call
    lists_only = ("{% for t in tools %}{{ t.function.name }}{% endfor %}"
                  "{% for m in messages %}{{ m.content }}{% endfor %}")
    broken = Tokenizer(smollm._tok, chat_template=lists_only)
    assert not supports_tools(lists_only, render(broken))

    def raises(messages: Any, tools: Any) -> str:
        raise RuntimeError("no")

    assert not supports_tools(shipped_template(), raises)
    assert not supports_tools(f"{{# {PROBE_TOOL_NAME} #}}", render(ours))


def test_needs_descriptions(smollm: Tokenizer) -> None:
    def render(template: str) -> Any:
        t = Tokenizer(smollm._tok, chat_template=template)
        return lambda messages, tools: t.apply_chat_template(messages, tools=tools)

    # gpt-oss's way: the description concatenated, an error where it is undefined
    concatenates = '{% for t in tools %}{{ "// " + t.function.description }}{% endfor %}'
    assert needs_descriptions(render(concatenates))
    # tojson (Qwen's, ours), or a test of it: a tool without one renders as given
    assert not needs_descriptions(render(shipped_template()))
    assert not needs_descriptions(render(
        "{% for t in tools %}{% if t.function.description %}{{ t.function.description }}"
        "{% endif %}{% endfor %}"))

    def raises(messages: Any, tools: Any) -> str:
        raise RuntimeError("no")

    assert not needs_descriptions(raises)  # no tools at all: not this question


def test_template_is_package_data() -> None:
    """Shipped in the wheel: scikit-build-core's wheel.packages takes every file of the
    package directory that git does not ignore."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    path = root / "src/recallspec/server/templates/chatml_tools.jinja"
    assert path.read_text(encoding="utf-8") == shipped_template()
    ignored = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=root,
                             capture_output=True, check=False)
    assert ignored.returncode == 1  # 1: not ignored
    with pytest.raises(DataError):
        shipped_template("missing.jinja")
