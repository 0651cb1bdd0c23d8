"""Tool calling's pure parts: the request's tools, the template's family, the model's calls.

- ``validate_tools`` / ``validate_tool_choice``: the OpenAI ``tools`` list and
  ``tool_choice`` checked once, as ``Tool`` and ``ToolChoice`` values (a ``DataError``
  names the offending tool and field).
- ``detect_family``: which call syntax a chat template teaches, read from its source as
  llama.cpp's common/chat.cpp reads it; ``supports_tools``: whether a template renders
  tools at all (the probe of llama.cpp's common/jinja/caps.cpp); ``needs_descriptions``:
  whether it fails on a tool without a description; ``shipped_template``:
  our ChatML template with tools, for models whose own template has none.
- ``parse_tool_calls``: a finished output as its content, calls and reasoning;
  ``ToolCallStream``: the same, incrementally, as OpenAI stream deltas.

Syntax per family (what the family's templates render, and what the call grammars of
``server/tool_grammar.py`` force):

==========  ===========================================================================
hermes      ``<tool_call>\\n{"name": N, "arguments": {...}}\\n</tool_call>``, repeatable;
            text before the first call is the content
llama3      the whole turn is ``{"name": N, "parameters": {...}}`` (``"arguments"`` and a
            leading ``"type": "function"`` accepted), optionally led by
            ``<|python_tag|>``, several separated by ``;``
mistral     ``[TOOL_CALLS][{"name": N, "arguments": {...}, "id": ...}, ...]``
generic     the whole turn is ``{"tool_calls": [{"name": N, "arguments": {...}}, ...]}``
            or ``{"response": "<the content as a JSON string>"}``
harmony     gpt-oss's messages (the output follows the prompt's ``<|start|>assistant``;
            each later message opens with ``<|start|>assistant``): ``<|channel|>analysis
            <|message|>...<|end|>`` is reasoning, ``<|channel|>final<|message|>...`` and
            ``<|channel|>commentary<|message|>...<|end|>`` (a preamble) are content, a
            call is ``[ to=functions.N]<|channel|>commentary[ to=functions.N][ json|
            <|constrain|>json]<|message|>{...}<|call|>`` (the recipient in the role or
            the channel header; channel commentary or analysis), repeatable
==========  ===========================================================================

Parsing rules, the same for both parsers: whitespace around a call is dropped (the
templates put newlines there); a call's ``arguments`` is the raw JSON text of the
arguments object as the model wrote it (an object, else the call is not a call); the
end marker of a group (``</tool_call>``, ``]``, ``]}``) may be missing; Mistral's
model-written ``id`` is read over, not used (a stream sends a call's id before the
model writes it), so every id comes from the id factory. A trigger whose call does not
parse (invalid JSON, a missing name, text cut off) stays content, text and all. Text
after the calls (which no call grammar admits) is content too.

Harmony (``_HarmonyScanner``, as llama.cpp's common/parsers/gpt-oss.cpp reads it): the
analysis channel is the reasoning (``ParsedOutput.reasoning``, streamed as
``ReasoningDelta``), never content; the server sends it as ``reasoning_content``, as
llama-server and vLLM do (``responses.choice``); the message end markers
(``<|end|>``, ``<|call|>``, ``<|return|>``) and the headers are read over; a message
addressed to a recipient outside ``functions.`` (a built-in tool the request did not
offer: ``to=python``, ``to=browser.search``) is dropped, as llama.cpp drops it; a
stray ``<|channel|>commentary[ to=assistant]`` before a channel header is read over.
Output that does not follow the format (no header, an unknown channel, a call whose
arguments do not parse) is content as written from there on.
"""

from __future__ import annotations

import json
import re
import secrets
import string
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from recallspec.errors import DataError

ToolFamily = Literal["hermes", "llama3", "mistral", "generic", "harmony"]
TOOL_FAMILIES: tuple[ToolFamily, ...] = ("hermes", "llama3", "mistral", "generic", "harmony")

MAX_TOOLS = 128  # tools in one request at most (vLLM and OpenAI allow as many)
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")

IdFactory = Callable[[], str]


# ---- ids -------------------------------------------------------------------------------

def new_call_id() -> str:
    """An OpenAI-style call id: "call_" and 24 hex digits."""
    return "call_" + uuid.uuid4().hex[:24]


_ALNUM = string.ascii_letters + string.digits


def new_mistral_call_id() -> str:
    """A Mistral call id: 9 ASCII letters and digits (Mistral's templates refuse others)."""
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


def default_id_factory(family: ToolFamily) -> IdFactory:
    """The id factory a family's calls use by default."""
    return new_mistral_call_id if family == "mistral" else new_call_id


# ---- the template's family and support --------------------------------------------------

def detect_family(template_source: str | None) -> ToolFamily:
    """The call syntax a chat template teaches, by the markers in its source (as
    llama.cpp's common/chat.cpp tells its formats apart): ``<tool_call>`` is Hermes
    (Qwen2.5, Qwen3, Hermes 2/3, our ChatML template); ``[TOOL_CALLS]`` is Mistral;
    ``<|python_tag|>``, or ``"parameters"`` together with ``<|eot_id|>``, is Llama 3.x;
    ``<|channel|>`` is harmony (gpt-oss; llama.cpp tests it first, as here);
    anything else (or no template) is "generic". The markers are looked for in this order;
    no template holds two of them."""
    src = template_source or ""
    if "<|channel|>" in src:
        return "harmony"
    if "<tool_call>" in src:
        return "hermes"
    if "[TOOL_CALLS]" in src:
        return "mistral"
    if "<|python_tag|>" in src or ('"parameters"' in src and "<|eot_id|>" in src):
        return "llama3"
    return "generic"


CHATML_TOOLS_TEMPLATE = "chatml_tools.jinja"


def shipped_template(name: str = CHATML_TOOLS_TEMPLATE) -> str:
    """The source of a chat template shipped in ``server/templates/`` (package data):
    ``chatml_tools.jinja`` is ChatML with Hermes tool calls, for ChatML models whose own
    template has no tools (SmolLM2)."""
    from importlib.resources import files

    path = files("recallspec.server").joinpath("templates", name)
    if not path.is_file():
        raise DataError(f"no shipped chat template {name!r}")
    return path.read_text(encoding="utf-8")


PROBE_TOOL_NAME = "recallspec_probe_tool"
_PROBE_ARG = "recallspec_probe_value"
PROBE_TOOL: Mapping[str, Any] = {
    "type": "function",
    "function": {
        "name": PROBE_TOOL_NAME,
        "description": "Tool description",
        "parameters": {
            "type": "object",
            "properties": {"arg": {"type": "string", "description": "Arg description"}},
            "required": ["arg"],
        },
    },
}

Render = Callable[[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]], str]


def supports_tools(template_source: str | None, render: Render) -> bool:
    """Whether a chat template renders tools and tool calls: llama.cpp's probe
    (common/jinja/caps.cpp). ``render(messages, tools)`` renders the template (for ours:
    ``lambda m, t: tokenizer.apply_chat_template(m, tools=t)``). True when a probe tool
    rendered with one user message shows the tool's name, and a conversation holding a
    call of it (arguments as a dict, as the server passes them) and its result renders,
    showing the call's argument. A template that raises on either, or that holds the
    probe's names itself, does not support tools."""
    src = template_source or ""
    if not src or PROBE_TOOL_NAME in src or _PROBE_ARG in src:
        return False
    tools = [PROBE_TOOL]
    user: dict[str, Any] = {"role": "user", "content": "User message"}
    conversation: list[dict[str, Any]] = [
        user,
        {"role": "assistant", "content": "", "tool_calls": [{
            "id": "call00001", "type": "function",
            "function": {"name": PROBE_TOOL_NAME, "arguments": {"arg": _PROBE_ARG}}}]},
        {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "The tool response was 'tool response'"},
        user,
    ]
    try:
        listed = render([user], tools)
        called = render(conversation, tools)
    except Exception:  # any template error: the template cannot take tools
        return False
    return PROBE_TOOL_NAME in listed and _PROBE_ARG in called


def needs_descriptions(render: Render) -> bool:
    """Whether a template that renders tools (``supports_tools``) fails on a tool without
    a description, which OpenAI's API allows: gpt-oss's writes ``"// " +
    tool.description``, an error on an undefined value. True when the probe tool renders
    with its description and not without it."""
    user: dict[str, Any] = {"role": "user", "content": "User message"}
    bare = {"type": "function", "function": {
        k: v for k, v in PROBE_TOOL["function"].items() if k != "description"}}
    try:
        render([user], [PROBE_TOOL])
    except Exception:  # no tools at all: not this question
        return False
    try:
        render([user], [bare])
    except Exception:  # any template error: the description is what it lacks
        return True
    return False


# ---- the request's tools -------------------------------------------------------------------

@dataclass(frozen=True)
class Tool:
    """One validated function tool. ``parameters_json``: its parameters' JSON schema as
    JSON text in the request's key order (the order the call grammar writes properties
    in; hashable, unlike a dict); a tool without parameters takes any object."""

    name: str
    description: str | None = None
    parameters_json: str = '{"type": "object"}'
    strict: bool | None = None

    @property
    def parameters(self) -> dict[str, Any]:
        """The parameters' schema as a fresh dict."""
        value: dict[str, Any] = json.loads(self.parameters_json)
        return value

    def to_openai(self, *, described: bool = False) -> dict[str, Any]:
        """The tool as the OpenAI request wrote it (what chat templates render);
        ``described``: with a description always, "" where the request gave none (for
        templates that cannot render a tool without one: ``needs_descriptions``)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None or described:
            function["description"] = self.description or ""
        function["parameters"] = self.parameters
        if self.strict is not None:
            function["strict"] = self.strict
        return {"type": "function", "function": function}


ToolChoiceMode = Literal["none", "auto", "required", "function"]


@dataclass(frozen=True)
class ToolChoice:
    """A validated ``tool_choice``: "none" (tools rendered, no grammar, no parsing),
    "auto" (the model chooses), "required" (at least one call) or "function" (a call of
    the tool named ``name``; ``name`` is set exactly for this mode)."""

    mode: ToolChoiceMode
    name: str | None = None


def validate_tools(tools: Any) -> tuple[Tool, ...]:
    """The OpenAI ``tools`` list (``[{"type": "function", "function": {"name",
    "description"?, "parameters"?, "strict"?}}]``) as ``Tool`` values. Raises
    ``DataError`` naming the tool and field for: not a list; more than ``MAX_TOOLS``; an
    item not an object or not of type "function"; a name not 1-64 characters of
    [A-Za-z0-9_.-], or repeated; a description not a string; parameters not a JSON-schema
    object (a dict, of ``"type": "object"`` where it has a type, JSON-serializable); a
    strict not a boolean. ``None`` is no tools."""
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise DataError("tools must be a list of function tools")
    if len(tools) > MAX_TOOLS:
        raise DataError(f"tools has {len(tools)} tools, over the {MAX_TOOLS} allowed")
    out: list[Tool] = []
    seen: set[str] = set()
    for i, item in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(item, Mapping):
            raise DataError(f"{where} must be an object")
        if item.get("type") != "function":
            raise DataError(f"{where}.type must be \"function\", not {item.get('type')!r}")
        fn = item.get("function")
        if not isinstance(fn, Mapping):
            raise DataError(f"{where}.function must be an object")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise DataError(f"{where}.function.name must be 1-64 characters of "
                            f"A-Z, a-z, 0-9, '_', '.' and '-', not {name!r}")
        where = f"{where} ({name!r})"
        if name in seen:
            raise DataError(f"{where}: the function name {name!r} is given twice")
        seen.add(name)
        description = fn.get("description")
        if description is not None and not isinstance(description, str):
            raise DataError(f"{where}.function.description must be a string")
        strict = fn.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise DataError(f"{where}.function.strict must be a boolean")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object"}
        if not isinstance(params, Mapping):
            raise DataError(f"{where}.function.parameters must be a JSON schema object")
        if "type" in params and params["type"] != "object":
            raise DataError(f"{where}.function.parameters must describe an object "
                            f"(\"type\": \"object\"), not {params['type']!r}")
        try:
            params_json = json.dumps(params, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise DataError(f"{where}.function.parameters is not JSON: {e}") from None
        out.append(Tool(name, description, params_json, strict))
    return tuple(out)


def validate_tool_choice(choice: Any, tools: Sequence[Tool]) -> ToolChoice:
    """``tool_choice`` checked against the request's tools: "none", "auto", "required" or
    ``{"type": "function", "function": {"name": <one of the tools>}}``. Missing: "auto"
    with tools, "none" without. Any choice but "none" needs tools (``DataError``, as does
    a name that is not one of them or any other value)."""
    if choice is None:
        return ToolChoice("auto" if tools else "none")
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise DataError(f"tool_choice must be \"none\", \"auto\", \"required\" or a "
                            f"named function, not {choice!r}")
        if choice != "none" and not tools:
            raise DataError(f"tool_choice {choice!r} needs tools")
        return ToolChoice(choice)  # type: ignore[arg-type]  # one of the three, checked
    if isinstance(choice, Mapping):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise DataError('tool_choice must be {"type": "function", "function": '
                            '{"name": ...}} when it is an object')
        if not tools:
            raise DataError(f"tool_choice names the function {name!r} but no tools are given")
        if name not in {t.name for t in tools}:
            raise DataError(f"tool_choice names the function {name!r}, which is not "
                            f"among the tools")
        return ToolChoice("function", name)
    raise DataError("tool_choice must be a string or an object")


# ---- the model's calls ------------------------------------------------------------------------

@dataclass(frozen=True)
class ToolCall:
    """One parsed call: ``arguments`` is the raw JSON text of the arguments object."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        """The call as an OpenAI ``message.tool_calls`` item."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ParsedOutput:
    """An output split into its content (None where there is none) and its calls;
    ``reasoning``: harmony's analysis messages (None where there are none, and in every
    other family), which are never content."""

    content: str | None
    calls: tuple[ToolCall, ...] = ()
    reasoning: str | None = None


@dataclass(frozen=True)
class ContentDelta:
    """Content text that is decided (never empty)."""

    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """Reasoning text that is decided (never empty; harmony's analysis channel only)."""

    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """One piece of a streamed call. A call's first delta has its ``id`` and ``name`` (and
    ``arguments`` ""); each later one has neither, and a fragment of the arguments."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    def to_openai(self) -> dict[str, Any]:
        """The delta as an OpenAI ``delta.tool_calls`` item."""
        if self.id is not None:
            return {"index": self.index, "id": self.id, "type": "function",
                    "function": {"name": self.name, "arguments": self.arguments}}
        return {"index": self.index, "function": {"arguments": self.arguments}}


StreamEvent = ContentDelta | ReasoningDelta | ToolCallDelta


def parse_tool_calls(family: ToolFamily, text: str, *,
                     new_id: IdFactory | None = None) -> ParsedOutput:
    """A finished output's content and calls (see the module's rules). A call counts only
    once it is complete: one that does not parse is content, as written."""
    scanner = _scanner(family, new_id or default_id_factory(family), eager=False)
    scanner.feed(text)
    scanner.finish()
    return scanner.result()


class ToolCallStream:
    """``parse_tool_calls`` incrementally: ``feed`` each text delta of the output, then
    ``finish`` once; each returns the content, reasoning and call deltas that became
    decided, in order. Text that may still begin a call (a partial trigger, whitespace
    before one, a call's head before its name is complete) or an end marker (harmony)
    is held back until it is decided; a call's header goes out once its name and the
    start of its arguments are read, then its arguments as they come.

    The deltas do not depend on how the text is split. For every text whose calls all
    parse (all text the call grammars admit), they add up to ``parse_tool_calls`` of the
    whole text: the content deltas to its content, the reasoning deltas to its
    reasoning, each call's argument fragments to its arguments, with ids drawn in the
    same order. A call that breaks after its header was sent (its arguments not JSON,
    the text cut off inside it) cannot be taken back: it ends with the arguments sent so
    far and the text after the break is content, where ``parse_tool_calls`` has that
    call's text as content."""

    def __init__(self, family: ToolFamily, *, new_id: IdFactory | None = None) -> None:
        self._scanner = _scanner(family, new_id or default_id_factory(family), eager=True)

    def feed(self, delta: str) -> list[StreamEvent]:
        return self._scanner.feed(delta)

    def finish(self) -> list[StreamEvent]:
        return self._scanner.finish()

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        """The calls whose headers went out so far, with their arguments so far."""
        return self._scanner.result().calls

    def result(self) -> ParsedOutput:
        """Everything sent so far, added up."""
        return self._scanner.result()


# ---- the scanner: one state machine for both parsers ---------------------------------------
# Patterns are tuples of elements: a literal str, _WS (whitespace, possibly none), _STR (a
# JSON string, captured decoded), _Alt (ordered choice: the first alternative that matches,
# waiting while one that comes first might still match). A match returns the end position,
# None where the text cannot match, or _MORE where only more text can tell. Decisions are
# made on the first character that settles them, so no decision depends on where the text
# was split.

class _More:
    pass


_MORE = _More()
_WS = object()
_STR = object()
_WS_CHARS = " \t\n\r"


@dataclass(frozen=True)
class _Alt:
    options: tuple[tuple[Any, ...], ...]


def _opt(*pattern: Any) -> _Alt:
    return _Alt((pattern, ()))


_WORD_MAX = 128


@dataclass(frozen=True)
class _Word:
    """1 to ``_WORD_MAX`` characters of ``chars``, captured as ``(tag, word)``."""

    tag: str
    chars: frozenset[str]


_Match = int | None | _More


def _match(pattern: tuple[Any, ...], buf: str, i: int, final: bool,
           caps: list[Any]) -> _Match:
    for el in pattern:
        r = _match_one(el, buf, i, final, caps)
        if not isinstance(r, int):
            return r
        i = r
    return i


def _match_one(el: Any, buf: str, i: int, final: bool, caps: list[Any]) -> _Match:
    n = len(buf)
    if el is _WS:
        while i < n and buf[i] in _WS_CHARS:
            i += 1
        return i
    if el is _STR:
        if i >= n:
            return None if final else _MORE
        if buf[i] != '"':
            return None
        j = i + 1
        while j < n and buf[j] != '"':
            j += 2 if buf[j] == "\\" else 1
        if j >= n:
            return None if final else _MORE
        try:
            caps.append(json.loads(buf[i:j + 1]))
        except ValueError:
            return None
        return j + 1
    if isinstance(el, _Word):
        j = i
        while j < n and buf[j] in el.chars and j - i <= _WORD_MAX:
            j += 1
        if j - i > _WORD_MAX:
            return None
        if j == n and not final:
            return _MORE
        if j == i:
            return None
        caps.append((el.tag, buf[i:j]))
        return j
    if isinstance(el, _Alt):
        for option in el.options:
            sub: list[Any] = []
            r = _match(option, buf, i, final, sub)
            if r is _MORE or isinstance(r, int):
                caps.extend(sub)
                return r
        return None
    seg = buf[i:i + len(el)]
    if seg == el:
        return i + len(el)
    if len(seg) < len(el) and el.startswith(seg):
        return None if final else _MORE
    return None


# A call's head: from its opening brace to the brace that opens its arguments.
_NAME_ARGS_HEAD = (_WS, "{", _WS, '"name"', _WS, ":", _WS, _STR, _WS, ",", _WS,
                   '"arguments"', _WS, ":", _WS, "{")
_CLOSE_BRACE = (_WS, "}")


@dataclass(frozen=True)
class _Syntax:
    """A family's call syntax. ``trigger``: the text that opens a group of calls anywhere
    in the content (None: a group can only open the output). ``open``: the group's start
    (at the trigger, or at the output's start); ``head``: a call up to the brace of its
    arguments, capturing the name first; ``tail``: a call's end after its arguments;
    ``sep``: between two calls of a group (None: one call a group); ``close``: the
    group's end, optional; ``response``: generic's ``{"response": "`` alternative."""

    trigger: str | None
    open: tuple[Any, ...]
    head: tuple[Any, ...]
    tail: tuple[Any, ...]
    sep: tuple[Any, ...] | None
    close: tuple[Any, ...] | None
    response: tuple[Any, ...] | None = None


_SYNTAX: dict[ToolFamily, _Syntax] = {
    "hermes": _Syntax("<tool_call>", ("<tool_call>",), _NAME_ARGS_HEAD, _CLOSE_BRACE,
                      None, (_WS, "</tool_call>")),
    "mistral": _Syntax(
        "[TOOL_CALLS]", ("[TOOL_CALLS]", _WS, "["), _NAME_ARGS_HEAD,
        (_WS, _opt(",", _WS, '"id"', _WS, ":", _WS, _STR), _WS, "}"),
        (_WS, ","), (_WS, "]")),
    "llama3": _Syntax(
        None, (_opt(_WS, "<|python_tag|>"),),
        (_WS, "{", _WS, _opt('"type"', _WS, ":", _WS, '"function"', _WS, ",", _WS),
         '"name"', _WS, ":", _WS, _STR, _WS, ",", _WS,
         _Alt((('"parameters"',), ('"arguments"',))), _WS, ":", _WS, "{"),
        _CLOSE_BRACE, (_WS, ";"), None),
    "generic": _Syntax(
        None, (_WS, "{", _WS, '"tool_calls"', _WS, ":", _WS, "["), _NAME_ARGS_HEAD,
        _CLOSE_BRACE, (_WS, ","), (_WS, "]", _WS, "}"),
        response=(_WS, "{", _WS, '"response"', _WS, ":", _WS, '"')),
}

_JSON_STRING_TAIL = json.JSONDecoder(strict=False)
# States that read nothing before the position (no call pending), and how much decided
# text the stream keeps before dropping it.
_COMPACTABLE = frozenset({"content", "plain", "after", "after_call", "response",
                          "response_tail"})
_KEEP = 4096


@dataclass
class _Call:
    """The call being read. Its text from ``restore`` on is content again if it breaks
    before its header went out; scanning then resumes at ``resume``."""

    name: str
    args_start: int
    restore: int
    resume: int
    scan: int  # the next character of the arguments to read
    depth: int = 0
    in_string: bool = False
    escape: bool = False
    index: int = -1  # set once its header goes out
    sent: int = 0  # the end of the arguments text sent so far


class _ScannerBase:
    """What both parsers share: the text read so far, the events and results sent.
    ``eager``: send a call's header and argument fragments as they are read (the
    stream), or only once the call is complete (the whole-text parse). ``_COMPACT``: the
    states that read nothing before the position."""

    _COMPACT: frozenset[str] = frozenset()

    def __init__(self, new_id: IdFactory, *, eager: bool, state: str) -> None:
        self._new_id = new_id
        self._eager = eager
        self._buf = ""
        self._pos = 0
        self._state = state
        self._call: _Call | None = None
        self._finished = False
        self._out: list[StreamEvent] = []
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[list[str]] = []  # [id, name, arguments so far]
        self._break_at = 0  # where the last arguments that did not parse stopped fitting

    # ---- public ----
    def feed(self, delta: str) -> list[StreamEvent]:
        if self._finished:
            raise ValueError("feed after finish")
        self._buf += delta
        self._advance(final=False)
        if self._pos > _KEEP and self._state in self._COMPACT:
            # nothing before the position is read again: drop it, so that a long output
            # does not make each delta copy all of it
            self._buf = self._buf[self._pos:]
            self._pos = 0
        return self._take()

    def finish(self) -> list[StreamEvent]:
        if self._finished:
            raise ValueError("finish called twice")
        self._finished = True
        self._advance(final=True)
        return self._take()

    def result(self) -> ParsedOutput:
        content = "".join(self._content)
        reasoning = "".join(self._reasoning)
        return ParsedOutput(content or None,
                            tuple(ToolCall(i, n, a) for i, n, a in self._calls),
                            reasoning or None)

    def _advance(self, *, final: bool) -> None:
        raise NotImplementedError

    def _break(self, at: int) -> bool:
        """The current call does not parse; ``at``: where its text stopped fitting."""
        raise NotImplementedError

    # ---- states both parsers have ----
    def _args(self, final: bool) -> bool:
        """A call's arguments, then its "tail" state."""
        end = self._read_args(final)
        if end is None:
            return self._break(self._break_at)
        if end < 0:
            return False
        self._pos = end
        self._state = "tail"
        return True

    def _plain(self, final: bool) -> bool:
        """The rest of the text is content."""
        self._emit_content(self._buf[self._pos:])
        self._pos = len(self._buf)
        return False

    # ---- output ----
    def _take(self) -> list[StreamEvent]:
        out, self._out = self._out, []
        return out

    def _emit_content(self, text: str) -> None:
        self._emit_text(text, self._content, ContentDelta)

    def _emit_reasoning(self, text: str) -> None:
        self._emit_text(text, self._reasoning, ReasoningDelta)

    def _emit_text(self, text: str, parts: list[str],
                   delta: type[ContentDelta] | type[ReasoningDelta]) -> None:
        """``text`` kept in ``parts`` and sent as a ``delta``, joined to the last one
        when that is of the same kind."""
        if not text:
            return
        parts.append(text)
        last = self._out[-1] if self._out else None
        if isinstance(last, delta):
            self._out[-1] = delta(last.text + text)
        else:
            self._out.append(delta(text))

    def _emit_header(self, call: _Call) -> None:
        call.index = len(self._calls)
        call_id = self._new_id()
        self._calls.append([call_id, call.name, ""])
        self._out.append(ToolCallDelta(call.index, "", call_id, call.name))

    def _emit_args(self, call: _Call, end: int) -> None:
        fragment = self._buf[call.sent:end]
        call.sent = end
        if not fragment:
            return
        self._calls[call.index][2] += fragment
        last = self._out[-1] if self._out else None
        if isinstance(last, ToolCallDelta) and last.id is None and last.index == call.index:
            self._out[-1] = ToolCallDelta(call.index, last.arguments + fragment)
        else:
            self._out.append(ToolCallDelta(call.index, fragment))

    def _read_args(self, final: bool) -> int | None:
        """The current call's arguments read on (their fragments sent where eager): their
        end once they close as a JSON object, -1 where more text is needed, None where
        they do not parse (cut off at the end, not JSON, not an object), ``_break_at``
        then being where their text stopped fitting."""
        call = self._call
        assert call is not None
        buf, n = self._buf, len(self._buf)
        end = _scan_json(call, buf)
        if end < 0:
            if self._eager:
                self._emit_args(call, n)
            self._break_at = n
            return None if final else -1
        try:
            valid = isinstance(json.loads(buf[call.args_start:end]), dict)
        except ValueError:
            valid = False
        if self._eager:
            self._emit_args(call, end)
        if not valid:
            self._break_at = end
            return None
        return end


def _scan_json(call: _Call, buf: str) -> int:
    """Scan ``buf`` on from ``call.scan`` for the end of the JSON value that opened at
    ``call.args_start`` (strings and nesting tracked in ``call``): the index just past it,
    or -1 where it does not end in ``buf``."""
    n = len(buf)
    i, depth, in_string, escape = call.scan, call.depth, call.in_string, call.escape
    end = -1
    while i < n:
        c = buf[i]
        i += 1
        if in_string:
            if escape:
                escape = False
            elif c == "\\":
                escape = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                end = i
                break
    call.scan, call.depth, call.in_string, call.escape = i, depth, in_string, escape
    return end


def _scanner(family: ToolFamily, new_id: IdFactory, *, eager: bool) -> _ScannerBase:
    if family == "harmony":
        return _HarmonyScanner(new_id, eager=eager)
    return _Scanner(family, new_id, eager=eager)


class _Scanner(_ScannerBase):
    """The parser of the families of ``_SYNTAX``."""

    _COMPACT = _COMPACTABLE

    def __init__(self, family: ToolFamily, new_id: IdFactory, *, eager: bool) -> None:
        if family not in _SYNTAX:
            raise DataError(f"unknown tool family {family!r}: one of {', '.join(TOOL_FAMILIES)}")
        self._syn = _SYNTAX[family]
        super().__init__(new_id, eager=eager,
                         state="content" if self._syn.trigger is not None else "start")
        self._head_start = 0
        self._restore = 0

    # ---- the state machine ----
    def _advance(self, *, final: bool) -> None:
        step = {
            "start": self._start, "content": self._content_state, "head": self._head,
            "args": self._args, "tail": self._tail, "after_call": self._after_call,
            "after": self._after, "plain": self._plain, "response": self._response,
            "response_tail": self._response_tail,
        }
        while step[self._state](final):
            pass

    def _text_state(self) -> str:
        return "content" if self._syn.trigger is not None else "plain"

    def _begin(self, head_end: int, name: str, restore: int, resume: int) -> bool:
        """A call whose head ends at ``head_end`` (just past its arguments' brace)."""
        start = head_end - 1
        call = _Call(name, start, restore, resume, scan=start, sent=start)
        self._call = call
        if self._eager:
            self._emit_header(call)
        self._pos = start
        self._state = "args"
        return True

    def _fail_head(self, restore: int, resume: int) -> bool:
        self._emit_content(self._buf[restore:resume])
        self._pos = resume
        self._state = self._text_state()
        return True

    def _break(self, at: int) -> bool:
        """The current call does not parse; ``at``: where its text stopped fitting."""
        call = self._call
        assert call is not None
        self._call = None
        if call.index >= 0:  # its header went out: it stays, cut short
            self._pos = at
            self._state = self._text_state()
            return True
        return self._fail_head(call.restore, call.resume)

    def _start(self, final: bool) -> bool:
        syn = self._syn
        caps: list[Any] = []
        r = _match(syn.open + syn.head, self._buf, self._pos, final, caps)
        if r is _MORE:
            return False
        if isinstance(r, int):
            return self._begin(r, str(caps[0]), self._pos, self._pos)
        if syn.response is not None:
            r = _match(syn.response, self._buf, self._pos, final, [])
            if r is _MORE:
                return False
            if isinstance(r, int):
                self._pos = r
                self._state = "response"
                return True
        self._state = "plain"
        return True

    def _content_state(self, final: bool) -> bool:
        trigger = self._syn.trigger
        assert trigger is not None
        buf, pos = self._buf, self._pos
        idx = buf.find(trigger, pos)
        if idx >= 0:
            keep = buf[pos:idx].rstrip(_WS_CHARS)
            self._emit_content(keep)
            self._restore = pos + len(keep)
            self._head_start = self._pos = idx
            self._state = "head"
            return True
        end = len(buf)
        if not final:
            for k in range(min(len(trigger) - 1, end - pos), 0, -1):
                if buf.endswith(trigger[:k]):
                    end -= k
                    break
            end = pos + len(buf[pos:end].rstrip(_WS_CHARS))
        self._emit_content(buf[pos:end])
        self._pos = end
        return False

    def _head(self, final: bool) -> bool:
        syn = self._syn
        assert syn.trigger is not None
        caps: list[Any] = []
        r = _match(syn.open + syn.head, self._buf, self._head_start, final, caps)
        if r is _MORE:
            return False
        resume = self._head_start + len(syn.trigger)
        if isinstance(r, int):
            return self._begin(r, str(caps[0]), self._restore, resume)
        return self._fail_head(self._restore, resume)

    def _tail(self, final: bool) -> bool:
        call = self._call
        assert call is not None
        r = _match(self._syn.tail, self._buf, self._pos, final, [])
        if r is _MORE:
            return False
        if r is None:
            return self._break(self._pos)
        assert isinstance(r, int)
        if call.index < 0:
            self._emit_header(call)
            self._emit_args(call, self._pos)
        self._call = None
        self._pos = r
        self._state = "after_call"
        return True

    def _after_call(self, final: bool) -> bool:
        syn = self._syn
        buf, pos = self._buf, self._pos
        if syn.sep is not None:
            caps: list[Any] = []
            r = _match(syn.sep + syn.head, buf, pos, final, caps)
            if r is _MORE:
                return False
            if isinstance(r, int):
                return self._begin(r, str(caps[0]), pos, pos)
        if syn.close is not None:
            r = _match(syn.close, buf, pos, final, [])
            if r is _MORE:
                return False
            if isinstance(r, int):
                self._pos = r
        self._state = "after"
        return True

    def _after(self, final: bool) -> bool:
        buf, i = self._buf, self._pos
        while i < len(buf) and buf[i] in _WS_CHARS:
            i += 1
        if i == len(buf) and not final:
            return False
        self._pos = i
        self._state = self._text_state()
        return i < len(buf)

    def _response(self, final: bool) -> bool:
        """Generic's ``{"response": "...`` string, decoded as it comes: a segment is decoded
        up to the last point that is not inside an escape (nor right after the high half
        of a surrogate pair's escape)."""
        buf, n, start = self._buf, len(self._buf), self._pos
        i, closed = start, False
        while i < n:
            c = buf[i]
            if c == '"':
                closed = True
                break
            if c != "\\":
                i += 1
                continue
            if i + 1 >= n:
                break
            if buf[i + 1] != "u":
                i += 2
                continue
            if i + 6 > n:
                break
            code = buf[i + 2:i + 6]
            if (not final and _is_hex4(code) and 0xD800 <= int(code, 16) <= 0xDBFF
                    and i + 12 > n and "\\u".startswith(buf[i + 6:i + 8])):
                break  # a pair's high half: wait for the low half that may follow
            i += 6
        if not closed and not final and i == start:
            return False
        try:
            text, _ = _JSON_STRING_TAIL.raw_decode('"' + buf[start:i] + '"')
        except ValueError:
            self._state = "plain"  # not a JSON string after all: the rest as written
            return True
        self._emit_content(text)
        self._pos = i
        if closed:
            self._pos = i + 1
            self._state = "response_tail"
            return True
        if final:
            self._pos = n  # an escape cut off at the end: dropped
        return False

    def _response_tail(self, final: bool) -> bool:
        r = _match(_CLOSE_BRACE, self._buf, self._pos, final, [])
        if r is _MORE:
            return False
        if isinstance(r, int):
            self._pos = r
        self._state = "after"
        return True


# ---- harmony (gpt-oss) ------------------------------------------------------------------------
# A message: its header (after ``<|start|>assistant``, or at the output's start: the prompt
# ends with it), ``<|message|>``, its body up to an end marker. The header's recipient
# ("to") is in the role part (before the channel) or after the channel's name.

_RECIPIENT_CHARS = frozenset(string.ascii_letters + string.digits + "_.-")
_TYPE_CHARS = frozenset(string.ascii_letters + string.digits + "_-")
_H_CONSTRAINT = _opt(_WS, _opt("<|constrain|>"), _Word("type", _TYPE_CHARS))
_H_CHANNEL = ("<|channel|>", _Word("channel", _TYPE_CHARS),
              _opt(" to=", _Word("channel_to", _RECIPIENT_CHARS)))
_HEADER = (_Alt((
    # llama.cpp's stray "<|channel|>commentary[ to=assistant]" before the real channel
    ("<|channel|>commentary", _opt(" to=assistant"), *_H_CHANNEL, _H_CONSTRAINT,
     "<|message|>"),
    (_opt(" to=", _Word("role_to", _RECIPIENT_CHARS)), _opt(*_H_CHANNEL), _H_CONSTRAINT,
     "<|message|>"),
)),)
_NEXT_MESSAGE = ("<|start|>", "assistant")
_END_MARKERS = ("<|end|>", "<|call|>", "<|return|>")
_CALL_END = (_Alt((("<|call|>",), ("<|end|>",), ("<|return|>",))),)
_FUNCTIONS = "functions."


class _HarmonyScanner(_ScannerBase):
    """The harmony parser (see the module's docstring). States: "header" (a message's
    header at the position; ``_msg_start``: where the message's text began, content
    from there if it breaks), "body" (a message's text, ``_kind`` "reasoning", "content"
    or "skip"), "call" (after a call's header: its arguments' opening brace), "args",
    "tail" (after the arguments: an end marker or the output's end), "next" (between
    messages), "plain" (the rest is content)."""

    _COMPACT = frozenset({"body", "plain"})

    def __init__(self, new_id: IdFactory, *, eager: bool) -> None:
        super().__init__(new_id, eager=eager, state="header")
        self._msg_start = 0
        self._kind = "content"
        self._name = ""

    def _advance(self, *, final: bool) -> None:
        step = {"header": self._header, "body": self._body, "call": self._call_start,
                "args": self._args, "tail": self._tail, "next": self._next,
                "plain": self._plain}
        while step[self._state](final):
            pass

    def _fail(self) -> bool:
        """The message does not follow the format: its text and the rest are content."""
        self._pos = self._msg_start
        self._state = "plain"
        return True

    def _header(self, final: bool) -> bool:
        caps: list[Any] = []
        r = _match(_HEADER, self._buf, self._pos, final, caps)
        if r is _MORE:
            return False
        if not isinstance(r, int):
            return self._fail()
        h: dict[str, str] = dict(caps)
        channel = h.get("channel")
        to = h.get("channel_to") or h.get("role_to")
        if to == "assistant":  # addressed to the assistant itself: an ordinary message
            to = None
        self._pos = r
        if to is not None:
            name = to[len(_FUNCTIONS):] if to.startswith(_FUNCTIONS) else None
            if name is None:  # a built-in tool not offered (python, browser): dropped
                self._kind, self._state = "skip", "body"
                return True
            if channel not in ("commentary", "analysis") or not _NAME_RE.fullmatch(name):
                return self._fail()
            self._name, self._state = name, "call"
            return True
        if channel == "analysis":
            self._kind = "reasoning"
        elif channel in ("final", "commentary"):
            self._kind = "content"
        else:
            return self._fail()
        self._state = "body"
        return True

    def _body(self, final: bool) -> bool:
        buf, pos = self._buf, self._pos
        found = [(i, m) for m in _END_MARKERS if (i := buf.find(m, pos)) >= 0]
        if found:
            idx, marker = min(found)
            self._emit_body(buf[pos:idx])
            self._pos = idx + len(marker)
            self._state = "next"
            return True
        end = len(buf)
        if not final:  # hold back what may begin an end marker
            for k in range(min(len("<|return|>") - 1, end - pos), 0, -1):
                tail = buf[end - k:]
                if any(m.startswith(tail) for m in _END_MARKERS):
                    end -= k
                    break
        self._emit_body(buf[pos:end])
        self._pos = end
        return False

    def _emit_body(self, text: str) -> None:
        if not text:
            return
        if self._kind == "content":
            self._emit_content(text)
        elif self._kind == "reasoning":
            self._emit_reasoning(text)

    def _call_start(self, final: bool) -> bool:
        buf, i = self._buf, self._pos
        while i < len(buf) and buf[i] in _WS_CHARS:
            i += 1
        if i == len(buf):
            return self._fail() if final else False
        if buf[i] != "{":
            return self._fail()
        call = _Call(self._name, i, self._msg_start, self._msg_start, scan=i, sent=i)
        self._call = call
        if self._eager:
            self._emit_header(call)
        self._pos = i
        self._state = "args"
        return True

    def _break(self, at: int) -> bool:
        call = self._call
        assert call is not None
        self._call = None
        if call.index >= 0:  # its header went out: it stays, cut short
            self._pos = at
            self._state = "plain"
            return True
        return self._fail()

    def _tail(self, final: bool) -> bool:
        call = self._call
        assert call is not None
        buf, i = self._buf, self._pos
        while i < len(buf) and buf[i] in _WS_CHARS:
            i += 1
        if i == len(buf) and not final:
            return False
        end = i
        if i < len(buf):
            r = _match(_CALL_END, buf, i, final, [])
            if r is _MORE:
                return False
            if not isinstance(r, int):
                return self._break(self._pos)
            end = r
        if call.index < 0:
            self._emit_header(call)
            self._emit_args(call, self._pos)
        self._call = None
        self._pos = end
        self._state = "next"
        return True

    def _next(self, final: bool) -> bool:
        buf, i = self._buf, self._pos
        while i < len(buf) and buf[i] in _WS_CHARS:
            i += 1
        if i == len(buf):
            if final:
                self._pos = i  # whitespace after the last message: dropped
            return False
        r = _match(_NEXT_MESSAGE, buf, i, final, [])
        if r is _MORE:
            return False
        self._msg_start = self._pos
        # (a header without "<|start|>assistant" before it is read as well)
        self._pos = r if isinstance(r, int) else i
        self._state = "header"
        return True


def _is_hex4(s: str) -> bool:
    return len(s) == 4 and all(c in string.hexdigits for c in s)
