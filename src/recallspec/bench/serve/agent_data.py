"""The data of ``recallspec bench serve``'s tool-call and structured-output workloads
(reading files only: no server, model or network).

* **BFCL** (the Berkeley Function Calling Leaderboard, v4), read from the ``bfcl-eval``
  wheel's data files through ``importlib.resources`` (installed ``--no-deps`` by the
  Makefile's dev install; only its data files and its multi-turn API classes are used,
  never its modules that import the vendor SDKs). ``load_bfcl`` gives the items of one
  category (``BFCL_CATEGORIES``): the question, the functions as OpenAI ``tools`` (as
  BFCL's OpenAI handler converts them) and the possible answers. ``check_call`` is
  BFCL's AST check of a single-turn item's calls; ``MultiTurnEnv`` executes a
  multi-turn item's calls on BFCL's API classes (a file system, a message service, a
  trading bot, ...), and ``check_multi_turn`` is BFCL's multi-turn check (the
  instances' state and the calls' results against the ground truth's, turn by turn).
* **extract**: JSON-schema extraction over the shared CNN/DailyMail articles
  (``extraction_items``), one fixed schema (``EXTRACTION_SCHEMA``) and its validator
  (``valid_extraction``).

Deterministic: the items are evenly spaced over each source (as ``workloads._spread``),
and nothing model-written is ever evaluated: calls are methods looked up by name, the
ground truth's call strings are parsed with ``ast`` (literals only).
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import importlib.resources
import inspect
import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from recallspec.data.corpus_files import iter_records
from recallspec.data.paths import DataNotFoundError, data_dir
from recallspec.errors import DataError

# ---- BFCL: the data ---------------------------------------------------------------------

BFCL_PACKAGE = "bfcl_eval"
BFCL_INSTALL = "pip install --no-deps bfcl-eval==2026.3.23 (make install-dev does it)"
BFCL_PREFIX = "BFCL_v4"
BFCL_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple",
                   "multi_turn_base")
MULTI_TURN_CATEGORIES = ("multi_turn_base",)
# BFCL's MAXIMUM_STEP_LIMIT (constants/default_prompts.py): model steps per user turn
# before its multi-turn runner forces the turn to end.
BFCL_MAX_STEPS = 20
# What BFCL appends to every Python function's description (utils.py:
# _get_language_specific_hint), for every category here.
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."
# BFCL's types to JSON Schema's: constants/type_mappings.py GORILLA_TO_OPENAPI.
GORILLA_TO_OPENAPI = {
    "integer": "integer", "number": "number", "float": "number", "string": "string",
    "boolean": "boolean", "bool": "boolean", "array": "array", "list": "array",
    "dict": "object", "object": "object", "tuple": "array", "any": "string",
    "byte": "integer", "short": "integer", "long": "integer", "double": "number",
    "char": "string", "ArrayList": "array", "Array": "array", "HashMap": "object",
    "Hashtable": "object", "Queue": "array", "Stack": "array", "Any": "string",
    "String": "string", "Bigint": "integer",
}
# The multi-turn API classes: module under eval_checker/multi_turn_eval/func_source_code
# and function-doc file under data/multi_turn_func_doc (constants/executable_backend_config.py);
# MathAPI is stateless there (no _load_scenario).
_FUNC_SOURCE = f"{BFCL_PACKAGE}.eval_checker.multi_turn_eval.func_source_code"
MULTI_TURN_CLASSES = {
    "GorillaFileSystem": ("gorilla_file_system", "gorilla_file_system.json"),
    "MathAPI": ("math_api", "math_api.json"),
    "MessageAPI": ("message_api", "message_api.json"),
    "TwitterAPI": ("posting_api", "posting_api.json"),
    "TicketAPI": ("ticket_api", "ticket_api.json"),
    "TradingBot": ("trading_bot", "trading_bot.json"),
    "TravelAPI": ("travel_booking", "travel_booking.json"),
    "VehicleControlAPI": ("vehicle_control", "vehicle_control.json"),
}
STATELESS_CLASSES = ("MathAPI",)
# Method names BFCL's executor refuses (multi_turn_utils.py: execute_multi_turn_func_call).
_REFUSED = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")

Call = tuple[str, dict[str, Any]]  # a tool name and its arguments


@dataclass(frozen=True)
class BfclItem:
    """One BFCL question. Single-turn: ``messages`` is the chat (user messages) and
    ``answer`` the possible answers, one ``{function: {parameter: [allowed values]}}``
    per expected call (``""`` among the values: the parameter may be left out).
    Multi-turn: ``messages`` is a list of user turns (each a list of user messages),
    ``answer`` the ground truth's call strings per turn (``"cd(folder='document')"``),
    and the API classes start from ``initial_config``."""

    id: str
    category: str
    messages: list[Any]
    tools: list[dict[str, Any]]  # OpenAI `tools`: {"type": "function", "function": {...}}
    answer: list[Any]
    functions: list[dict[str, Any]] = field(repr=False)  # BFCL's own docs (its types)
    names: dict[str, str] = field(repr=False)  # tool name -> BFCL's function name
    involved_classes: tuple[str, ...] = ()
    initial_config: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def multi_turn(self) -> bool:
        return self.category in MULTI_TURN_CATEGORIES

    def tool_name(self, function: str) -> str:
        """The tool name of BFCL's ``function`` (dots become underscores)."""
        return sanitize_name(function)


def bfcl_available() -> bool:
    """Whether the bfcl-eval wheel (its data) is installed."""
    try:
        return _bfcl_data().is_dir()
    except DataError:
        return False


def _bfcl_data() -> Traversable:
    try:
        return importlib.resources.files(BFCL_PACKAGE) / "data"
    except ModuleNotFoundError:
        raise DataError(f"the BFCL data (bfcl-eval) is not installed: {BFCL_INSTALL}") from None


@functools.lru_cache(maxsize=32)
def _rows(*parts: str) -> tuple[dict[str, Any], ...]:
    """A BFCL data file (JSON lines), cached; callers deep-copy what they keep."""
    path = _bfcl_data().joinpath(*parts)
    if not path.is_file():
        raise DataError(f"BFCL data file {'/'.join(parts)} is missing from {BFCL_PACKAGE}")
    return tuple(json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
                 if line.strip())


def sanitize_name(name: str) -> str:
    """A function name as BFCL sends it to OpenAI-style APIs (``^[a-zA-Z0-9_-]{1,64}$``:
    model_handler/utils.py convert_to_tool replaces dots with underscores)."""
    return name.replace(".", "_")


def _cast_types(properties: dict[str, Any]) -> dict[str, Any]:
    """BFCL's types to JSON Schema's, in place, following model_handler/utils.py
    ``_cast_to_openai_type`` with GORILLA_TO_OPENAPI: a property without a type is a
    string, an unknown type too; "float" also gets ``format: float`` and a sentence in
    its description; nested properties and (two levels of) ``items`` are converted."""
    for value in properties.values():
        if "type" not in value:
            value["type"] = "string"
        else:
            kind = value["type"]
            if kind == "float":
                value["format"] = "float"
                value["description"] = value.get("description", "") + " This is a float type value."
            value["type"] = GORILLA_TO_OPENAPI.get(kind, "string")
        if value["type"] in ("array", "object"):
            if "properties" in value:
                value["properties"] = _cast_types(value["properties"])
            elif "items" in value:
                items = value["items"]
                items["type"] = GORILLA_TO_OPENAPI[items["type"]]
                if items["type"] == "array" and "items" in items:
                    items["items"]["type"] = GORILLA_TO_OPENAPI[items["items"]["type"]]
                elif items["type"] == "object" and "properties" in items:
                    items["properties"] = _cast_types(items["properties"])
    return properties


def openai_tools(functions: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]],
                                                                    dict[str, str]]:
    """BFCL's function docs as OpenAI ``tools`` (as its OpenAI chat-completions handler
    sends them: model_handler/utils.py ``convert_to_tool``, ModelStyle.OPENAI_COMPLETIONS),
    and the map from each tool name back to BFCL's name. Only ``name``, ``description``
    and ``parameters`` are kept (BFCL also passes its multi-turn docs' ``response``)."""
    tools, names = [], {}
    for f in functions:
        name = sanitize_name(str(f["name"]))
        if name in names:
            raise DataError(f"two BFCL functions are both tool {name!r}")
        params = copy.deepcopy(dict(f["parameters"]))
        params["type"] = "object"
        params["properties"] = _cast_types(params.get("properties", {}))
        names[name] = str(f["name"])
        tools.append({"type": "function", "function": {
            "name": name, "description": str(f.get("description", "")), "parameters": params}})
    return tools, names


def _hinted(functions: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = copy.deepcopy([dict(f) for f in functions])
    for f in out:
        f["description"] = str(f.get("description", "")) + PYTHON_HINT
    return out


def _spread_indices(n_items: int, k: int, seed: int | None) -> list[int]:
    """``k`` evenly spaced positions ``floor(i * n / k)`` (all when fewer), as
    ``workloads._spread``; a seed shifts them all by one offset below the spacing."""
    if k >= n_items:
        return list(range(n_items))
    offset = random.Random(seed).randrange(n_items // k) if seed is not None else 0
    return [offset + (i * n_items) // k for i in range(k)]


def load_bfcl(category: str, n: int | None = None, seed: int | None = None) -> list[BfclItem]:
    """``n`` items (all by default) evenly spaced over BFCL v4's ``category``."""
    if category not in BFCL_CATEGORIES:
        raise DataError(f"unknown BFCL category {category!r}; available: "
                        f"{', '.join(BFCL_CATEGORIES)}")
    if n is not None and n < 1:
        raise DataError("the number of BFCL items must be >= 1")
    rows = _rows(f"{BFCL_PREFIX}_{category}.json")
    answers = {str(a["id"]): a["ground_truth"]
               for a in _rows("possible_answer", f"{BFCL_PREFIX}_{category}.json")}
    out = []
    for i in _spread_indices(len(rows), len(rows) if n is None else n, seed):
        row = rows[i]
        rid = str(row["id"])
        if rid not in answers:
            raise DataError(f"BFCL item {rid} has no possible answer")
        multi = category in MULTI_TURN_CATEGORIES
        classes = tuple(str(c) for c in row.get("involved_classes", ())) if multi else ()
        if multi:  # their docs come from the classes' files (utils.py:
            docs: list[dict[str, Any]] = []  # populate_test_cases_with_predefined_functions)
            for c in classes:
                if c not in MULTI_TURN_CLASSES:
                    raise DataError(f"BFCL item {rid}: unknown API class {c!r}")
                docs += _rows("multi_turn_func_doc", MULTI_TURN_CLASSES[c][1])
        else:
            docs = list(row["function"])
        functions = _hinted(docs)
        tools, names = openai_tools(functions)
        question = copy.deepcopy(row["question"])
        out.append(BfclItem(
            id=rid, category=category, messages=question if multi else question[0],
            tools=tools, answer=copy.deepcopy(answers[rid]), functions=functions, names=names,
            involved_classes=classes, initial_config=copy.deepcopy(row.get("initial_config", {}))))
    return out


# ---- BFCL: the AST check of single-turn calls -------------------------------------------
# Our port of the Python path of BFCL's checker: eval_checker/ast_eval/ast_checker.py
# (bfcl-eval 2026.3.23, Apache-2.0): simple_function_checker, type_checker,
# string_checker, list_checker, dict_checker, list_dict_checker and the three
# category checkers. (That module imports constants/model_config, which imports every
# vendor SDK.) One deliberate difference: parallel calls are matched to the answers by
# a full bipartite matching, where BFCL takes, answer by answer, the first call that
# matches (which can miss a matching that exists).

_PY_TYPES: dict[str, type] = {"string": str, "integer": int, "float": float, "boolean": bool,
                              "array": list, "tuple": list, "dict": dict, "any": str}
_NESTED = ("array", "tuple")


def _standardize(s: str) -> str:
    """BFCL's standardize_string: no spaces or ``,./-_*^``, lower case, ' as "."""
    return re.sub(r"[ \,\.\/\-\_\*\^]", "", s).lower().replace("'", '"')


def _std(v: Any) -> Any:
    return _standardize(v) if type(v) is str else v


def _answer_type(allowed: Sequence[Any]) -> type | None:
    return next((type(a) for a in allowed if a != ""), None)


def _type_ok(value: Any, allowed: Sequence[Any], expected: type,
             nested: type | None) -> tuple[bool, bool]:
    """(valid, is_variable), as BFCL's type_checker: a value of the answers' type where
    that is not the declared one (a variable name for a number, ...) is accepted as a
    "variable"; list items are checked against one candidate list's type (one level)."""
    answer_type = _answer_type(allowed)
    is_variable = answer_type is not None and answer_type is not expected
    items: Any = value  # (a list where the nested check reads it)
    if type(value) is expected:
        if nested is None:
            return True, is_variable
        for candidate in allowed:
            if type(candidate) is not list or all(
                    _type_ok(v, candidate, nested, None)[0] for v in items):
                return True, is_variable
        return False, False
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, False


def _dict_ok(value: Mapping[str, Any], candidates: Sequence[Any]) -> bool:
    for cand in candidates:
        if not isinstance(cand, Mapping):  # "" (the parameter may be left out)
            continue
        if all(k in cand and _std(v) in [_std(a) for a in cand[k]] for k, v in value.items()) \
                and all(k in value or "" in allowed for k, allowed in cand.items()):
            return True
    return False


def _list_dict_ok(value: Sequence[Any], candidates: Sequence[Any]) -> bool:
    for cand in candidates:
        if isinstance(cand, list | str) and len(value) == len(cand) and all(
                isinstance(v, Mapping) and _dict_ok(v, [c])
                for v, c in zip(value, cand, strict=True)):
            return True
    return False


def _check_one(doc: Mapping[str, Any], name: str | None, args: Mapping[str, Any],
               answer: Mapping[str, Any], tool: str = "") -> str:
    """Why the call ``name(**args)`` does not match ``answer`` (``{function: {param:
    [allowed]}}``) under ``doc`` (BFCL's simple_function_checker); "" when it does."""
    ((function, allowed_by_param),) = answer.items()
    if name != doc["name"]:
        return f"expected a call to {function!r}, got one to {tool or name!r}"
    props = doc["parameters"].get("properties", {})
    for p in doc["parameters"].get("required", []):
        if p not in args:
            return f"{function}: missing required parameter {p!r}"
    for p, value in args.items():
        if p not in props or p not in allowed_by_param:
            return f"{function}: unexpected parameter {p!r}"
        kind = str(props[p].get("type", "any"))
        expected = _PY_TYPES.get(kind, str)
        item_kind = props[p].get("items", {}).get("type") if kind in _NESTED else None
        nested = _PY_TYPES.get(str(item_kind), str) if item_kind is not None else None
        allowed = allowed_by_param[p]
        if kind == "tuple" and type(value) is tuple:
            value = list(value)
        if kind == "float" and type(value) is int:  # Python's int -> float
            value = float(value)
        ok, is_variable = _type_ok(value, allowed, expected, nested)
        if not ok:
            return (f"{function}: parameter {p!r} should be {kind}, "
                    f"got {type(value).__name__} {value!r}")
        if not is_variable:
            if expected is dict:
                good = _dict_ok(value, allowed)
            elif expected is list and nested is dict:
                good = _list_dict_ok(value, allowed)
            elif expected is str:  # strings compare standardized (case, spaces, ...)
                good = _standardize(value) in [_standardize(a) for a in allowed
                                               if type(a) is str]
            elif expected is list:
                good = [_std(v) for v in value] in [[_std(a) for a in cand] for cand in allowed
                                                    if isinstance(cand, list | str)]
            else:
                good = value in allowed
        else:
            good = value in allowed
        if not good:
            return f"{function}: parameter {p!r} = {value!r}, expected one of {allowed!r}"
    for p, allowed in allowed_by_param.items():
        if p not in args and "" not in allowed:
            return f"{function}: parameter {p!r} missing (it is not optional)"
    return ""


def _as_arguments(arguments: Mapping[str, Any] | str) -> dict[str, Any] | None:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    return dict(arguments) if isinstance(arguments, Mapping) else None


def _match(ok: Sequence[Sequence[bool]]) -> list[int] | None:
    """A perfect matching of answers (rows) to calls (columns) where ``ok[i][j]``:
    answer i's call index per answer, or None (Kuhn's augmenting paths)."""
    owner: dict[int, int] = {}  # call -> answer

    def augment(i: int, seen: set[int]) -> bool:
        for j, good in enumerate(ok[i]):
            if good and j not in seen:
                seen.add(j)
                if j not in owner or augment(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    if not all(augment(i, set()) for i in range(len(ok))):
        return None
    by_answer = {i: j for j, i in owner.items()}
    return [by_answer[i] for i in range(len(ok))]


def check_call(calls: Sequence[tuple[str, Mapping[str, Any] | str]],
               item: BfclItem) -> tuple[bool, str]:
    """BFCL's AST check of a single-turn item's calls (tool names, arguments as dicts or
    JSON text): (ok, why not). simple: one call matching the answer; multiple: one call,
    to the answer's function among several; parallel / parallel_multiple: as many calls
    as answers, matched one to one in any order. A call matches when its function is the
    answer's, every required parameter is given, and every value given is among the
    answer's allowed ones (strings compared case- and punctuation-insensitively), and
    each parameter left out is optional in the answer."""
    if item.multi_turn:
        raise ValueError(f"{item.id} is multi-turn: use check_multi_turn")
    parsed = []
    for name, arguments in calls:
        args = _as_arguments(arguments)
        if args is None:
            return False, f"the arguments of {name!r} are not a JSON object"
        parsed.append((item.names.get(name), args, name))
    docs = {str(f["name"]): f for f in item.functions}
    answers = item.answer
    if len(parsed) != len(answers) or (
            "parallel" not in item.category and len(parsed) != 1):
        return False, f"expected {len(answers)} call(s), got {len(parsed)}"
    if "parallel" not in item.category:
        doc = item.functions[0] if item.category == "simple_python" else \
            docs[next(iter(answers[0]))]
        fn, fargs, tool = parsed[0]
        why = _check_one(doc, fn, fargs, answers[0], tool)
        return not why, why
    why_by = [[_check_one(docs[next(iter(a))], fn, fargs, a, t) for fn, fargs, t in parsed]
              for a in answers]
    if _match([[not w for w in row] for row in why_by]) is None:
        stuck = next((i for i, row in enumerate(why_by) if all(row)), None)
        if stuck is not None:  # why not, against a call to its function if there is one
            why = next((w for w in why_by[stuck] if not w.startswith("expected a call")),
                       why_by[stuck][0])
            return False, f"no call matches answer {stuck}: {why}"
        return False, "the calls cannot be matched one to one to the answers"
    return True, ""


def _first(allowed: Sequence[Any], schema: Mapping[str, Any], required: bool) -> Any:
    """A parameter's first allowed value (the first besides ``""`` where it is required;
    ``_OMIT`` for ``""``); dict values are answers themselves, one list per key (as
    BFCL's dict_checker reads them), so their own first values are taken, in lists of
    dicts too."""
    value = next((a for a in allowed if a != ""), _OMIT) if required else allowed[0]
    if value == "":
        return _OMIT
    kind = schema.get("type")
    if kind == "dict" and isinstance(value, Mapping):
        return _first_dict(value, schema)
    if kind in _NESTED and schema.get("items", {}).get("type") == "dict" and \
            isinstance(value, list):
        return [_first_dict(v, schema["items"]) if isinstance(v, Mapping) else v for v in value]
    return value


def _first_dict(answer: Mapping[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    props = schema.get("properties", {})
    out = {k: _first(allowed, props.get(k, {}), True) for k, allowed in answer.items()
           if allowed and "" not in allowed}
    return {k: v for k, v in out.items() if v is not _OMIT}


_OMIT = object()


def answer_calls(item: BfclItem) -> list[list[Call]]:
    """The reference calls, per turn (a single-turn item: one turn), with tool names.
    Single-turn: the first possible answer: each parameter's first allowed value (the
    first other than ``""`` where the function requires it), left out where that is
    ``""``. Multi-turn: the ground truth's call strings, parsed (``parse_call``),
    positional arguments named from the API classes' signatures."""
    if not item.multi_turn:
        docs = {str(f["name"]): f["parameters"] for f in item.functions}
        calls = []
        for a in item.answer:
            ((function, allowed_by_param),) = a.items()
            params = docs[function]
            props, required = params.get("properties", {}), params.get("required", [])
            args = {p: _first(allowed, props[p], p in required)  # (BFCL's answers allow
                    for p, allowed in allowed_by_param.items()  # a few undeclared ones)
                    if allowed and p in props}
            calls.append((item.tool_name(function),
                          {p: v for p, v in args.items() if v is not _OMIT}))
        return [calls]
    methods = _class_methods(item.involved_classes)
    out = []
    for turn in item.answer:
        calls = []
        for source in turn:
            name, positional, kwargs = parse_call(source)
            if positional:
                if name not in methods:
                    raise DataError(f"{item.id}: {source!r} calls no method of its classes")
                params = [p for p in inspect.signature(methods[name]).parameters
                          if p != "self"]
                if len(positional) > len(params):
                    raise DataError(f"{item.id}: too many arguments in {source!r}")
                kwargs = {**dict(zip(params, positional, strict=False)), **kwargs}
            calls.append((item.tool_name(name), kwargs))
        out.append(calls)
    return out


def parse_call(source: str) -> tuple[str, list[Any], dict[str, Any]]:
    """A call string of BFCL's ground truth (``"mv(source='a', destination='b')"``) as
    (function, positional arguments, keyword arguments): parsed with ``ast``, literal
    values only (never evaluated)."""
    try:
        node = ast.parse(source.strip(), mode="eval").body
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            raise ValueError("not a call of a plain function name")
        if any(k.arg is None for k in node.keywords):
            raise ValueError("** arguments")
        name = node.func.id
        args = [ast.literal_eval(a) for a in node.args]
        kwargs = {str(k.arg): ast.literal_eval(k.value) for k in node.keywords}
    except (SyntaxError, ValueError, TypeError) as e:
        raise DataError(f"not a literal call: {source!r} ({e})") from None
    return name, args, kwargs


# ---- BFCL: multi-turn execution ---------------------------------------------------------


def _api_class(name: str) -> type:
    if name not in MULTI_TURN_CLASSES:
        raise DataError(f"unknown BFCL API class {name!r}")
    _bfcl_data()  # the package is there (else a DataError naming the install)
    module = importlib.import_module(f"{_FUNC_SOURCE}.{MULTI_TURN_CLASSES[name][0]}")
    cls = getattr(module, name)
    assert isinstance(cls, type)
    return cls


def _class_methods(classes: Sequence[str]) -> dict[str, Any]:
    """Public method name -> function, a later class's winning (as BFCL maps them)."""
    out: dict[str, Any] = {}
    for c in classes:
        out.update((n, f) for n, f in inspect.getmembers(_api_class(c), inspect.isfunction)
                   if not n.startswith("_"))
    return out


def _result_text(result: Any) -> str:
    """A call's result as BFCL's executor gives it to the model: a str as is, a dict as
    JSON (str() when it does not serialize), anything else str()."""
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


class MultiTurnEnv:
    """A multi-turn item's API instances, in their initial state, as BFCL's
    ``execute_multi_turn_func_call`` (eval_checker/multi_turn_eval/multi_turn_utils.py)
    makes them: each involved class instantiated, then ``_load_scenario`` with a copy
    of its part of ``initial_config`` (not for stateless MathAPI). ``execute`` calls a
    public method by name: no ``eval``."""

    def __init__(self, item: BfclItem) -> None:
        if not item.multi_turn:
            raise ValueError(f"{item.id} is not a multi-turn item")
        self.names = item.names
        self.instances: dict[str, Any] = {}
        self._methods: dict[str, Any] = {}
        for c in item.involved_classes:
            instance = _api_class(c)()
            if c not in STATELESS_CLASSES:
                instance._load_scenario(copy.deepcopy(item.initial_config.get(c, {})),
                                        long_context=False)
            self.instances[c] = instance
            self._methods.update((n, m) for n, m in inspect.getmembers(instance, inspect.ismethod)
                                 if not n.startswith("_"))

    def execute(self, name: str, arguments: Mapping[str, Any] | str) -> str:
        """Run one call (a tool name, its arguments as a dict or JSON text); the result
        as the model reads it, errors as BFCL words them ("Error during execution: ...")."""
        function = self.names.get(name, name)
        args = _as_arguments(arguments)
        if args is None:
            return "Error during execution: the arguments are not a JSON object"
        if function in _REFUSED:
            return f"Error during execution: Function call {function} is not allowed."
        method = self._methods.get(function)
        if method is None:
            return f"Error during execution: name '{function}' is not defined"
        # Fresh arguments, as BFCL's eval of a call string makes (the APIs keep them and
        # later mutate them), and fresh copies of mutable defaults (``mentions=[]``: one
        # list every instance of the process would share, and ``mention`` extends it).
        args = copy.deepcopy(args)
        for p in inspect.signature(method).parameters.values():
            if p.name not in args and isinstance(p.default, list | dict | set):
                args[p.name] = copy.deepcopy(p.default)
        try:
            return _result_text(method(**args))
        except Exception as e:  # a wrong argument, a bug of the call: the model reads it
            return f"Error during execution: {e}"

    def state(self) -> dict[str, dict[str, Any]]:
        """Each instance's public attributes (what BFCL's state check compares)."""
        return {c: {k: v for k, v in vars(i).items() if not k.startswith("_")}
                for c, i in self.instances.items()}


def check_multi_turn(turns: Sequence[Sequence[tuple[str, Mapping[str, Any] | str]]],
                     item: BfclItem) -> tuple[bool, str]:
    """BFCL's multi-turn check (eval_checker/multi_turn_eval/multi_turn_checker.py,
    ``multi_turn_checker``) of the calls a model made in each user turn (all its steps
    together): after every turn with ground-truth calls, the model's instances must
    equal the ground truth's in every public attribute, and the results of the ground
    truth's calls of that turn must all be among the model's results so far (a
    multiset, any order); a turn without calls where the ground truth has some fails."""
    model, truth = MultiTurnEnv(item), MultiTurnEnv(item)
    model_results: list[str] = []
    for k, reference in enumerate(answer_calls(item)):
        calls = turns[k] if k < len(turns) else ()
        model_results += [model.execute(n, a) for n, a in calls]
        expected = [truth.execute(n, a) for n, a in reference]
        if not reference:
            continue
        if not calls:
            return False, f"turn {k}: no calls"
        for c, t in truth.instances.items():
            m = model.instances[c]
            diff = [a for a in vars(t) if not a.startswith("_") and getattr(m, a) != getattr(t, a)]
            if diff:
                return False, f"turn {k}: {c} state differs in {', '.join(diff)}"
        left = list(model_results)
        for r in expected:
            if r not in left:
                return False, f"turn {k}: missing the result {r[:200]!r}"
            left.remove(r)
    return True, ""


# ---- extract: JSON-schema extraction over CNN/DailyMail ---------------------------------

CNNDM_FILE = "cnn_dailymail/cad_cnndm_1_0.jsonl"
# Bounded lists and strings: a small greedy model repeats list items and phrases until
# max_tokens, and an extraction a client asks for is bounded too.
MAX_ITEMS, MAX_NAME, MAX_TEXT = 4, 48, 240


def _str(n: int) -> dict[str, Any]:
    return {"type": "string", "maxLength": n}


EXTRACTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["title", "people", "places", "summary"],
    "properties": {
        "title": _str(MAX_TEXT // 2),
        "people": {"type": "array", "maxItems": MAX_ITEMS, "items": {
            "type": "object", "additionalProperties": False, "required": ["name", "role"],
            "properties": {"name": _str(MAX_NAME), "role": _str(MAX_NAME)}}},
        "places": {"type": "array", "maxItems": MAX_ITEMS, "items": _str(MAX_NAME)},
        "summary": _str(MAX_TEXT),
    },
}
EXTRACTION_NAME = "article_facts"
# The request's `response_format` (OpenAI structured outputs).
EXTRACTION_RESPONSE_FORMAT: dict[str, Any] = {"type": "json_schema", "json_schema": {
    "name": EXTRACTION_NAME, "schema": EXTRACTION_SCHEMA, "strict": True}}
EXTRACTION_SYSTEM = ("You extract facts from news articles. Answer with one JSON object "
                     "and nothing else.")
EXTRACTION_ASK = ("Extract from the article below, as JSON: a short title, the people it "
                  "names (each with their role in the story), the places it mentions, and "
                  "a one-sentence summary. Use the keys title, people (name, role), places "
                  "and summary.")


@dataclass(frozen=True)
class ExtractionItem:
    id: str
    messages: list[dict[str, str]]  # system, then the ask with the article
    schema: dict[str, Any] = field(default_factory=lambda: EXTRACTION_SCHEMA, repr=False)


def extraction_items(n: int, data_root: str | Path | None = None) -> list[ExtractionItem]:
    """``n`` extraction requests over CNN/DailyMail articles evenly spaced over the shared
    file (the rows with the article, as ``workloads._rag``)."""
    if n < 1:
        raise DataError("the number of extraction items must be >= 1")
    try:
        root = data_dir(data_root)
    except DataNotFoundError as e:
        raise DataError(str(e)) from None
    path = root / CNNDM_FILE
    if not path.is_file():
        raise DataError(f"benchmark data file {path} is missing")
    arts = [r for r in iter_records(path) if r.get("assigned_weight") == 1]
    return [ExtractionItem(f"extract-{arts[i]['input_index']}", [
        {"role": "system", "content": EXTRACTION_SYSTEM},
        {"role": "user", "content": f"{EXTRACTION_ASK}\n\nArticle:\n{arts[i]['article']}"}])
        for i in _spread_indices(len(arts), n, None)]


def _strings(v: Any) -> bool:
    return type(v) is list and all(type(s) is str for s in v)


def valid_extraction(text: str) -> bool:
    """Whether ``text`` is one JSON value that ``EXTRACTION_SCHEMA`` accepts (checked by
    hand for that schema: exactly its keys, each of its type and within its bounds)."""
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return False
    keys = set(EXTRACTION_SCHEMA["required"])
    return (type(obj) is dict and set(obj) == keys
            and _bounded(obj["title"], MAX_TEXT // 2) and _bounded(obj["summary"], MAX_TEXT)
            and _strings(obj["places"]) and len(obj["places"]) <= MAX_ITEMS
            and all(_bounded(x, MAX_NAME) for x in obj["places"])
            and type(obj["people"]) is list and len(obj["people"]) <= MAX_ITEMS
            and all(type(p) is dict and set(p) == {"name", "role"}
                    and _bounded(p["name"], MAX_NAME) and _bounded(p["role"], MAX_NAME)
                    for p in obj["people"]))


def _bounded(v: Any, n: int) -> bool:
    return type(v) is str and len(v) <= n
