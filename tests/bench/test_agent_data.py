"""The data of `bench serve`'s tool-call and extraction workloads (bench/serve/agent_data.py):
BFCL's items (counts, spread, tools as JSON-schema objects with sanitized names that map
back), the AST checker (every item's first possible answer passes, perturbed ones fail,
and its verdicts equal BFCL's own checker's), the multi-turn API classes on the ground
truth's calls (results equal BFCL's own executor's), the extraction items and validator.

BFCL comes from the bfcl-eval wheel (``make install-dev``), the articles from the shared
data: a missing one skips outside CI and fails under CI=true (helpers.availability)."""

from __future__ import annotations

import copy
import itertools
import json
import re
import sys
import types
from typing import Any
from unittest import mock

import pytest
from helpers.availability import data_dir_or_unavailable, unavailable

from recallspec.bench.serve import agent_data as ad
from recallspec.errors import DataError

SINGLE = ("simple_python", "multiple", "parallel", "parallel_multiple")
COUNTS = {"simple_python": 400, "multiple": 200, "parallel": 200, "parallel_multiple": 200,
          "multi_turn_base": 200}
JSON_TYPES = {"object", "array", "string", "integer", "number", "boolean"}


@pytest.fixture(scope="module")
def bfcl() -> dict[str, list[ad.BfclItem]]:
    if not ad.bfcl_available():
        unavailable(f"bfcl-eval is not installed ({ad.BFCL_INSTALL})")
    return {c: ad.load_bfcl(c) for c in ad.BFCL_CATEGORIES}


# ---- loading ----------------------------------------------------------------------------


def test_every_category_loads_whole_and_spread(bfcl: dict[str, list[ad.BfclItem]]) -> None:
    for cat, items in bfcl.items():
        assert len(items) == COUNTS[cat] and len({i.id for i in items}) == len(items)
        assert all(i.category == cat and i.multi_turn == (cat == "multi_turn_base")
                   for i in items)
        some = ad.load_bfcl(cat, 7)
        n = len(items)
        assert [i.id for i in some] == [items[(k * n) // 7].id for k in range(7)]  # _spread
        assert ad.load_bfcl(cat, 7) == some  # deterministic
        shifted = ad.load_bfcl(cat, 7, seed=3)
        assert shifted == ad.load_bfcl(cat, 7, seed=3) and len(shifted) == 7
        assert len(ad.load_bfcl(cat, 10_000)) == n
    with pytest.raises(DataError, match="unknown BFCL category"):
        ad.load_bfcl("live_simple")
    with pytest.raises(DataError):
        ad.load_bfcl("simple_python", 0)


def _schema_ok(s: dict[str, Any]) -> None:
    """A JSON-schema node of the shapes BFCL's conversion makes (no BFCL type left)."""
    assert s["type"] in JSON_TYPES, s
    for sub in s.get("properties", {}).values():
        _schema_ok(sub)
    if "items" in s:
        _schema_ok(s["items"])
    if s["type"] == "number" and s.get("format") == "float":
        assert "float type value" in s.get("description", "")


def test_tools_are_openai_functions_with_names_mapped_back(
        bfcl: dict[str, list[ad.BfclItem]]) -> None:
    dotted = 0
    for items in bfcl.values():
        for item in items:
            assert len(item.tools) == len(item.functions) >= 1
            for tool, doc in zip(item.tools, item.functions, strict=True):
                assert tool["type"] == "function" and set(tool["function"]) == {
                    "name", "description", "parameters"}
                f = tool["function"]
                assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", f["name"])  # OpenAI's rule
                assert item.names[f["name"]] == doc["name"]  # mapped back
                assert f["name"] == doc["name"].replace(".", "_") == item.tool_name(doc["name"])
                dotted += "." in doc["name"]
                params = f["parameters"]
                assert params["type"] == "object" and isinstance(params["properties"], dict)
                assert set(params.get("required", [])) <= set(params["properties"])
                for p in params["properties"].values():
                    _schema_ok(p)
                assert f["description"].endswith(ad.PYTHON_HINT)
                assert doc["parameters"]["type"] == "dict"  # the checker keeps BFCL's types
    assert dotted > 100  # (most BFCL names have dots)


def test_the_type_conversion_follows_bfcl() -> None:
    tools, names = ad.openai_tools([{"name": "a.b", "description": "d", "parameters": {
        "type": "dict", "required": ["x"], "properties": {
            "x": {"type": "float", "description": "X."},
            "t": {"type": "tuple", "items": {"type": "float"}},
            "d": {"type": "dict", "properties": {"k": {"type": "any"}}},
            "l": {"type": "array", "items": {"type": "dict", "properties": {
                "n": {"type": "integer"}}}},
            "u": {"type": "weird"}, "v": {}}}}])
    assert names == {"a_b": "a.b"}
    p = tools[0]["function"]["parameters"]
    assert p["type"] == "object" and p["required"] == ["x"]
    props = p["properties"]
    assert props["x"] == {"type": "number", "format": "float",
                          "description": "X. This is a float type value."}
    assert props["t"] == {"type": "array", "items": {"type": "number"}}
    assert props["d"] == {"type": "object", "properties": {"k": {"type": "string"}}}
    assert props["l"]["items"] == {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert props["u"] == {"type": "string"} and props["v"] == {"type": "string"}
    with pytest.raises(DataError, match="both tool"):
        ad.openai_tools([{"name": "a.b", "parameters": {"properties": {}}},
                         {"name": "a_b", "parameters": {"properties": {}}}])


def test_messages_and_answers(bfcl: dict[str, list[ad.BfclItem]]) -> None:
    for cat in SINGLE:
        for item in bfcl[cat]:
            assert item.messages and all(m["role"] in ("system", "user") and m["content"]
                                         for m in item.messages)
            assert item.answer and all(len(a) == 1 for a in item.answer)
            assert not item.involved_classes and not item.initial_config
    assert all(len(i.answer) == 1 for c in ("simple_python", "multiple") for i in bfcl[c])
    for item in bfcl["multi_turn_base"]:
        assert len(item.messages) == len(item.answer) >= 1  # a user turn each
        assert all(turn and all(m["role"] == "user" for m in turn) for turn in item.messages)
        assert set(item.involved_classes) <= set(ad.MULTI_TURN_CLASSES)
        assert {t["function"]["name"] for t in item.tools} == set(item.names)


# ---- the AST checker --------------------------------------------------------------------


def _bad_value(v: Any) -> Any:
    """A value of the same type outside the answer's allowed values (a bool: the other)."""
    if type(v) is bool:
        return not v
    if type(v) is list:
        return [*v, v[0]] if v else ["zzqq"]
    if type(v) is dict:
        return {**v, "zzqq": 1}
    return {str: "zzqq not an answer", int: 10**9 + 7, float: 1e9 + 0.5}[type(v)]


def _variants(calls: list[ad.Call]) -> list[tuple[str, list[ad.Call]]]:
    out: list[tuple[str, list[ad.Call]]] = [("reversed", calls[::-1])]
    for i, (name, args) in enumerate(calls):
        def swap(new: ad.Call, i: int = i) -> list[ad.Call]:
            return [*calls[:i], new, *calls[i + 1:]]
        for p, v in args.items():
            # (a flipped bool may be allowed too: only the comparison with BFCL reads it)
            label = "flip" if type(v) is bool else "bad"
            out.append((f"{label} {p}", swap((name, {**args, p: _bad_value(v)}))))
            out.append((f"drop {p}", swap((name, {k: x for k, x in args.items() if k != p}))))
            if type(v) is str:
                out.append((f"case {p}", swap((name, {**args, p: v.upper() + " "}))))
            if type(v) is int:
                out.append((f"float {p}", swap((name, {**args, p: float(v)}))))
        out.append(("extra", swap((name, {**args, "zzqq": 1}))))
        out.append(("name", swap(("zzqq_fn", args))))
    return [*out, ("none", []), ("one more", [*calls, calls[0]])]


def test_first_possible_answers_pass_and_perturbed_ones_fail(
        bfcl: dict[str, list[ad.BfclItem]]) -> None:
    for cat in SINGLE:
        for item in bfcl[cat]:
            (calls,) = ad.answer_calls(item)
            assert ad.check_call(calls, item) == (True, ""), item.id
            assert ad.check_call([(n, json.dumps(a)) for n, a in calls], item)[0]  # JSON text
            for label, bad in _variants(calls):
                if label.startswith(("bad", "extra", "name", "none", "one more")):
                    ok, why = ad.check_call(bad, item)
                    assert not ok and why, (item.id, label)
            name, args = calls[0]
            required = item.functions[0]["parameters"]["required"] if cat == "simple_python" \
                else []
            for p in required:
                if p in args:
                    ok, why = ad.check_call([(name, {k: v for k, v in args.items() if k != p})],
                                            item)
                    assert not ok and "missing required" in why
    item = bfcl["simple_python"][0]  # calculate_triangle_area(base=10, height=5[, unit])
    name = item.tools[0]["function"]["name"]
    assert ad.check_call([(name, {"base": 10, "height": 5})], item)[0]  # unit optional
    assert ad.check_call([(name, {"base": 10, "height": 5, "unit": "UNITS"})], item)[0]
    assert not ad.check_call([(name, {"base": 10.0, "height": 5})], item)[0]  # int is int
    assert not ad.check_call([(name, "not json")], item)[0]
    with pytest.raises(ValueError):
        ad.check_call([], bfcl["multi_turn_base"][0])


@pytest.fixture(scope="module")
def bfcl_ast_checker(bfcl: dict[str, list[ad.BfclItem]]) -> Any:
    """BFCL's own ast_checker, imported with its constants/model_config (which imports
    every vendor SDK) stubbed in sys.modules for the import only: ``patch.dict`` puts
    sys.modules back as it was, the checker's modules gone with the stub. Names are
    compared with dots as underscores (``underscore_to_dot``, as for OpenAI models)."""
    stub = types.ModuleType("bfcl_eval.constants.model_config")

    class _Mapping(dict[str, Any]):
        def __getitem__(self, key: str) -> Any:
            return types.SimpleNamespace(underscore_to_dot=True)

    stub.MODEL_CONFIG_MAPPING = _Mapping()
    with mock.patch.dict(sys.modules, {stub.__name__: stub}):
        from bfcl_eval.constants.enums import Language
        from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    def check(item: ad.BfclItem, calls: list[ad.Call]) -> bool:
        out = [{n: copy.deepcopy(a)} for n, a in calls]
        return bool(ast_checker(item.functions, out, item.answer, Language.PYTHON,
                                item.category, "model")["valid"])
    return check


def test_the_checker_agrees_with_bfcls_own(bfcl: dict[str, list[ad.BfclItem]],
                                          bfcl_ast_checker: Any) -> None:
    cases = matched_only_by_us = 0
    for cat in SINGLE:
        for item in bfcl[cat]:
            (calls,) = ad.answer_calls(item)
            for label, variant in [("first", calls), *_variants(calls)]:
                ours, theirs = ad.check_call(variant, item)[0], bfcl_ast_checker(item, variant)
                cases += 1
                if ours != theirs:
                    # Only where BFCL's greedy parallel matching misses a matching that
                    # exists: some order of the same calls passes BFCL's checker.
                    assert ours and "parallel" in cat, (item.id, label, ours, theirs)
                    assert any(bfcl_ast_checker(item, list(order))
                               for order in itertools.permutations(variant)), (item.id, label)
                    matched_only_by_us += 1
    assert cases > 15_000 and matched_only_by_us <= 5
    assert "bfcl_eval.eval_checker.ast_eval.ast_checker" not in sys.modules
    assert "bfcl_eval.constants.model_config" not in sys.modules


def test_parallel_calls_match_in_any_order(bfcl: dict[str, list[ad.BfclItem]]) -> None:
    item = next(i for i in bfcl["parallel"] if i.id == "parallel_0")  # two spotify.play
    (calls,) = ad.answer_calls(item)
    assert [a["artist"] for _, a in calls] == ["Taylor Swift", "Maroon 5"]
    assert ad.check_call(calls[::-1], item)[0]
    ok, why = ad.check_call([calls[0], calls[0]], item)  # one call cannot serve both
    assert not ok and why
    assert not ad.check_call(calls[:1], item)[0]


# ---- multi-turn -------------------------------------------------------------------------


def test_parse_call_reads_literals_only() -> None:
    assert ad.parse_call("cd(folder='document')") == ("cd", [], {"folder": "document"})
    assert ad.parse_call("sort('a.pdf')") == ("sort", ["a.pdf"], {})
    assert ad.parse_call("f(x=-1.5, y=[1, {'a': None}], z=True)") == (
        "f", [], {"x": -1.5, "y": [1, {"a": None}], "z": True})
    for bad in ("f(x=g())", "os.system('ls')", "f(**k)", "f(x=y)", "f(", "x"):
        with pytest.raises(DataError):
            ad.parse_call(bad)


def test_the_env_runs_the_ground_truth_as_bfcl_does(bfcl: dict[str, list[ad.BfclItem]]) -> None:
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import (
        execute_multi_turn_func_call,
    )

    items = bfcl["multi_turn_base"]
    assert {c for i in items for c in i.involved_classes} == set(ad.MULTI_TURN_CLASSES)
    n = 0
    for item in items[::10]:  # every class is in these 20
        env = ad.MultiTurnEnv(item)
        assert set(env.instances) == set(item.involved_classes)
        for k, (calls, sources) in enumerate(zip(ad.answer_calls(item), item.answer,
                                                 strict=True)):
            results = [env.execute(name, args) for name, args in calls]
            assert all(isinstance(r, str) and r for r in results)
            # BFCL's executor evaluates the ground truth's own strings (its data, not a
            # model's): the same results, call by call.
            theirs, _ = execute_multi_turn_func_call(
                sources, item.initial_config, list(item.involved_classes), "agent_data_test",
                item.id)
            assert results == theirs, (item.id, k)
            n += len(results)
        assert isinstance(env.state(), dict) and set(env.state()) == set(item.involved_classes)
    assert n > 100


def test_the_env_words_errors_as_bfcl_and_copies_arguments(
        bfcl: dict[str, list[ad.BfclItem]]) -> None:
    item = bfcl["multi_turn_base"][0]  # GorillaFileSystem and TwitterAPI
    env = ad.MultiTurnEnv(item)
    assert json.loads(env.execute("ls", {}))["current_directory_content"]
    assert env.execute("ls", "{}") == env.execute("ls", {})
    assert env.execute("cd", {"nope": 1}).startswith("Error during execution: ")
    assert env.execute("bogus", {}) == "Error during execution: name 'bogus' is not defined"
    assert env.execute("_load_scenario", {}).startswith("Error during execution: name")
    assert env.execute("cd", "[1]").startswith("Error during execution: ")
    with_twitter = next(i for i in bfcl["multi_turn_base"]
                        if i.initial_config.get("TwitterAPI", {}).get("authenticated"))
    a, b = ad.MultiTurnEnv(with_twitter), ad.MultiTurnEnv(with_twitter)
    mentions = ["@x"]
    tweet = json.loads(a.execute("post_tweet", {"content": "hi", "mentions": mentions}))
    assert "error" not in tweet
    a.execute("mention", {"tweet_id": tweet["id"], "mentioned_usernames": ["@y"]})
    assert mentions == ["@x"]  # the API extended its own copy
    plain = json.loads(a.execute("post_tweet", {"content": "no mentions"}))  # mentions=[]
    a.execute("mention", {"tweet_id": plain["id"], "mentioned_usernames": ["@z"]})
    other = json.loads(b.execute("post_tweet", {"content": "elsewhere"}))
    assert other["mentions"] == [] and b.instances["TwitterAPI"].tweets[other["id"]][
        "mentions"] == []  # not the default list another instance extended
    with pytest.raises(ValueError):
        ad.MultiTurnEnv(bfcl["simple_python"][0])


def test_the_ground_truth_passes_the_multi_turn_check(
        bfcl: dict[str, list[ad.BfclItem]]) -> None:
    for item in bfcl["multi_turn_base"][::4]:
        truth = ad.answer_calls(item)
        assert ad.check_multi_turn(truth, item) == (True, ""), item.id
        assert not ad.check_multi_turn(truth[:-1], item)[0]  # the last turn left undone
        assert not ad.check_multi_turn([], item)[0]
    item = bfcl["multi_turn_base"][0]
    truth = ad.answer_calls(item)
    ok, why = ad.check_multi_turn([[("cd", {"folder": "archive"})], *truth[1:]], item)
    assert not ok and why.startswith("turn 0")


# ---- extraction -------------------------------------------------------------------------


def test_extraction_items() -> None:
    root = data_dir_or_unavailable()
    items = ad.extraction_items(5, root)
    assert len(items) == 5 and len({i.id for i in items}) == 5
    assert items == ad.extraction_items(5)  # the default data dir is the same
    for it in items:
        system, user = it.messages
        assert system == {"role": "system", "content": ad.EXTRACTION_SYSTEM}
        assert user["role"] == "user" and user["content"].startswith(ad.EXTRACTION_ASK)
        assert len(user["content"]) > len(ad.EXTRACTION_ASK) + 500  # the article
        assert it.schema == ad.EXTRACTION_SCHEMA
    assert len(ad.extraction_items(10_000, root)) == 300  # the rows with the article
    fmt = ad.EXTRACTION_RESPONSE_FORMAT
    assert fmt["json_schema"]["schema"] is ad.EXTRACTION_SCHEMA
    with pytest.raises(DataError):
        ad.extraction_items(0, root)
    with pytest.raises(DataError):
        ad.extraction_items(1, root / "nowhere")


GOOD = {"title": "T", "people": [{"name": "A", "role": "mayor"}], "places": ["Boston"],
        "summary": "S."}


def test_the_validator_follows_the_schema() -> None:
    assert ad.valid_extraction(json.dumps(GOOD))
    assert ad.valid_extraction(json.dumps({**GOOD, "people": [], "places": []}))
    assert ad.valid_extraction("\n " + json.dumps(GOOD, indent=2) + "\n")
    bad = [
        {k: v for k, v in GOOD.items() if k != "summary"},  # a key missing
        {**GOOD, "extra": 1},  # additionalProperties false
        {**GOOD, "title": 3},
        {**GOOD, "places": "Boston"},
        {**GOOD, "places": ["Boston", 2]},
        {**GOOD, "people": [{"name": "A"}]},
        {**GOOD, "people": [{"name": "A", "role": "x", "age": 3}]},
        {**GOOD, "people": [{"name": "A", "role": None}]},
        {**GOOD, "people": ["A"]},
        [GOOD],
    ]
    for b in bad:
        assert not ad.valid_extraction(json.dumps(b)), b
    for text in ("", "{", json.dumps(GOOD) + " x", "null", "```json\n{}\n```"):
        assert not ad.valid_extraction(text)
