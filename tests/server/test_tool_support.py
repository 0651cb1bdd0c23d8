"""server/tool_support.py without a server: which template renders requests with tools
(the model's where it renders tools, the shipped ChatML one for ChatML without tools,
the model's with the tools in the system message otherwise, none without a template),
the prompts it renders, the guide it sets; and the protocol's tool fields
(``ChatRequest.tool_request``, ``chat_messages``). Through a real server:
test_server_tools.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from recallspec.models.tokenizer import Tokenizer
from recallspec.server import protocol as P
from recallspec.server.tool_calls import shipped_template
from recallspec.server.tool_support import NO_TEMPLATE, ToolSupport, generic_messages

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}}}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
QUESTION = {"role": "user", "content": "Weather in Paris?"}
HISTORY = [QUESTION, {"role": "assistant", "content": None, "tool_calls": [CALL]},
           {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
# A template of no family that renders no tools (Gemma's layout, shortened).
PLAIN = ("{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n"
         "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


@pytest.fixture(scope="module")
def smollm() -> Tokenizer:
    from recallspec.models.loader import load_tokenizer

    return load_tokenizer("smollm2-135m")


def _sub(**fields: Any) -> P.Submission:
    body = {"model": "m", "messages": [QUESTION], **fields}
    req = P.ChatRequest.model_validate_json(json.dumps(body))
    return P.submission(req, max_len=2048, vocab_size=49152)


# ---- which template ----------------------------------------------------------------------
def test_smollm2_gets_the_shipped_template(smollm: Tokenizer) -> None:
    ts = ToolSupport.of(smollm)
    assert (ts.origin, ts.family, dict(ts.special_tokens)) == ("shipped", "hermes", {})
    assert not ts.described  # a tool without a description renders as given (tojson)
    assert ts.renderer is not smollm and ts.renderer.chat_template == shipped_template()
    assert "chatml_tools.jinja" in ts.describe()
    # Without tools the shipped template renders SmolLM2's conversations as its own does
    # (requests without tools keep SmolLM2's template anyway).
    for chat in ([QUESTION], [{"role": "system", "content": "Be brief."}, QUESTION],
                 [QUESTION, {"role": "assistant", "content": "Sunny."}, QUESTION]):
        for prompt in (True, False):
            assert ts.renderer.apply_chat_template(chat, prompt) == smollm.apply_chat_template(
                chat, prompt)


def test_a_template_with_tools_is_used_as_it_is(smollm: Tokenizer) -> None:
    own = smollm.with_chat_template(shipped_template())  # as --chat-template gives it
    assert own.eos_token_ids == smollm.eos_token_ids and own.chat_template == shipped_template()
    ts = ToolSupport.of(own)
    assert (ts.origin, ts.family, ts.renderer, ts.described) == ("model", "hermes", own, False)


def test_other_templates_get_the_tools_in_the_system_message(smollm: Tokenizer) -> None:
    plain = smollm.with_chat_template(PLAIN)
    ts = ToolSupport.of(plain)
    assert (ts.origin, ts.family) == ("generic", "generic")
    sub = ts.prepare(_sub(messages=HISTORY, tools=[WEATHER], tool_choice="required"), smollm)
    text = smollm.decode(sub.prompt)  # type: ignore[arg-type]
    assert text.startswith("<start_of_turn>system\nYou can call these tools")
    assert '"name": "get_weather"' in text
    assert ('<start_of_turn>assistant\n{"tool_calls": [{"name": "get_weather", "arguments": '
            '{"city": "Paris"}}]}<end_of_turn>') in text
    assert '{"tool_response": {"name": "get_weather", "tool_call_id": "call_1", ' in text
    assert sub.guide_param == "tools" and sub.params.guide is not None
    assert '"tool_calls"' in sub.params.guide.source


def test_generic_messages_merge_results_and_keep_the_system_message() -> None:
    out = generic_messages([{"role": "system", "content": "Be brief."}, *HISTORY[:2],
                            HISTORY[2], {**HISTORY[2], "content": "warm"}], ())
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"] == "Be brief." and out[-1]["content"].count("tool_response") == 2


def test_no_template_refuses_tools(smollm: Tokenizer) -> None:
    ts = ToolSupport.of(object())
    assert ts.renderer is None and ts.origin == "none"
    with pytest.raises(P.ParamError) as e:
        ts.prepare(_sub(tools=[WEATHER]), smollm)
    assert e.value.param == "tools" and str(e.value) == f"tools: {NO_TEMPLATE}"
    with pytest.raises(P.ParamError) as e:
        ts.prepare(_sub(messages=HISTORY), smollm)
    assert e.value.param == "messages" and "--chat-template" in str(e.value)
    plain = _sub()
    assert ts.prepare(plain, smollm) is plain  # no tools: nothing to do


# ---- what prepare makes of a request -------------------------------------------------------
def test_prepare_renders_tools_and_sets_the_guide(smollm: Tokenizer) -> None:
    ts = ToolSupport.of(smollm)
    plain = _sub()
    assert ts.prepare(plain, smollm) is plain
    sub = ts.prepare(_sub(tools=[WEATHER], tool_choice="required",
                          parallel_tool_calls=False), smollm)
    text = smollm.decode(sub.prompt)  # type: ignore[arg-type]
    assert "<tools>\n" + json.dumps(WEATHER) + "\n</tools>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert sub.guide_param == "tools" and sub.params.guide is not None
    assert sub.params.guide.kind == "llguidance" and "(\"\\n\" call)*" not in (
        sub.params.guide.source)  # one call only
    # "none": the tools rendered, no guide, no parsing.
    none = ts.prepare(_sub(tools=[WEATHER], tool_choice="none"), smollm)
    assert none.prompt == sub.prompt and none.params.guide is None
    assert none.tools is not None and not none.tools.calls
    # A history of calls and results without tools: rendered by the shipped template.
    hist = ts.prepare(_sub(messages=HISTORY), smollm)
    text = smollm.decode(hist.prompt)  # type: ignore[arg-type]
    assert ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n'
            '</tool_response><|im_end|>') in text
    assert "<tools>" not in text and hist.params.guide is None


def test_special_token_id(smollm: Tokenizer) -> None:
    assert smollm.special_token_id("<|im_start|>") == 1
    assert smollm.special_token_id("<tool_call>") is None  # not a token of SmolLM2
    assert smollm.special_token_id("the") is None  # a token, not a special one


# ---- the protocol's fields -------------------------------------------------------------------
def test_tool_request_and_messages() -> None:
    sub = _sub(messages=[{"role": "developer", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, *HISTORY],
        tools=[WEATHER])
    assert sub.tools is not None and sub.tools.choice.mode == "auto" and sub.tools.parallel
    assert sub.prompt[0] == {"role": "system", "content": "ab"}
    assert sub.prompt[2] == {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    assert sub.prompt[3] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
    assert P.uses_tools(sub.prompt) and not P.uses_tools([QUESTION])
    assert _sub(tools=[]).tools is None and _sub(tool_choice="none").tools is None
    assert not _sub(tools=[WEATHER], parallel_tool_calls=False).tools.parallel  # type: ignore[union-attr]


@pytest.mark.parametrize(("fields", "param"), [
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": "all"}, "tools"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
     "tool_choice"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "tools"),
    ({"tools": [WEATHER], "json_schema": {}}, "tools"),
    ({"tools": [WEATHER], "ignore_eos": True}, "ignore_eos"),
    ({"messages": [*HISTORY[:2], {**HISTORY[2], "tool_call_id": "call_9"}]},
     "messages.2.tool_call_id"),
    ({"messages": [HISTORY[0], {**HISTORY[1], "tool_calls": [
        {**CALL, "function": {"name": "get_weather", "arguments": "{"}}]}]},
     "messages.1.tool_calls.0.function.arguments"),
])
def test_bad_tool_fields_are_param_errors(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(P.ParamError) as e:
        _sub(**fields)
    assert e.value.param == param, str(e.value)


def test_tool_choice_none_combines_with_another_guide() -> None:
    sub = _sub(tools=[WEATHER], tool_choice="none", response_format={"type": "json_object"})
    assert sub.guide_param == "response_format" and sub.tools is not None
