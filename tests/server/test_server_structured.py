"""Structured outputs through a real `recallspec serve` and the official ``openai`` client:
``response_format`` (``json_schema`` through ``client.chat.completions.parse`` and its
streaming twin, ``json_object``, on chat and completions), llama-server's ``grammar``
and ``json_schema``, and ``recallspec.regex``: every output parses and validates (or
matches), streamed and not, greedy the same tokens with and without speculation, and
every malformed, conflicting or uncompilable guide a 400 naming ``param`` (the field
rules without a model: ``test_protocol_structured.py``)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Annotated, Any

import httpx
import openai
import pytest
from helpers.server import MODEL, Server, ext, start_server
from pydantic import BaseModel, ConfigDict, Field

pytestmark = [pytest.mark.server, pytest.mark.slow]

MAX_TOKENS = 160  # room for a whole object: parse() refuses a "length" one
QUESTION = ("Describe the city of Paris as a JSON object with its name, its country, its "
            "population in millions and whether it is a capital.")
YES_NO = 'root ::= "yes" | "no"'
PHONE = "[0-9]{3}-[0-9]{4}"


class City(BaseModel):
    """The schema the tests ask for (bounded strings and numbers: a small model cannot
    run past MAX_TOKENS inside one field)."""

    model_config = ConfigDict(extra="forbid")
    name: Annotated[str, Field(max_length=32)]
    country: Annotated[str, Field(max_length=32)]
    population_millions: Annotated[int, Field(ge=0, le=100)]
    capital: bool


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from start_server(tmp_path_factory.mktemp("serve") / "server.log",
                            "--drafter", "pld", "--mode", "fixed", "--max-batch-size", "8")


def _chat(content: str = QUESTION) -> list[Any]:
    return [{"role": "user", "content": content}]


def _city_format() -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {
        "name": "City", "strict": True, "schema": City.model_json_schema()}}


# ---- JSON schemas and objects ----------------------------------------------------------
def test_chat_parse_gives_a_valid_object(server: Server) -> None:
    r = server.client().chat.completions.parse(
        model=MODEL, messages=_chat(), response_format=City, max_tokens=MAX_TOKENS,
        temperature=0)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "stop", msg.content
    assert isinstance(msg.parsed, City), msg.content
    assert msg.content is not None and City.model_validate_json(msg.content) == msg.parsed


def test_chat_stream_gives_the_same_valid_object(server: Server) -> None:
    client = server.client()
    whole = client.chat.completions.parse(
        model=MODEL, messages=_chat(), response_format=City, max_tokens=MAX_TOKENS,
        temperature=0)
    with client.chat.completions.stream(
            model=MODEL, messages=_chat(), response_format=City, max_tokens=MAX_TOKENS,
            temperature=0) as stream:
        pieces = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    content = "".join(pieces)
    assert content == whole.choices[0].message.content
    assert final.choices[0].message.parsed == City.model_validate_json(content)
    # The same through plain create(stream=True) with the format as a dict.
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=_chat(), response_format=_city_format(),
        max_tokens=MAX_TOKENS, temperature=0, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_speculation_stays_lossless_under_a_schema(server: Server) -> None:
    """Greedy under a guide: the same tokens with speculation off and with drafters on."""
    client = server.client()
    got = {}
    for drafter in ("none", "pld", "sam", "recycling"):
        r = client.chat.completions.create(
            model=MODEL, messages=_chat(), response_format=_city_format(),
            max_tokens=MAX_TOKENS, temperature=0, extra_body=ext(drafter=drafter))
        got[drafter] = (r.choices[0].model_extra or {})["token_ids"]
        City.model_validate_json(r.choices[0].message.content or "")
    assert len({tuple(ids) for ids in got.values()}) == 1, got


def test_json_object_and_seeded_choices(server: Server) -> None:
    client = server.client()
    r = client.chat.completions.create(
        model=MODEL, messages=_chat('Reply with this JSON object: {"animal": "cat", "legs": 4}'),
        response_format={"type": "json_object"}, max_tokens=MAX_TOKENS, temperature=0)
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content or ""), dict)
    # Sampled, n choices: each choice is held to the guide (each has its own matcher).
    r = client.chat.completions.create(
        model=MODEL, messages=_chat(), response_format=_city_format(),
        max_tokens=MAX_TOKENS, temperature=0.8, seed=7, n=3)
    assert len(r.choices) == 3
    for c in r.choices:
        assert c.finish_reason == "stop", c.message.content
        City.model_validate_json(c.message.content or "")


def test_completions_take_response_format(server: Server) -> None:
    client = server.client()
    prompt = 'Rome as JSON: {"city": "Rome", "country": "Italy"}\nParis as JSON: '
    r = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
        extra_body={"response_format": _city_format()})
    assert r.choices[0].finish_reason == "stop", r.choices[0].text
    City.model_validate_json(r.choices[0].text)
    chunks = list(client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True,
        extra_body={"response_format": {"type": "json_object"}}))
    obj = json.loads("".join(c.choices[0].text for c in chunks if c.choices))
    assert isinstance(obj, dict)
    # llama-server's json_object with a schema, and its top-level json_schema.
    for body in ({"response_format": {"type": "json_object", "schema": City.model_json_schema()}},
                 {"json_schema": City.model_json_schema()}):
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS,
                                      temperature=0, extra_body=body)
        City.model_validate_json(r.choices[0].text)


def test_length_can_cut_the_json_short(server: Server) -> None:
    """As OpenAI's: ``max_tokens`` still ends the request, with a prefix of valid JSON."""
    r = server.client().chat.completions.create(
        model=MODEL, messages=_chat(), response_format=_city_format(),
        max_tokens=3, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "length" and (c.message.content or "").lstrip().startswith("{")
    with pytest.raises(openai.LengthFinishReasonError):
        server.client().chat.completions.parse(
            model=MODEL, messages=_chat(), response_format=City, max_tokens=3, temperature=0)


# ---- grammars and regular expressions --------------------------------------------------
def _answer(client: openai.OpenAI, chat: bool, stream: bool, body: dict[str, Any],
            ) -> tuple[str, str | None]:
    """(text, finish_reason) of a greedy 16-token request with ``body`` added."""
    kw: dict[str, Any] = {"model": MODEL, "max_tokens": 16, "temperature": 0,
                          "extra_body": body, "stream": stream}
    if chat:
        out: Any = client.chat.completions.create(
            messages=_chat("Is Paris in France? Or give a phone number."), **kw)
    else:
        out = client.completions.create(prompt="Question: is water wet? Answer:", **kw)
    chunks = [c for c in out if c.choices] if stream else [out]
    if not chat:
        text = "".join(c.choices[0].text for c in chunks)
    elif stream:
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
    else:
        text = out.choices[0].message.content or ""
    return text, chunks[-1].choices[0].finish_reason


def test_gbnf_and_regex_outputs_match(server: Server) -> None:
    client = server.client()
    for chat in (True, False):
        for body, pattern in (({"grammar": YES_NO}, "yes|no"), (ext(regex=PHONE), PHONE)):
            for stream in (False, True):
                text, reason = _answer(client, chat, stream, body)
                assert re.fullmatch(pattern, text), (chat, body, stream, text)
                assert reason == "stop", (chat, body, stream, text)


# ---- 400s --------------------------------------------------------------------------------
SCHEMA = City.model_json_schema()
# (endpoint, fields, param, what the message names besides param)
BAD: list[tuple[str, dict[str, Any], str, tuple[str, ...]]] = [
    # Two guides: the second named as param, both in the message.
    ("chat/completions", {"response_format": {"type": "json_object"}, "grammar": YES_NO},
     "grammar", ("response_format",)),
    ("completions", {"json_schema": SCHEMA, "recallspec": {"regex": PHONE}},
     "recallspec.regex", ("json_schema",)),
    ("chat/completions", {"grammar": YES_NO, "json_schema": SCHEMA}, "json_schema",
     ("grammar",)),
    # A guide with ignore_eos.
    ("chat/completions", {"response_format": _city_format(), "ignore_eos": True}, "ignore_eos",
     ("response_format",)),
    ("completions", {"grammar": YES_NO, "ignore_eos": True}, "ignore_eos", ("grammar",)),
    # Guides that do not compile: the engine's reason.
    ("chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "nonsense"}}}}, "response_format", ("nonsense",)),
    ("completions", {"response_format": {"type": "json_object",
                                         "schema": {"type": "nonsense"}}}, "response_format",
     ("nonsense",)),
    ("completions", {"json_schema": {"type": "nonsense"}}, "json_schema", ("nonsense",)),
    ("chat/completions", {"recallspec": {"regex": "[0-9"}}, "recallspec.regex", ()),
    ("completions", {"grammar": "root ::= missing_rule"}, "grammar", ("missing_rule",)),
    # Malformed response_format or regex.
    ("chat/completions", {"response_format": {"type": "nonsense"}}, "response_format.type",
     ("json_schema",)),
    ("completions", {"response_format": {"type": "json_schema"}}, "response_format", ()),
    ("chat/completions", {"response_format": {"type": "json_schema",
                                              "json_schema": {"schema": SCHEMA}}},
     "response_format.json_schema.name", ()),
    ("chat/completions", {"response_format": {"type": "json_schema",
                                              "json_schema": {"name": "my city"}}},
     "response_format.json_schema.name", ()),
    ("completions", {"response_format": {"type": "json_schema",
                                         "json_schema": {"name": "c" * 65}}},
     "response_format.json_schema.name", ()),
    ("chat/completions", {"recallspec": {"regex": ""}}, "recallspec.regex", ()),
]


def test_bad_guides_are_400_naming_param(server: Server) -> None:
    with httpx.Client(base_url=f"{server.base}/v1", timeout=60) as c:
        for path, fields, param, named in BAD:
            body: dict[str, Any] = {"model": MODEL, "max_tokens": 2}
            if path == "completions":
                body["prompt"] = "x"
            else:
                body["messages"] = _chat("x")
            r = c.post(f"/{path}", content=json.dumps(body | fields))
            assert r.status_code == 400, (path, fields, r.text)
            err = r.json()["error"]
            assert err["param"] == param, (path, fields, err)
            assert err["message"].startswith(f"{param}: ") and len(err["message"]) > len(
                param) + 2, err
            assert all(n in err["message"] for n in named), err
    # The server answers a good guided request afterwards, and nothing was left running.
    r = server.client().completions.create(model=MODEL, prompt="Yes or no?", max_tokens=4,
                                           temperature=0, extra_body={"grammar": YES_NO})
    assert r.choices[0].text in ("yes", "no")
    server.wait_idle()
