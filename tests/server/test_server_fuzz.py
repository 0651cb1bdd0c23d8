"""Fuzzed request bodies (hypothesis) against a live `recallspec serve`: never a 500,
an OpenAI error body for every refusal, no request left holding a slot, and a correct
answer afterwards. The bodies cover the structured-output fields too (good and bad
guides, two at once, a guide with ``ignore_eos``), and the tool-calling ones (tools,
``tool_choice``, ``parallel_tool_calls``)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers.server import MODEL, Server, ext, start_server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recallspec.decoding.sampling import SamplingParams

pytestmark = [pytest.mark.server, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from start_server(tmp_path_factory.mktemp("serve") / "server.log",
                            "--drafter", "pld", "--mode", "fixed", "--max-batch-size", "8")


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids,
                                                              max_size=3),
    max_leaves=8,
)


_text = st.text(min_size=1, max_size=20)
_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}}}}
_options = {  # optional fields and valid values for them
    "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "top_k": st.integers(-1, 80),
    "seed": st.integers(-(2**63), 2**64 - 1), "stop": _text | st.lists(_text, max_size=3),
    "stream": st.booleans(), "stream_options": st.fixed_dictionaries(
        {"include_usage": st.booleans()}), "ignore_eos": st.booleans(), "n": st.integers(1, 3),
    "logprobs": st.none(), "user": _text, "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2), "repeat_penalty": st.floats(0.5, 2),
    "repeat_last_n": st.integers(-1, 100),
    "recallspec": st.fixed_dictionaries({}, optional={
        "drafter": st.sampled_from(["none", "pld", "llma", "sam", "recycling"]),
        "mode": st.sampled_from(["adaptive", "fixed"]),
        "return_token_ids": st.booleans(),
        "regex": st.sampled_from(["[0-9]{3}-[0-9]{4}", "(yes|no)", "[a-z ]+\\."])}),
    # Structured outputs (two guides, or one with ignore_eos, are 400s: fuzzed too).
    "response_format": st.sampled_from([
        {"type": "text"}, {"type": "json_object"},
        {"type": "json_object", "schema": {"type": "object", "properties": {
            "a": {"type": "integer"}}}},
        {"type": "json_schema", "json_schema": {"name": "pair", "strict": True, "schema": {
            "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
            "required": ["a", "b"], "additionalProperties": False}}},
        {"type": "json_schema", "json_schema": {"name": "any-object"}}]),
    "grammar": st.sampled_from(['root ::= "yes" | "no"', 'root ::= [0-9]+ "." [0-9]*', ""]),
    "json_schema": st.sampled_from([{}, {"type": "integer"},
                                    {"type": "array", "items": {"type": "boolean"}}]),
    # Tool calling (chat only; with another guide or ignore_eos, or a choice without
    # tools, a 400: fuzzed too).
    "tools": st.sampled_from([[], [_TOOL], [_TOOL, {"type": "function", "function": {
        "name": "add", "parameters": {"type": "object", "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer"}}}}}]]),
    "tool_choice": st.sampled_from(["none", "auto", "required", {
        "type": "function", "function": {"name": "get_weather"}}]),
    "parallel_tool_calls": st.booleans(),
}
_wrong = {  # values that must be refused
    "model": st.sampled_from(["gpt-4", "", 3, None]),
    "max_tokens": st.sampled_from([0, -1, "2", 2.5, True, 10**30 * 1.0]),
    "temperature": st.sampled_from([-0.1, 2.5, "1", [1]]), "top_p": st.sampled_from([0, 1.5, -1]),
    "top_k": st.integers(-(2**40), -2), "seed": st.sampled_from([2**64, -(2**63) - 1, 1.5]),
    "stop": st.sampled_from(["", [""], [1], ["a"] * 17]),
    "n": st.sampled_from([0, 17, "2", 1.5]), "logprobs": st.sampled_from([6, -1, "yes"]),
    "top_logprobs": st.sampled_from([21, -1, "3"]), "logit_bias": st.just({"1": 5}),
    "echo": st.just(True), "best_of": st.just(2), "tools": st.just([{}]),
    "stream": st.sampled_from(["yes", 2]), "frequency_penalty": st.sampled_from([2.5, "0"]),
    "presence_penalty": st.sampled_from([-2.1, "1", [1]]),
    "repeat_penalty": st.sampled_from([0, -1.0]), "repeat_last_n": st.sampled_from([-2, 1.5]),
    "recallspec": st.sampled_from([{"drafter": "nope"}, {"mode": "nope"}, {"drafter": 5},
                                   {"mode": "vanilla"},  # a batch layout: no mode of ours
                                   {"drafter": "sam", "drafter_options": {"index": "/x"}},
                                   {"drafter": "pld", "drafter_options": {"max_ngram": 0}},
                                   {"drafter": "pld", "drafter_options": {"k": [1]}},
                                   {"extra": 1}, {"regex": "[0-9"}, {"regex": ""},
                                   {"regex": 5}]),
    "response_format": st.sampled_from([
        {"type": "json"}, {"type": "json_schema"}, {"type": "json_schema", "json_schema": {}},
        {"type": "json_schema", "json_schema": {"name": "a b"}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
        {"type": "json_object", "schema": []}, "json_object", {"type": "text", "x": 1}]),
    "grammar": st.sampled_from(["root ::= missing_rule", 'root ::= "unclosed', 5, ["a"]]),
    "json_schema": st.sampled_from([{"type": "nonsense"}, "{}", []]),
    "tool_choice": st.sampled_from(["sometimes", {"type": "function"}, 5,
                                    {"type": "function", "function": {"name": "nope"}}]),
    "parallel_tool_calls": st.sampled_from(["yes", 1]),
}


@st.composite
def request_bodies(draw: Any) -> tuple[str, bytes]:
    """A request body: a well-formed OpenAI request, most with a few fields broken
    (wrong values or types, missing or unknown fields), or JSON or bytes at random."""
    chat = draw(st.booleans())
    path = "chat/completions" if chat else "completions"
    kind = draw(st.sampled_from(["junk", "json"] + ["request"] * 8))
    if kind == "junk":
        return path, draw(st.binary(max_size=40) | st.text(max_size=40).map(str.encode))
    if kind == "json":
        return path, json.dumps(draw(_json)).encode()
    body: dict[str, Any] = {"model": MODEL}
    if chat:
        part = st.fixed_dictionaries({"type": st.just("text"), "text": _text})
        msg = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                     "content": _text | st.lists(part, min_size=1, max_size=2)})
        body["messages"] = [*draw(st.lists(msg, max_size=2)), {"role": "user",
                                                               "content": draw(_text)}]
    else:
        body["prompt"] = draw(_text | st.lists(st.integers(0, 49151), min_size=1, max_size=5))
    # Always a small budget: no body may leave the server generating for long.
    body["max_tokens"] = draw(st.integers(1, 3))
    for key in draw(st.lists(st.sampled_from(sorted(_options)), unique=True, max_size=5)):
        body[key] = draw(_options[key])
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2]))):  # break the request
        how = draw(st.sampled_from(["wrong", "wrong", "json", "drop", "unknown"]))
        if how == "wrong":
            key = draw(st.sampled_from(sorted(_wrong)))
            body[key] = draw(_wrong[key])
        elif how == "json":
            body[draw(st.sampled_from(sorted(body)))] = draw(_json)
        elif how == "drop":
            body.pop(draw(st.sampled_from(["model", "messages" if chat else "prompt"])), None)
        else:
            body[draw(st.text(min_size=1, max_size=8))] = draw(_json)
    mt = body.get("max_tokens")
    if isinstance(mt, int) and not isinstance(mt, bool) and mt > 3:
        body["max_tokens"] = 3  # a random JSON value may have made it large
    if chat and not isinstance(body.get("max_tokens"), int):
        body["max_completion_tokens"] = 2  # a refused max_tokens must not mean "unbounded"
    return path, json.dumps(body).encode()


def test_fuzzed_bodies_never_break_the_server(server: Server, engine: Any) -> None:
    seen: dict[int, int] = defaultdict(int)
    with httpx.Client(base_url=f"{server.base}/v1", timeout=60) as c:

        @settings(max_examples=520, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(request_bodies())
        def check(case: tuple[str, bytes]) -> None:
            path, body = case
            r = c.post(f"/{path}", content=body, headers={"Content-Type": "application/json"})
            seen[r.status_code] += 1
            assert r.status_code < 500, (body, r.text)
            if r.status_code != 200:
                assert isinstance(r.json()["error"]["message"], str), r.text
            elif r.headers["content-type"].startswith("text/event-stream"):
                assert r.text.rstrip().endswith("data: [DONE]"), r.text
            else:
                assert r.json()["choices"], r.text

        check()
    assert sum(seen.values()) >= 500 and seen[200] >= 50 and seen[400] >= 100, dict(seen)
    server.wait_idle()  # no request left running or waiting
    question = "Explain in two sentences why the sky is blue."
    want = engine.generate(engine.encode_prompt(question, chat=True),
                           SamplingParams(max_new_tokens=32), drafter="pld")
    r = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=32,
        temperature=0, extra_body=ext(drafter="sam"))
    assert (r.choices[0].model_extra or {})["token_ids"] == want.token_ids


