"""Structured-output request fields without a model: ``submission`` builds the right
``Guide`` from each field (and the field it came from), and the routes answer every
malformed, conflicting or uncompilable guide with a 400 naming ``param``, before
anything reaches the engine. The routes run over a stand-in engine whose guide cache
refuses marked guides as the grammar package does (``GrammarError``); the real grammar
and model: ``test_server_structured.py``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from recallspec.decoding.masks import MAX_GUIDE_BYTES, Guide
from recallspec.grammar import GrammarError
from recallspec.server import protocol as P
from recallspec.server.app import create_app
from recallspec.server.engine_loop import Rejected, RequestStream

MODEL = "m"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
          "required": ["a", "b"], "additionalProperties": False}
UNCOMPILABLE = "uncompilable"  # the stand-in cache refuses any guide whose source holds this


def _body(chat: bool, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": MODEL, "max_tokens": 4}
    if chat:
        base["messages"] = [{"role": "user", "content": "x"}]
    else:
        base["prompt"] = "x"
    return base | fields


def _sub(chat: bool, **fields: Any) -> P.Submission:
    cls = P.ChatRequest if chat else P.CompletionRequest
    req = cls.model_validate_json(json.dumps(_body(chat, **fields)))
    return P.submission(req, max_len=2048, vocab_size=49152)


# ---- submission: the guide each field gives ------------------------------------------
GUIDES: list[tuple[dict[str, Any], Guide | None, str | None]] = [
    ({}, None, None),
    ({"response_format": {"type": "text"}}, None, None),
    ({"response_format": {"type": "json_object"}}, Guide.json_object(), "response_format"),
    ({"response_format": {"type": "json_object", "schema": SCHEMA}}, Guide.json_object(SCHEMA),
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "Pair_1-x",
                                                                 "schema": SCHEMA}}},
     Guide.json_schema(SCHEMA), "response_format"),
    # Every optional field; the schema is enforced whatever ``strict`` says.
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "p", "description": "a pair", "schema": SCHEMA, "strict": False}}},
     Guide.json_schema(SCHEMA), "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": None,
                                                                 "schema": SCHEMA}}},
     Guide.json_schema(SCHEMA), "response_format"),
    # No schema: any JSON object.
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p"}}},
     Guide.json_object(), "response_format"),
    ({"grammar": 'root ::= "yes" | "no"'}, Guide("gbnf", 'root ::= "yes" | "no"'), "grammar"),
    ({"grammar": ""}, None, None),  # llama-server's neutral value
    ({"json_schema": SCHEMA}, Guide.json_schema(SCHEMA), "json_schema"),
    ({"json_schema": {}}, Guide.json_schema({}), "json_schema"),  # any JSON value
    ({"recallspec": {"regex": "[0-9]{3}-[0-9]{4}"}}, Guide("regex", "[0-9]{3}-[0-9]{4}"),
     "recallspec.regex"),
    # A free-text response_format beside another guide is no second guide.
    ({"response_format": {"type": "text"}, "grammar": "root ::= \"a\""},
     Guide("gbnf", 'root ::= "a"'), "grammar"),
]


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
@pytest.mark.parametrize(("fields", "guide", "param"), GUIDES)
def test_each_field_gives_its_guide(chat: bool, fields: dict[str, Any], guide: Guide | None,
                                    param: str | None) -> None:
    sub = _sub(chat, **fields)
    assert sub.params.guide == guide
    assert sub.guide_param == param


def test_equal_schemas_give_equal_guides_and_every_choice_has_it() -> None:
    a = _sub(True, json_schema=SCHEMA, n=3, seed=5)
    b = _sub(True, response_format={"type": "json_schema",
                                    "json_schema": {"name": "x", "schema": dict(SCHEMA)}})
    assert a.params.guide == b.params.guide  # one cache entry for both
    # Property order is the output's order (as OpenAI keeps it): another guide.
    swapped = {**SCHEMA, "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}
    assert _sub(True, json_schema=swapped).params.guide != a.params.guide
    assert all(a.choice_params(i).guide == a.params.guide for i in range(3))
    assert [a.choice_params(i).seed for i in range(3)] == [5, 6, 7]


# ---- submission: conflicts -----------------------------------------------------------
CONFLICTS: list[tuple[dict[str, Any], str, tuple[str, ...]]] = [
    ({"response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""}, "grammar",
     ("response_format", "grammar")),
    ({"grammar": "root ::= \"a\"", "json_schema": SCHEMA}, "json_schema",
     ("grammar", "json_schema")),
    ({"json_schema": SCHEMA, "recallspec": {"regex": "a+"}}, "recallspec.regex",
     ("json_schema", "recallspec.regex")),
    ({"response_format": {"type": "json_object"}, "recallspec": {"regex": "a+"}},
     "recallspec.regex", ("response_format", "recallspec.regex")),
    ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos",
     ("ignore_eos", "response_format")),
    ({"recallspec": {"regex": "a+"}, "ignore_eos": True}, "ignore_eos",
     ("ignore_eos", "recallspec.regex")),
    ({"recallspec": {"regex": "a" * (MAX_GUIDE_BYTES + 1)}}, "recallspec.regex",
     ("recallspec.regex", str(MAX_GUIDE_BYTES))),
    ({"grammar": "root ::= \"" + "a" * MAX_GUIDE_BYTES + "\""}, "grammar", ("grammar",)),
]


@pytest.mark.parametrize(("fields", "param", "named"), CONFLICTS)
def test_conflicting_or_oversized_guides_are_param_errors(
        fields: dict[str, Any], param: str, named: tuple[str, ...]) -> None:
    with pytest.raises(P.ParamError) as e:
        _sub(True, **fields)
    assert e.value.param == param
    assert all(n in str(e.value) for n in named), str(e.value)


def test_ignore_eos_without_a_guide_stays_allowed() -> None:
    assert _sub(False, ignore_eos=True, response_format={"type": "text"}).params.ignore_eos


# ---- the routes: every 400 names its param, nothing bad reaches the engine -----------
@dataclass
class _Guides:
    """The engine's guide cache as the routes see it: records each compile; refuses
    (GrammarError) a guide whose source holds UNCOMPILABLE."""

    calls: list[tuple[Guide, Any, int]] = field(default_factory=list)

    def compile(self, guide: Guide, tokenizer: Any, *, vocab_size: int) -> object:
        self.calls.append((guide, tokenizer, vocab_size))
        if UNCOMPILABLE in guide.source:
            raise GrammarError(f"invalid {guide.kind}: {UNCOMPILABLE} is no such thing")
        return object()


class _Loop:
    """An EngineLoop stand-in: records the submissions, answers each with a 429 (the
    tests look at what was submitted, not at generation)."""

    def __init__(self) -> None:
        self.engine = SimpleNamespace(
            max_len=2048, model=SimpleNamespace(config=SimpleNamespace(vocab_size=49152)),
            tokenizer=object(), guides=_Guides(), curves=SimpleNamespace(state="none"))
        self.submitted: list[P.Submission] = []

    def submit(self, streams: Sequence[RequestStream]) -> None:
        self.submitted.append(streams[0].sub)
        for s in streams:
            s.post(Rejected(429, "busy (stand-in)"))

    def abort(self, stream: RequestStream) -> None:
        pass

    def is_alive(self) -> bool:
        return True


@pytest.fixture
def routes() -> Iterator[tuple[TestClient, _Loop]]:
    loop = _Loop()
    with TestClient(create_app(loop, model_name=MODEL)) as client:  # type: ignore[arg-type]
        yield client, loop


BAD: list[tuple[bool, dict[str, Any], str]] = [
    # Malformed response_format.
    (True, {"response_format": {"type": "nonsense"}}, "response_format.type"),
    (False, {"response_format": {"type": "json"}}, "response_format.type"),
    (True, {"response_format": "json_object"}, "response_format"),
    (True, {"response_format": {}}, "response_format.type"),
    (True, {"response_format": {"type": "json_schema"}}, "response_format"),
    (True, {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
     "response_format.json_schema.name"),
    (True, {"response_format": {"type": "json_schema", "json_schema": {"name": "a pair"}}},
     "response_format.json_schema.name"),
    (True, {"response_format": {"type": "json_schema", "json_schema": {"name": ""}}},
     "response_format.json_schema.name"),
    (True, {"response_format": {"type": "json_schema", "json_schema": {"name": "x" * 65}}},
     "response_format.json_schema.name"),
    (True, {"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                       "strict": "yes"}}},
     "response_format.json_schema.strict"),
    (True, {"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                       "schema": "{}"}}},
     "response_format.json_schema.schema"),
    (True, {"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                       "extra": 1}}},
     "response_format.json_schema.extra"),
    (True, {"response_format": {"type": "text", "json_schema": {"name": "x"}}},
     "response_format"),
    (True, {"response_format": {"type": "json_schema", "schema": SCHEMA,
                                "json_schema": {"name": "x"}}}, "response_format"),
    (False, {"response_format": {"type": "json_object", "format": "x"}},
     "response_format.format"),
    # Malformed llama-server fields and recallspec.regex.
    (True, {"grammar": 5}, "grammar"),
    (False, {"json_schema": "{}"}, "json_schema"),
    (False, {"json_schema": [SCHEMA]}, "json_schema"),
    (True, {"recallspec": {"regex": ""}}, "recallspec.regex"),
    (False, {"recallspec": {"regex": 7}}, "recallspec.regex"),
    # Conflicts.
    (True, {"grammar": "root ::= \"a\"", "json_schema": SCHEMA}, "json_schema"),
    (False, {"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos"),
    (True, {"json_schema": {"maximum": float("nan")}}, "json_schema"),  # no JSON
    # Guides that do not compile: the cache's reason, the field the guide came from.
    (True, {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": UNCOMPILABLE}}}}, "response_format"),
    (False, {"response_format": {"type": "json_object", "schema": {"type": UNCOMPILABLE}}},
     "response_format"),
    (True, {"grammar": f"root ::= {UNCOMPILABLE}"}, "grammar"),
    (False, {"json_schema": {"type": UNCOMPILABLE}}, "json_schema"),
    (True, {"recallspec": {"regex": f"[{UNCOMPILABLE}"}}, "recallspec.regex"),
]


@pytest.mark.parametrize(("chat", "fields", "param"), BAD)
def test_bad_guides_are_400_naming_param_before_the_engine(
        routes: tuple[TestClient, _Loop], chat: bool, fields: dict[str, Any],
        param: str) -> None:
    client, loop = routes
    path = "/v1/chat/completions" if chat else "/v1/completions"
    r = client.post(path, content=json.dumps(_body(chat, **fields)))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert err["type"] == "invalid_request_error" and err["message"], err
    if UNCOMPILABLE in json.dumps(fields):
        assert f"{UNCOMPILABLE} is no such thing" in err["message"], err  # the engine's reason
    assert not loop.submitted


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_a_good_guide_is_compiled_once_then_submitted(routes: tuple[TestClient, _Loop],
                                                      chat: bool) -> None:
    client, loop = routes
    fields = {"response_format": {"type": "json_schema",
                                  "json_schema": {"name": "pair", "schema": SCHEMA}}, "n": 2}
    r = client.post("/v1/chat/completions" if chat else "/v1/completions",
                    content=json.dumps(_body(chat, **fields)))
    assert r.status_code == 429, r.text  # the stand-in's answer: it got the submission
    eng = loop.engine
    # Once per request, not per choice, with the engine's own key (its compile: a hit).
    assert eng.guides.calls == [(Guide.json_schema(SCHEMA), eng.tokenizer, 49152)]
    (sub,) = loop.submitted
    assert sub.params.guide == Guide.json_schema(SCHEMA) and sub.n == 2


def test_free_text_compiles_nothing(routes: tuple[TestClient, _Loop]) -> None:
    client, loop = routes
    r = client.post("/v1/completions",
                    content=json.dumps(_body(False, response_format={"type": "text"})))
    assert r.status_code == 429, r.text
    assert not loop.engine.guides.calls and len(loop.submitted) == 1


def test_tools_take_no_second_guide_and_need_a_template(
        routes: tuple[TestClient, _Loop]) -> None:
    client, loop = routes
    tools = [{"type": "function", "function": {"name": "f"}}]
    r = client.post("/v1/chat/completions", content=json.dumps(
        _body(True, tools=tools, response_format={"type": "json_object"})))
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
    assert "response_format" in r.json()["error"]["message"]
    # The stand-in's tokenizer has no chat template: tools are a 400 saying what to do.
    r = client.post("/v1/chat/completions", content=json.dumps(_body(True, tools=tools)))
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
    assert "--chat-template" in r.json()["error"]["message"]
    assert not loop.submitted and not loop.engine.guides.calls


def test_the_event_loop_keeps_running_while_a_guide_compiles() -> None:
    """The compile runs on a worker thread: a slow one does not hold the event loop."""
    import threading

    started, release = threading.Event(), threading.Event()
    loop = _Loop()

    def slow_compile(guide: Guide, tokenizer: Any, *, vocab_size: int) -> object:
        started.set()
        assert release.wait(10)
        return object()

    loop.engine.guides.compile = slow_compile
    app = create_app(loop, model_name=MODEL)  # type: ignore[arg-type]

    async def main() -> tuple[int, int]:
        import httpx

        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            slow = asyncio.ensure_future(c.post("/v1/completions", content=json.dumps(
                _body(False, grammar='root ::= "a"'))))
            while not started.is_set():
                await asyncio.sleep(0.01)
            health = await c.get("/health")  # answered while the compile waits
            release.set()
            return health.status_code, (await slow).status_code

    assert asyncio.run(main()) == (200, 429)
