"""gpt-oss's harmony chat format end to end without weights: llama.cpp's
openai-gpt-oss-120b.jinja rendered by our Jinja environment (tools, a past call, its
result, the generation prompt), the "harmony" family's parser (whole and streamed: final,
analysis, preambles, both recipient forms, constraints, several calls, malformed text),
its call grammar on a vocabulary holding the harmony tokens as special tokens (the
engine's compile and commit path, with <|end|> a token and <|call|> / <|return|> the
ends of the turn), what the parser reads back of what the template writes, a tool
without a description (which the template cannot render as given), and the server's
replies over a scripted stand-in engine through the ``openai`` client: the analysis
channel as ``reasoning_content`` (the message's; streamed, deltas of their own before
the content and the calls), never content."""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

import pytest
from helpers import tool_stream
from helpers.availability import unavailable
from hypothesis import given, settings
from hypothesis import strategies as st

from recallspec.decoding.masks import Guide
from recallspec.models.tokenizer import Tokenizer
from recallspec.server.tool_calls import (
    ContentDelta,
    ParsedOutput,
    ReasoningDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStream,
    ToolChoice,
    detect_family,
    supports_tools,
    validate_tools,
)
from recallspec.server.tool_grammar import FAMILY_MARKERS, special_marker_ids, tool_grammar
from recallspec.server.tool_support import ToolSupport

TEMPLATE = "openai-gpt-oss-120b.jinja"
# openai/gpt-oss-20b's added tokens, in their id order (less the reserved ones)
HARMONY_SPECIAL = ("<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>",
                   "<|channel|>", "<|start|>", "<|end|>", "<|message|>", "<|call|>",
                   "<|endofprompt|>")


@pytest.fixture(scope="module")
def template() -> str:
    from recallspec.conformance.checkpoints import llama_cpp_source
    from recallspec.errors import RecallspecError

    try:
        path = llama_cpp_source() / "models" / "templates" / TEMPLATE
    except RecallspecError as e:
        unavailable(str(e))
    return path.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def tok(template: str) -> Tokenizer:
    """SmolLM2's vocabulary with the harmony tokens added as special tokens, and the
    gpt-oss template (its tokenizer_config's BOS and EOS)."""
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HFTokenizer

    from recallspec.models.loader import load_tokenizer

    backend = HFTokenizer.from_str(load_tokenizer("smollm2-135m").backend_json())
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in HARMONY_SPECIAL])
    return Tokenizer(backend, chat_template=template, bos_token="<|startoftext|>",
                     eos_token="<|return|>")


def tid(tok: Tokenizer, token: str) -> int:
    i = tok.special_token_id(token)
    assert i is not None, token
    return i


def parse(text: str) -> ParsedOutput:
    return tool_stream.parse("harmony", text)


def stream(pieces: list[str]) -> tuple[ParsedOutput, ParsedOutput]:
    return tool_stream.stream("harmony", pieces)


WEATHER_TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string", "description": "The city"},
            "days": {"type": "integer"}},
        "required": ["city"]}}}
TOOLS = validate_tools([
    WEATHER_TOOL,
    {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "now", "description": "The time"}},
])
CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"}]
CALL_TURN: dict[str, Any] = {
    "role": "assistant", "content": None, "reasoning_content": "I need the weather.",
    "tool_calls": [{"id": "call_1", "type": "function", "function": {
        # (the server parses a call's JSON text before rendering: an object)
        "name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]}
RESULT: dict[str, Any] = {"role": "tool", "tool_call_id": "call_1",
                          "content": '{"sky": "sunny"}'}


# ---- the template, through our environment ----------------------------------------------

def test_the_template_is_harmony_and_renders_tools(tok: Tokenizer, template: str) -> None:
    assert detect_family(template) == "harmony"
    support = ToolSupport.of(tok)
    assert (support.origin, support.family) == ("model", "harmony")
    assert support.describe() == "tools: harmony calls (the model's template)"
    # every marker the grammar writes is a special token here: referenced by id
    assert support.special_tokens == {m: tid(tok, m) for m in FAMILY_MARKERS["harmony"]}

    def render(messages: Any, tools: Any) -> str:
        return tok.apply_chat_template(messages, tools=tools)

    assert supports_tools(template, render)


def _system(date: str, effort: str = "medium", tools: bool = True) -> str:
    return ("<|start|>system<|message|>You are ChatGPT, a large language model trained by "
            f"OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: {date}\n\nReasoning: "
            f"{effort}\n\n# Valid channels: analysis, commentary, final. Channel must be "
            "included for every message."
            + ("\nCalls to these tools must go to the commentary channel: 'functions'."
               if tools else "") + "<|end|>")


DEVELOPER = ("<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n"
             "## functions\n\nnamespace functions {\n\n// The weather in a city\n"
             "type get_weather = (_: {\n// The city\ncity: string,\ndays?: number,\n"
             "}) => any;\n\n} // namespace functions<|end|>")
USER = "<|start|>user<|message|>Weather in Paris?<|end|>"
CALL = ('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>'
        '{"city": "Paris", "days": 2}<|call|>')
TOOL_RESULT = ('<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>'
               '"{\\"sky\\": \\"sunny\\"}"<|end|>')


def _dated(text: str) -> tuple[str, str]:
    """The text with its date cut out (strftime_now's: today's), and the date."""
    m = re.search(r"Current date: (\d{4}-\d{2}-\d{2})\n", text)
    assert m is not None, text
    return text.replace(m.group(1), "DATE", 1), m.group(1)


def test_template_renders_a_call_its_result_and_the_generation_prompt(tok: Tokenizer) -> None:
    before = datetime.now().strftime("%Y-%m-%d")
    # up to the tool's result: the call's analysis is kept (no final message after it)
    text = tok.apply_chat_template([*CHAT, CALL_TURN, RESULT], tools=[WEATHER_TOOL],
                                   reasoning_effort="high")
    assert text.endswith("<|start|>assistant")  # the generation prompt
    cut, date = _dated(text)
    assert date in (before, datetime.now().strftime("%Y-%m-%d"))
    analysis = "<|start|>assistant<|channel|>analysis<|message|>I need the weather.<|end|>"
    assert cut == (_system("DATE", "high") + DEVELOPER + USER + analysis + CALL + TOOL_RESULT
                   + "<|start|>assistant")
    # a final answer after it: the call's analysis is dropped, the answer rendered
    final = {"role": "assistant", "content": "Sunny in Paris."}
    later = [*CHAT, CALL_TURN, RESULT, final, {"role": "user", "content": "Thanks!"}]
    cut, _ = _dated(tok.apply_chat_template(later, tools=[WEATHER_TOOL]))
    assert cut == (_system("DATE") + DEVELOPER + USER + CALL + TOOL_RESULT
                   + "<|start|>assistant<|channel|>final<|message|>Sunny in Paris.<|end|>"
                   + "<|start|>user<|message|>Thanks!<|end|><|start|>assistant")
    # without tools nor a system message: no developer message
    cut, _ = _dated(tok.apply_chat_template(CHAT[1:]))
    assert cut == _system("DATE", tools=False) + USER + "<|start|>assistant"


def test_rendered_markers_are_single_special_tokens(tok: Tokenizer) -> None:
    text = tok.apply_chat_template([*CHAT, CALL_TURN, RESULT], tools=[WEATHER_TOOL])
    ids = tok.encode_prompt(text)
    assert tok.decode(ids) == text
    for marker in ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>"):
        assert ids.count(tid(tok, marker)) == text.count(marker) > 0, marker


def test_template_refuses_a_tool_result_without_a_call(tok: Tokenizer) -> None:
    """raise_exception: the template's own check (the server answers a 400)."""
    from jinja2.exceptions import TemplateError

    with pytest.raises(TemplateError, match="no previous assistant message with a tool"):
        tok.apply_chat_template([*CHAT, RESULT])


@pytest.mark.parametrize("args", [{"city": "Paris"}, {"city": "Zürich \"x\"", "days": 3},
                                  {}])
def test_template_calls_parse_back(tok: Tokenizer, args: dict[str, Any]) -> None:
    """A call turn the template writes, after the generation prompt and before <|call|>
    (the turn's end, an EOS the text never holds), is what the parser reads as that call
    and what the call grammar admits."""
    name = "now" if not args else "get_weather"
    turn = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": name, "arguments": args}}]}
    prompt = tok.apply_chat_template(CHAT, add_generation_prompt=True)
    full = tok.apply_chat_template([*CHAT, turn], add_generation_prompt=False)
    assert full.startswith(prompt) and full.endswith("<|call|>")
    output = full[len(prompt):-len("<|call|>")]
    out = parse(output)
    assert out == ParsedOutput(None, (ToolCall("id0", name,
                                               json.dumps(args, ensure_ascii=False)),))
    assert commits(tok, grammar(tok, "required"), output + "<|call|>")


# ---- the parser ---------------------------------------------------------------------------

FINAL = "<|channel|>final<|message|>"
ANALYSIS = "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant"
ARGS = '{"city": "Paris", "opts": {"s": "<|end|> } {"}}'


@pytest.mark.parametrize("text, content, reasoning, calls", [
    (FINAL + "Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", None, []),
    (FINAL + "Hi<|return|>", "Hi", None, []),  # (the EOS, where the text holds it)
    ("<|channel|>commentary<|message|>Hello", "Hello", None, []),  # a preamble: content
    (ANALYSIS + FINAL + "Hello", "Hello", "I'm\nthinking", []),
    ("<|channel|>analysis<|message|>I'm\nthinking", None, "I'm\nthinking", []),  # cut off
    # a call, the recipient in the role header, as the template writes past calls
    (f" to=functions.get_weather<|channel|>commentary json<|message|>{ARGS}", None, None,
     [("get_weather", ARGS)]),
    # in the channel header, with <|constrain|>, as gpt-oss writes them; then <|call|>
    (f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{ARGS}"
     "<|call|>", None, None, [("get_weather", ARGS)]),
    # the analysis channel, no constraint (llama.cpp's tests)
    (' to=functions.f<|channel|>analysis<|message|>{"arg1": 1}', None, None,
     [("f", '{"arg1": 1}')]),
    ('<|channel|>analysis to=functions.f<|message|>{"arg1": 1}', None, None,
     [("f", '{"arg1": 1}')]),
    (' to=functions.f<|channel|>analysis <|constrain|>json<|message|>{"arg1": 1}', None, None,
     [("f", '{"arg1": 1}')]),
    # reasoning, a preamble, then a call
    (ANALYSIS + "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant"
     '<|channel|>commentary to=functions.a.b-c <|constrain|>json<|message|>{}', "Let me check.",
     "I'm\nthinking", [("a.b-c", "{}")]),
    # two calls (where <|call|> is no stop: the engine ends the turn on it)
    (ANALYSIS + '<|channel|>commentary to=functions.add json<|message|>{"a": 1, "b": 2}'
     '<|call|><|start|>assistant to=functions.now<|channel|>commentary<|message|> {} <|call|>',
     None, "I'm\nthinking", [("add", '{"a": 1, "b": 2}'), ("now", "{}")]),
    # a built-in tool not offered: dropped, as llama.cpp drops it
    (ANALYSIS + " to=container.exec<|channel|>commentary<|message|>python3 -c 'print(1)'",
     None, "I'm\nthinking", []),
    (ANALYSIS + "<|channel|>commentary to=python <|constrain|>code<|message|>print(1)<|call|>",
     None, "I'm\nthinking", []),
    # a stray "<|channel|>commentary[ to=assistant]" before the channel: read over
    ("<|channel|>commentary to=assistant" + ANALYSIS
     + "<|channel|>commentary to=assistant" + FINAL + "Hi", "Hi", "I'm\nthinking", []),
    ("<|channel|>commentary" + FINAL + "Hi", "Hi", None, []),
    ("", None, None, []),
])
def test_parse(text: str, content: str | None, reasoning: str | None,
               calls: list[tuple[str, str]]) -> None:
    out = parse(text)
    assert (out.content, out.reasoning) == (content, reasoning)
    assert [(c.name, c.arguments) for c in out.calls] == calls
    assert [c.id for c in out.calls] == [f"id{i}" for i in range(len(calls))]
    # streamed one character at a time, or whole: the same
    for pieces in (list(text), [text]):
        got, added = stream(pieces)
        assert got == added == out


@pytest.mark.parametrize("text, content", [
    ("Plain text, no header", "Plain text, no header"),
    ("<|channel|>fin", "<|channel|>fin"),  # a header cut off
    ("<|channel|>summary<|message|>x", "<|channel|>summary<|message|>x"),  # no such channel
    (" to=functions.f<|message|>{}", " to=functions.f<|message|>{}"),  # a call without channel
    # a call that does not parse: its message as written, and the rest
    (ANALYSIS + ' to=functions.f<|channel|>commentary json<|message|>{"a": ',
     '<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{"a": '),
    (' to=functions.f<|channel|>commentary json<|message|>{"a": 1}, {}<|call|>',
     ' to=functions.f<|channel|>commentary json<|message|>{"a": 1}, {}<|call|>'),
    (' to=functions.f<|channel|>commentary json<|message|>"text"<|call|>',
     ' to=functions.f<|channel|>commentary json<|message|>"text"<|call|>'),
    # what follows a message that is no message
    (FINAL + "Hi<|end|> and more", "Hi and more"),
])
def test_malformed_output_is_content(text: str, content: str) -> None:
    out = parse(text)
    assert out.content == content and out.calls == ()
    got, added = stream(list(text))
    assert got == added  # (a call whose header went out stays, cut short)


def test_stream_deltas() -> None:
    s = ToolCallStream("harmony", new_id=tool_stream.counter_ids())
    assert s.feed("<|channel|>analysis<|message|>think") == [ReasoningDelta("think")]
    assert s.feed("ing<|en") == [ReasoningDelta("ing")]  # (a marker's start held back)
    assert s.feed("d|><|start|>assistant<|channel|>commentary<|message|>Hi <|e") == [
        ContentDelta("Hi ")]  # what may begin an end marker is held back
    assert s.feed("nd") == []
    assert s.feed("ed?<|end|><|start|>assistant<|channel|>commentary to=functions.f") == [
        ContentDelta("<|ended?")]
    assert s.feed(" <|constrain|>json<|message|>") == []  # the header, not yet its arguments
    assert s.feed('{"a"') == [ToolCallDelta(0, "", "id0", "f"), ToolCallDelta(0, '{"a"')]
    assert s.feed(": [1]}") == [ToolCallDelta(0, ": [1]}")]
    assert s.finish() == []
    assert s.result() == ParsedOutput("Hi <|ended?", (ToolCall("id0", "f", '{"a": [1]}'),),
                                      "thinking")


REASONED = ("<|channel|>analysis<|message|>Final answer: use the tool.<|end|>"
            "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
            "<|start|>assistant<|channel|>analysis<|message|>Then answer.<|end|>"
            "<|start|>assistant<|channel|>final<|message|>It is sunny.")


@pytest.mark.parametrize("split", ["chars", "whole"])
def test_streamed_reasoning_adds_up_and_is_never_content(split: str) -> None:
    """Each analysis message streams as reasoning deltas as it comes, in the output's
    order with the content; they add up to the parse's reasoning and none of it is
    content."""
    s = ToolCallStream("harmony", new_id=tool_stream.counter_ids())
    pieces = list(REASONED) if split == "chars" else [REASONED]
    events = [e for p in pieces for e in s.feed(p)] + s.finish()
    kinds = [type(e) for e in events]
    # merged per feed: one char at a time, one event a char of text; whole, one a message
    runs = [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] is not k]
    assert runs == [ReasoningDelta, ContentDelta, ReasoningDelta, ContentDelta]
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    assert reasoning == "Final answer: use the tool.Then answer."
    assert content == "Checking.It is sunny."
    assert parse(REASONED) == s.result() == ParsedOutput(content, (), reasoning)
    assert all("<|" not in e.text for e in events if isinstance(e, ReasoningDelta))


PIECES = st.sampled_from([
    "<|channel|>", "<|message|>", "<|end|>", "<|start|>", "assistant", "<|call|>",
    "<|return|>", "<|constrain|>", "json", " ", " to=", "functions.f", "python", "analysis",
    "commentary", "final", "{", "}", '"', "\\", ":", "1", "x", "\n", "<|", "<|en",
])


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(PIECES, max_size=30), cuts=st.lists(st.integers(0, 10**4),
                                                            max_size=12))
def test_any_text_parses_and_streams_the_same_however_split(pieces: list[str],
                                                           cuts: list[int]) -> None:
    text = "".join(pieces)
    whole = parse(text)
    assert all(isinstance(json.loads(c.arguments), dict) for c in whole.calls)
    one, one_added = stream([text])
    many, many_added = stream(tool_stream.split(text, cuts))
    assert one == one_added == many == many_added
    if len(one.calls) == len(whole.calls):
        assert one.reasoning == whole.reasoning


# ---- the call grammar, through the engine's compile and commit ----------------------------

def grammar(tok: Tokenizer, mode: str, name: str | None = None) -> Guide:
    """The calls' grammar, the markers the vocabulary holds as special tokens by id."""
    text = tool_grammar(TOOLS, ToolChoice(mode, name), family="harmony",  # type: ignore[arg-type]
                        special_tokens=special_marker_ids("harmony", tok.special_token_id))
    assert text is not None
    return Guide("llguidance", text)


def commits(tok: Tokenizer, guide: Guide, text: str) -> bool:
    """Whether the grammar lets the engine commit ``text``'s tokens one by one (any
    end-of-sequence id, <|call|> or <|return|>, where it accepts), and ends there."""
    from recallspec.grammar.compile import GuideCache

    m = GuideCache().compile(guide, tok, vocab_size=tok.vocab_size).matcher()
    for t in tok.encode(text):
        try:
            m.advance([t])
        except RuntimeError:
            return False
    return m.is_stopped() or m.is_accepting()


def test_turn_ends(tok: Tokenizer) -> None:
    """<|end|> is a token the grammar reads, <|call|> and <|return|> end the turn."""
    assert tok.eos_token_ids == {tid(tok, "<|return|>"), tid(tok, "<|call|>")}


CHANNEL_CALL = ("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                '{"city": "Paris"}')
ROLE_CALL = ' to=functions.add<|channel|>commentary json<|message|>{"a": 1, "b": 2}'


def test_grammar_auto(tok: Tokenizer) -> None:
    auto = grammar(tok, "auto")
    assert "<[" in auto.source and '"<|channel|>"' not in auto.source  # token references
    for text in (FINAL + "Hello there<|return|>", FINAL + "<|return|>",
                 ANALYSIS + FINAL + "Hi<|return|>",
                 ANALYSIS + "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant"
                 + CHANNEL_CALL + "<|call|>",
                 ROLE_CALL + "<|call|>", ANALYSIS + ROLE_CALL + "<|call|>",
                 ' to=functions.now<|channel|>analysis<|message|>{}<|call|>'):
        assert commits(tok, auto, text), text
        out = parse(text.removesuffix("<|call|>").removesuffix("<|return|>"))
        assert len(out.calls) == text.endswith("<|call|>")
    for text in ("Hello",  # not harmony
                 CHANNEL_CALL.replace("get_weather", "get_wether"),  # no such tool
                 CHANNEL_CALL.replace('"Paris"', "7"),  # the schema's type
                 CHANNEL_CALL.replace('": "', '":"'),  # not compact as tojson writes it
                 CHANNEL_CALL + " more",  # only the end of the turn after a call
                 CHANNEL_CALL + "<|end|>",
                 FINAL + "Hi<|end|><|start|>assistant" + FINAL,  # nothing after the final
                 " to=python<|channel|>commentary<|message|>print(1)"):  # not offered
        assert not commits(tok, auto, text), text


def test_grammar_required_and_named(tok: Tokenizer) -> None:
    required = grammar(tok, "required")
    assert commits(tok, required, ANALYSIS + CHANNEL_CALL + "<|call|>")
    assert commits(tok, required, ROLE_CALL + "<|call|>")
    assert not commits(tok, required, FINAL + "Hi")  # a call is due
    assert not commits(tok, required, ANALYSIS + FINAL + "Hi")
    named = grammar(tok, "function", "add")
    assert commits(tok, named, ANALYSIS + ROLE_CALL + "<|call|>")
    assert not commits(tok, named, CHANNEL_CALL + "<|call|>")
    assert not commits(tok, named, ROLE_CALL.replace('"b": 2', '"b": "2"') + "<|call|>")


def test_grammar_with_markers_as_text() -> None:
    """A vocabulary without the harmony tokens: the markers are text, a message's body
    ends at the first <|end|> (a lazy lexeme)."""
    from recallspec.models.loader import load_tokenizer

    smollm = load_tokenizer("smollm2-135m")
    plain = Tokenizer(smollm._tok, chat_template="{{ '<|channel|>' }}",
                      eos_token=smollm.eos_token)
    auto = grammar(plain, "auto")
    assert '"<|channel|>"' in auto.source and "<[" not in auto.source
    assert commits(plain, auto, ANALYSIS + CHANNEL_CALL)
    assert commits(plain, auto, ANALYSIS + FINAL + "Hi")
    assert not commits(plain, auto, CHANNEL_CALL.replace("get_weather", "get_wether"))


# ---- a tool without a description ---------------------------------------------------------

BARE_TOOL: dict[str, Any] = {"type": "function", "function": {"name": "now"}}


def _submission(**fields: Any) -> Any:
    from recallspec.server import protocol as P

    body = {"model": "m", "messages": CHAT, **fields}
    req = P.ChatRequest.model_validate_json(json.dumps(body))
    return P.submission(req, max_len=4096, vocab_size=1 << 20)


def test_a_tool_without_a_description_renders(tok: Tokenizer) -> None:
    """OpenAI's description is optional; the template writes ``"// " +
    tool.description``, which fails on an undefined one. The server renders such a tool
    with "" (as llama-server renders every tool), only for this template."""
    from jinja2.exceptions import UndefinedError

    with pytest.raises(UndefinedError, match="description"):
        tok.apply_chat_template(CHAT, tools=[BARE_TOOL])  # the template as given
    support = ToolSupport.of(tok)
    assert support.described
    for choice in ("auto", "none", "required"):
        sub = support.prepare(_submission(tools=[BARE_TOOL, WEATHER_TOOL],
                                          tool_choice=choice), tok)
        text = tok.decode(sub.prompt)
        assert ("namespace functions {\n\n// \ntype now = () => any;\n\n"
                "// The weather in a city\ntype get_weather = (_: {") in text, text
        assert text.endswith("<|start|>assistant")
    # the rendering is the template's own with an empty description
    described = {"type": "function", "function": {"name": "now", "description": "",
                                                  "parameters": {"type": "object"}}}
    expected = tok.apply_chat_template(CHAT, tools=[described])
    sub = support.prepare(_submission(tools=[BARE_TOOL]), tok)
    assert _dated(tok.decode(sub.prompt))[0] == _dated(expected)[0]


# ---- the server's replies, over a scripted engine --------------------------------------

class _Guides:
    def compile(self, guide: Guide, tokenizer: Any, *, vocab_size: int) -> object:
        return object()  # (the grammar is test_grammar_*'s; here: any guide compiles)


class _ScriptedLoop:
    """An EngineLoop stand-in: every choice of every request answers with ``pieces`` (the
    engine's text deltas, one token each) and ends by itself ("eos"); the submissions
    are recorded."""

    def __init__(self, tok: Tokenizer) -> None:
        from types import SimpleNamespace

        self.engine = SimpleNamespace(
            max_len=4096, model=SimpleNamespace(config=SimpleNamespace(
                vocab_size=tok.vocab_size)),
            tokenizer=tok, guides=_Guides(), curves=SimpleNamespace(state="none"))
        self.pieces: list[str] = []
        self.submitted: list[Any] = []

    def submit(self, streams: Any) -> None:
        from recallspec.engine import RequestOutput, SpecStats
        from recallspec.server.engine_loop import Accepted

        self.submitted.append(streams[0].sub)
        spec = SpecStats(len(self.pieces), len(self.pieces), 0, 0, 0, ())
        for s in streams:
            s.post(Accepted(0, 5))
            for k, text in enumerate(self.pieces):
                end = k == len(self.pieces) - 1
                s.post(RequestOutput(0, None, (7,), text, end, "eos" if end else None, 5, 1,
                                     spec))

    def abort(self, stream: Any) -> None:
        pass

    def is_alive(self) -> bool:
        return True


@pytest.fixture
def served(tok: Tokenizer) -> Any:
    """The routes over the scripted engine, and an ``openai`` client of them."""
    from fastapi.testclient import TestClient
    from openai import OpenAI

    from recallspec.server.app import create_app

    loop = _ScriptedLoop(tok)
    with TestClient(create_app(loop, model_name="m")) as http:  # type: ignore[arg-type]
        yield loop, http, OpenAI(base_url="http://testserver/v1", api_key="-",
                                 http_client=http, max_retries=0)


THOUGHT = ["<|channel|>analysis<|message|>The user", " asks the", " weather.<|end|>",
           "<|start|>assistant"]
ANSWER = [*THOUGHT, "<|channel|>final", "<|message|>Sunny", " today."]
NOW_CALL = [*THOUGHT, "<|channel|>commentary to=functions.now <|constrain|>json<|message|>",
            "{", "}"]


def _streamed(client: Any, **kw: Any) -> list[tuple[str, Any]]:
    """The stream's deltas as (kind, value) in order: "reasoning", "content", "call"."""
    out: list[tuple[str, Any]] = []
    for chunk in client.chat.completions.create(model="m", messages=CHAT, stream=True, **kw):
        for c in chunk.choices:
            d = c.delta
            parts = [(k, v) for k, v in (("reasoning", getattr(d, "reasoning_content", None)),
                                         ("content", d.content)) if v]
            parts += [("call", t) for t in d.tool_calls or []]
            assert len({k for k, _ in parts}) <= 1, d  # one kind a delta, never mixed
            out += parts
    return out


def test_reasoning_content_of_a_reply(served: Any) -> None:
    loop, http, client = served
    loop.pieces = ANSWER
    m = client.chat.completions.create(model="m", messages=CHAT).choices[0].message
    assert (m.content, m.reasoning_content) == ("Sunny today.", "The user asks the weather.")
    events = _streamed(client)
    assert events == [("reasoning", "The user"), ("reasoning", " asks the"),
                      ("reasoning", " weather."), ("content", "Sunny"), ("content", " today.")]
    # no analysis: no reasoning_content (llama-server's shape), nothing streamed for it
    loop.pieces = ANSWER[len(THOUGHT):]
    body = http.post("/v1/chat/completions", json={"model": "m", "messages": CHAT}).json()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Sunny today."}
    assert [k for k, _ in _streamed(client)] == ["content", "content"]


def test_reasoning_content_with_a_call_of_a_tool_without_description(served: Any) -> None:
    loop, _, client = served
    loop.pieces = NOW_CALL
    r = client.chat.completions.create(model="m", messages=CHAT, tools=[BARE_TOOL])
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    assert c.message.reasoning_content == "The user asks the weather."
    assert [(t.function.name, t.function.arguments) for t in c.message.tool_calls] == [
        ("now", "{}")]
    text = loop.engine.tokenizer.decode(loop.submitted[-1].prompt)
    assert "// \ntype now = () => any;" in text  # rendered with an empty description
    events = _streamed(client, tools=[BARE_TOOL])
    assert [k for k, _ in events] == ["reasoning"] * 3 + ["call"] * 3
    assert "".join(v for k, v in events if k == "reasoning") == "The user asks the weather."
    first = events[3][1]
    assert (first.function.name, first.function.arguments, first.index) == ("now", "", 0)
    assert "".join(t.function.arguments for _, t in events[4:]) == "{}"
