"""Tool calling through a real `recallspec serve` on SmolLM2 (its ChatML template has no
tools: the server renders requests with tools through the shipped chatml_tools.jinja,
Hermes calls) and the official ``openai`` client: forced calls (``tool_choice``
"required" and named) are valid calls of the request's tools, streamed the same as
whole, greedy the same tokens with and without speculation; a follow-up turn with the
calls and their results renders and answers; every malformed or conflicting tools
request is a 400 naming ``param``; and a pydantic-ai agent runs a tool and returns a
structured output over the server, no network. (The pure parts: test_tool_calls.py,
test_tool_grammar.py, test_tool_support.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import httpx
import pytest
from helpers.availability import unavailable
from helpers.server import MODEL, Server, ext, start_server
from pydantic import BaseModel, ConfigDict, Field

pytestmark = [pytest.mark.server, pytest.mark.slow]

MAX_TOKENS = 64  # a call of these tools is about 35 tokens


class Weather(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: Annotated[str, Field(max_length=24)]
    unit: Literal["celsius", "fahrenheit"]


class Add(BaseModel):
    model_config = ConfigDict(extra="forbid")
    a: int
    b: int


ARGUMENTS: dict[str, type[BaseModel]] = {"get_weather": Weather, "add": Add}
TOOLS: list[Any] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city",
        "parameters": Weather.model_json_schema()}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers", "parameters": Add.model_json_schema()}},
]
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]
ADD = {"type": "function", "function": {"name": "add"}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from start_server(tmp_path_factory.mktemp("serve") / "server.log",
                            "--drafter", "pld", "--mode", "fixed", "--max-batch-size", "8")


def _calls(message: Any) -> list[tuple[str, str]]:
    """(name, arguments) of a message's calls, each arguments validated by its tool's
    model."""
    out = []
    for call in message.tool_calls or []:
        assert call.type == "function" and call.id.startswith("call_"), call
        ARGUMENTS[call.function.name].model_validate_json(call.function.arguments)
        out.append((call.function.name, call.function.arguments))
    return out


def _create(server: Server, **kw: Any) -> Any:
    body: dict[str, Any] = {"model": MODEL, "messages": QUESTION, "tools": TOOLS,
                            "max_tokens": MAX_TOKENS, "temperature": 0}
    return server.client().chat.completions.create(**(body | kw))


def test_required_and_named_choices_give_valid_calls(server: Server) -> None:
    r = _create(server, tool_choice="required", parallel_tool_calls=False)
    c = r.choices[0]
    calls = _calls(c.message)
    assert len(calls) == 1 and c.finish_reason == "tool_calls", c
    assert c.message.content is None
    r = _create(server, tool_choice=ADD, parallel_tool_calls=False)
    c = r.choices[0]
    assert [name for name, _ in _calls(c.message)] == ["add"], c
    assert c.finish_reason == "tool_calls"
    # Parallel calls allowed: one or more, all of the named tool (the model may repeat the
    # call until max_tokens: a call cut short stays content).
    c = _create(server, tool_choice=ADD).choices[0]
    calls = _calls(c.message)
    assert calls and {name for name, _ in calls} == {"add"}, c
    assert c.finish_reason in ("tool_calls", "length")


def _streamed(server: Server, **kw: Any) -> dict[int, tuple[list[tuple[str, str]], str | None,
                                                           str]]:
    """Choice index -> (the calls put together from ``delta.tool_calls``, finish_reason,
    content) of a streamed request."""
    chunks = list(_create(server, stream=True, **kw))
    calls: dict[int, dict[int, list[str]]] = {}
    reasons: dict[int, str | None] = {}
    content: dict[int, str] = {}
    for chunk in chunks:
        for c in chunk.choices:
            content[c.index] = content.get(c.index, "") + (c.delta.content or "")
            for d in c.delta.tool_calls or []:
                got = calls.setdefault(c.index, {})
                if d.id is not None:  # a call's first delta: id, name, no arguments yet
                    assert d.index not in got and d.type == "function", d
                    assert d.id.startswith("call_") and d.function.name, d
                    got[d.index] = [d.function.name, d.function.arguments or ""]
                else:
                    assert d.function.name is None, d
                    got[d.index][1] += d.function.arguments or ""
            if c.finish_reason is not None:
                reasons[c.index] = c.finish_reason
    out = {}
    for i in content:
        got = calls.get(i, {})
        assert sorted(got) == list(range(len(got)))
        listed = [(name, args) for name, args in (got[k] for k in sorted(got))]
        for name, args in listed:
            ARGUMENTS[name].model_validate_json(args)
        out[i] = (listed, reasons.get(i), content[i])
    return out


def test_streamed_calls_equal_the_whole_response(server: Server) -> None:
    for kw in ({"tool_choice": "required", "parallel_tool_calls": False},
               {"tool_choice": ADD}):
        whole = _create(server, **kw).choices[0]
        (streamed,) = _streamed(server, **kw).values()
        assert streamed[0] == _calls(whole.message), kw
        assert streamed[1] == whole.finish_reason
        assert streamed[2] == (whole.message.content or "")
    # Sampled choices: each parsed on its own.
    for calls, reason, _ in _streamed(server, tool_choice="required", parallel_tool_calls=False,
                                      n=2, temperature=0.8, seed=3).values():
        assert len(calls) == 1 and reason == "tool_calls"


def test_auto_answers_with_text_or_calls(server: Server) -> None:
    c = _create(server, tool_choice="auto").choices[0]
    assert c.message.content or _calls(c.message), c
    if c.message.tool_calls:
        assert c.finish_reason in ("tool_calls", "length")
    # tool_choice "none": the tools are rendered, the output is neither constrained nor
    # parsed.
    c = _create(server, tool_choice="none").choices[0]
    assert c.message.tool_calls is None and c.message.content


def test_a_follow_up_turn_with_the_calls_and_their_results(server: Server) -> None:
    r = _create(server, tool_choice="required", parallel_tool_calls=False)
    message = r.choices[0].message
    (call,) = message.tool_calls or []
    history = [*QUESTION, message,  # the client's own message object, sent back as it is
               {"role": "tool", "tool_call_id": call.id,
                "content": json.dumps({"temperature": 21, "sky": "sunny"})}]
    r = _create(server, messages=history, tool_choice="auto")
    c = r.choices[0]
    assert c.message.content or _calls(c.message), c
    # The same history as plain dicts, with the assistant's content null and no tools in
    # the request: the template still renders the calls and results.
    dicts = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [{
        "id": call.id, "type": "function",
        "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        history[-1]]
    r = server.client().chat.completions.create(model=MODEL, messages=dicts, max_tokens=8,
                                                temperature=0)
    assert r.choices[0].message.content is not None
    assert r.usage is not None and r.usage.prompt_tokens > 40  # the call and result rendered


def test_speculation_stays_lossless_under_tools(server: Server) -> None:
    got = {}
    for drafter in ("none", "llma", "pld"):
        r = _create(server, tool_choice="required", extra_body=ext(drafter=drafter))
        got[drafter] = (r.choices[0].model_extra or {})["token_ids"]
    assert len({tuple(ids) for ids in got.values()}) == 1, got


# ---- 400s --------------------------------------------------------------------------------
def _tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


_CALL = {"id": "call_1", "type": "function",
         "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
_HISTORY = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [_CALL]}]
# (endpoint, fields over a chat with TOOLS, param, words the message holds)
BAD: list[tuple[str, dict[str, Any], str, tuple[str, ...]]] = [
    ("chat/completions", {"tools": [_tool("bad name")]}, "tools", ("bad name",)),
    ("chat/completions", {"tools": [_tool("add"), _tool("add")]}, "tools", ("twice",)),
    ("chat/completions", {"tools": [_tool(f"t{i}") for i in range(129)]}, "tools", ("128",)),
    ("chat/completions", {"tools": [{"type": "function"}]}, "tools", ("function",)),
    ("chat/completions", {"tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice", ("nope",)),
    ("chat/completions", {"tools": None, "tool_choice": "required"}, "tool_choice", ()),
    ("chat/completions", {"tools": None, "tool_choice": ADD}, "tool_choice", ("add",)),
    ("chat/completions", {"tool_choice": "sometimes"}, "tool_choice", ("sometimes",)),
    ("chat/completions", {"response_format": {"type": "json_object"}}, "tools",
     ("response_format",)),
    ("chat/completions", {"grammar": 'root ::= "a"'}, "tools", ("grammar",)),
    ("chat/completions", {"ignore_eos": True}, "ignore_eos", ("tools",)),
    # A schema the grammar engine refuses: its reason.
    ("chat/completions", {"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {
            "a": {"type": "nonsense"}}}}}]}, "tools", ("nonsense",)),
    ("chat/completions", {"messages": [*_HISTORY, {"role": "tool", "tool_call_id": "call_2",
                                                    "content": "3"}]},
     "messages.2.tool_call_id", ("call_2",)),
    ("chat/completions", {"messages": [*QUESTION, {"role": "tool", "tool_call_id": "call_1",
                                                    "content": "3"}]},
     "messages.1.tool_call_id", ()),
    ("chat/completions", {"messages": [*QUESTION, {"role": "assistant", "content": None,
                                                    "tool_calls": [{**_CALL, "function": {
                                                        "name": "add", "arguments": "{a: 1"}}]}]},
     "messages.1.tool_calls.0.function.arguments", ("JSON",)),
    ("chat/completions", {"messages": [*QUESTION, {"role": "assistant", "content": None,
                                                    "tool_calls": [{**_CALL, "function": {
                                                        "name": "add", "arguments": "[1]"}}]}]},
     "messages.1.tool_calls.0.function.arguments", ("object",)),
    ("chat/completions", {"messages": [*QUESTION, {"role": "tool", "content": "3"}]},
     "messages.1", ("tool_call_id",)),
    ("chat/completions", {"messages": [{"role": "assistant", "content": None}]}, "messages.0",
     ("content",)),
    ("chat/completions", {"messages": [{"role": "user", "content": "x",
                                        "tool_calls": [_CALL]}]}, "messages.0",
     ("assistant",)),
    ("completions", {"prompt": "x"}, "tools", ("unrecognized",)),
]


def test_bad_tools_are_400_naming_param(server: Server) -> None:
    with httpx.Client(base_url=f"{server.base}/v1", timeout=60) as c:
        for path, fields, param, named in BAD:
            body: dict[str, Any] = {"model": MODEL, "max_tokens": 2, "tools": TOOLS}
            if path == "chat/completions":
                body["messages"] = QUESTION
            body = {k: v for k, v in (body | fields).items() if v is not None}
            r = c.post(f"/{path}", content=json.dumps(body))
            assert r.status_code == 400, (path, fields, r.text)
            err = r.json()["error"]
            assert err["param"] == param, (fields, err)
            assert all(n in err["message"] for n in named), err
    server.wait_idle()


# ---- an agent framework ---------------------------------------------------------------
def test_a_pydantic_ai_agent_calls_a_tool_and_returns_an_object(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """An Agent on OpenAIChatModel at this server: a first step forced to the tool, a
    second to the output tool (pydantic-ai's structured output), each the model's own
    call, no network (no key, no price updates, no telemetry)."""
    try:
        import pydantic_ai  # noqa: F401  (the dev extra's agent framework)
    except ImportError:
        unavailable("pydantic-ai-slim is not installed (make install-dev installs it)")
    from pydantic_ai import Agent, RunContext
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.settings import ModelSettings

    monkeypatch.setenv("PYDANTIC_AI_NO_BANNER", "1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    class Report(BaseModel):
        city: Annotated[str, Field(max_length=24)]
        sunny: bool

    def settings(ctx: RunContext[None]) -> ModelSettings:
        return ModelSettings(temperature=0, max_tokens=MAX_TOKENS, parallel_tool_calls=False,
                             tool_choice=["get_weather"] if ctx.run_step <= 1
                             else ["final_result"])

    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=f"{server.base}/v1",
                                                           api_key="unused"))
    agent = Agent(model, output_type=Report, model_settings=settings)
    asked: list[str] = []

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return f"It is sunny in {city}."

    result = agent.run_sync("What is the weather in Paris?")
    assert isinstance(result.output, Report)
    assert len(asked) == 1 and asked[0], asked


# ---- --chat-template ------------------------------------------------------------------------
def test_chat_template_flag(server: Server, tmp_path: Any) -> None:
    """``--chat-template FILE`` replaces the model's template for every request: here the
    shipped one with another default system message, which then renders tools as the
    model's own (the log says so)."""
    import subprocess
    import sys

    from recallspec.server.tool_calls import shipped_template

    source = shipped_template().replace(
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face", "Be brief.")
    path = tmp_path / "template.jinja"
    path.write_text(source, encoding="utf-8")
    plain = {"model": MODEL, "messages": QUESTION, "max_tokens": 1, "temperature": 0}
    default = server.client().chat.completions.create(**plain).usage
    for other in start_server(tmp_path / "server.log", "--drafter", "none",
                              "--chat-template", str(path)):
        assert "tools: hermes calls (the model's template)" in other.log.read_text()
        usage = other.client().chat.completions.create(**plain).usage
        assert default is not None and usage is not None
        assert usage.prompt_tokens < default.prompt_tokens  # the shorter system message
        c = other.client().chat.completions.create(
            **plain | {"max_tokens": MAX_TOKENS}, tools=TOOLS, tool_choice="required",
            parallel_tool_calls=False).choices[0]
        assert len(_calls(c.message)) == 1 and c.finish_reason == "tool_calls"
    missing = subprocess.run(
        [sys.executable, "-m", "recallspec", "serve", "--chat-template",
         str(tmp_path / "missing.jinja")], capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "--chat-template" in missing.stderr, missing.stderr
