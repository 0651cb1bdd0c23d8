"""The grammar that constrains a request's tool calls, per template family.

``tool_guide`` turns the validated tools and ``tool_choice`` into a ``Guide`` of kind
"llguidance": a Lark grammar in llguidance's syntax, which the grammar package compiles
as it is (``llguidance.LLMatcher(tokenizer, source)``). Every call is a JSON object
``{"name": <const>, "arguments": <that tool's parameters schema>}`` (Llama 3.x:
``"parameters"``): an ``anyOf`` over the tools, the name's const first, so the name
settles which schema the arguments follow. The JSON is compact with json.dumps'
separators (", " and ": ", no other whitespace): what the templates' ``tojson`` writes
in the transcript, so most of a call's bytes are forced and earlier calls are
byte-identical drafts.

Per ``tool_choice``:
- "none": no guide (the tools are rendered, the output is neither constrained nor parsed).
- "required", or one named function: the family's call syntax from the first token, one
  call when ``parallel_tool_calls`` is false, else one or more.
- "auto": text is free until the family's trigger (``<tool_call>`` for Hermes,
  ``[TOOL_CALLS]`` for Mistral), then the call syntax holds, as llguidance's ``StructTag``
  writes it (a lazy lexeme: the trigger ends the text the first time it appears, so
  content never holds it). After the calls only the end of the turn may follow.

Families without a trigger inside text:
- Llama 3.x writes a call as the whole turn, ``{"name": ..., "parameters": ...}``; its
  templates refuse more than one call, so there is always one (``parallel_tool_calls``
  is not read). Under "auto" the turn is either a call or text that does not open with
  ``{`` (after optional whitespace): the turn's first ``{`` is the trigger.
  ``<|python_tag|>`` may lead the call where the tokenizer has it as a special token.
- "generic" (a template without tools) is constrained from the first token to
  ``{"tool_calls": [<calls>]}``, or under "auto" also to ``{"response": "<string>"}``,
  the content (llama.cpp's former GENERIC format).

Harmony (gpt-oss) writes no JSON wrapper: a call is a message whose header names the
tool, ``[ to=functions.NAME]<|channel|>commentary|analysis[ to=functions.NAME]``
(the recipient in the role or in the channel header), then `` json`` / `` <|constrain|>
json`` optionally, ``<|message|>`` and the arguments, that tool's parameters schema.
The header's name settles the schema. The output follows the prompt's
``<|start|>assistant``: any number of analysis or commentary (preamble) messages, each
ending ``<|end|><|start|>assistant``, come first, then under "required" or a named
function a call, and under "auto" a call or the final message
(``<|channel|>final<|message|>`` and free text). A call ends the turn: ``<|call|>``, an
end-of-sequence token, follows it, so there is one call a turn (``parallel_tool_calls``
is not read), as llama.cpp's gpt-oss grammar has it. The message bodies are text up to
``<|end|>`` (a token reference where it is a special token, else a lazy lexeme).

Markers the tokenizer has as special tokens (Qwen's ``<tool_call>``, Mistral's
``[TOOL_CALLS]``, Llama's ``<|python_tag|>``) must be written as token references, since
text never matches a special token: pass them in ``special_tokens`` (``special_marker_ids``
finds them); every other marker is text.

Tool schemas are compiled as given (llguidance refuses keywords it does not implement:
the grammar then fails to compile, which the server reports as a 400).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from recallspec.decoding.masks import Guide
from recallspec.errors import DataError
from recallspec.server.tool_calls import Tool, ToolChoice, ToolFamily

# llguidance's JSON options for every call: no free whitespace, json.dumps' separators.
JSON_OPTIONS: Mapping[str, Any] = {
    "whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

# The markers of each family that a tokenizer may hold as special tokens.
FAMILY_MARKERS: Mapping[ToolFamily, tuple[str, ...]] = {
    "hermes": ("<tool_call>", "</tool_call>"),
    "mistral": ("[TOOL_CALLS]",),
    "llama3": ("<|python_tag|>",),
    "generic": (),
    "harmony": ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>"),
}

# Text of any length, newlines included (StructTag's default text regex).
_TEXT = r"/(.|\n)*/"
# Llama 3.x under "auto": text whose first non-whitespace character is not "{".
_TEXT_NOT_JSON = r"/[ \t\n\r]*([^{ \t\n\r](.|\n)*)?/"


def special_marker_ids(family: ToolFamily,
                       special_id: Callable[[str], int | None]) -> dict[str, int]:
    """The family's markers that are special tokens: ``special_id(marker)`` is the token
    id where the tokenizer encodes the marker as one token that llguidance treats as
    special, else None (for example ``lambda m: i if (i := tok.token_to_id(m)) is not
    None and lltok.is_special_token(i) else None``)."""
    out: dict[str, int] = {}
    for marker in FAMILY_MARKERS[family]:
        i = special_id(marker)
        if i is not None:
            out[marker] = i
    return out


def _arguments_schema(tool: Tool) -> dict[str, Any]:
    """A tool's parameters schema, of type object where it names no type (arguments are
    an object whatever else the schema says)."""
    params = tool.parameters
    return params if "type" in params else {"type": "object", **params}


def call_schema(tools: Sequence[Tool], *, arguments_key: str = "arguments",
                extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON schema of one call of any of ``tools``: an ``anyOf`` of objects whose
    first property is ``name``, a const, and second ``arguments_key``, the tool's
    parameters (of type object where they name no type); ``extra`` adds required
    properties after them (Mistral's ``id``)."""
    if not tools:
        raise DataError("a call grammar needs at least one tool")
    options = []
    for tool in tools:
        properties: dict[str, Any] = {"name": {"const": tool.name},
                                      arguments_key: _arguments_schema(tool)}
        properties.update(extra or {})
        options.append({"type": "object", "properties": properties,
                        "required": list(properties), "additionalProperties": False})
    return options[0] if len(options) == 1 else {"anyOf": options}


def tool_grammar(tools: Sequence[Tool], choice: ToolChoice, *, family: ToolFamily,
                 parallel_tool_calls: bool = True,
                 special_tokens: Mapping[str, int] | None = None) -> str | None:
    """The Lark grammar (llguidance's syntax) of the calls, or None for "none" (see the
    module's docstring)."""
    if choice.mode == "none":
        return None
    if choice.mode == "function":
        tools = [t for t in tools if t.name == choice.name]
    if not tools:
        raise DataError("tool_choice needs tools" if choice.mode != "function" else
                        f"tool_choice names the function {choice.name!r}, which is not "
                        f"among the tools")
    special = dict(special_tokens or {})
    lazy = choice.mode == "auto"
    many = parallel_tool_calls

    def marker(text: str) -> str:
        return f"<[{special[text]}]>" if text in special else json.dumps(text)

    def trigger_rule(text: str) -> list[str]:
        """The rules of ``trig``: text up to the first trigger (StructTag's lazy lexeme)."""
        if text in special:
            return [f"trig: TEXT {marker(text)}"]
        return [f"trig[lazy]: TEXT {json.dumps(text)}"]

    rules: list[str]
    if family == "hermes":
        body = "call_body"
        call = f'{marker("<tool_call>")} "\\n" {body} "\\n" {marker("</tool_call>")}'
        more = ' ("\\n" call)*' if many else ""
        if lazy:
            first = f'trig "\\n" {body} "\\n" {marker("</tool_call>")}'
            rules = ["start: TEXT | calls", f"calls: {first}{more}", f"call: {call}",
                     *trigger_rule("<tool_call>"), f"TEXT: {_TEXT}"]
        else:
            rules = [f"start: call{more}", f"call: {call}"]
        rules.append(f"{body}: {_json(call_schema(tools))}")
    elif family == "mistral":
        array: dict[str, Any] = {
            "type": "array", "minItems": 1,
            "items": call_schema(tools, extra={
                "id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}})}
        if not many:
            array["maxItems"] = 1
        if lazy:
            rules = ["start: TEXT | trig calls", *trigger_rule("[TOOL_CALLS]"),
                     f"TEXT: {_TEXT}"]
        else:
            rules = [f'start: {marker("[TOOL_CALLS]")} calls']
        rules.append(f"calls: {_json(array)}")
    elif family == "llama3":
        alternatives = ["call"]
        if "<|python_tag|>" in special:
            alternatives.append(f'{marker("<|python_tag|>")} call')
        if lazy:
            alternatives.insert(0, "TEXT")
            rules = [f"start: {' | '.join(alternatives)}", f"TEXT: {_TEXT_NOT_JSON}"]
        else:
            rules = [f"start: {' | '.join(alternatives)}"]
        rules.append(f"call: {_json(call_schema(tools, arguments_key='parameters'))}")
    elif family == "generic":
        calls: dict[str, Any] = {"type": "array", "minItems": 1, "items": call_schema(tools)}
        if not many:
            calls["maxItems"] = 1
        schema: dict[str, Any] = _object({"tool_calls": calls})
        if lazy:
            schema = {"anyOf": [schema, _object({"response": {"type": "string"}})]}
        rules = [f"start: {_json(schema)}"]
    elif family == "harmony":
        rules = _harmony_rules(tools, lazy, marker)
    else:
        raise DataError(f"unknown tool family {family!r}")
    return "%llguidance {}\n" + "\n".join(rules) + "\n"


def _harmony_rules(tools: Sequence[Tool], lazy: bool,
                   marker: Callable[[str], str]) -> list[str]:
    """Harmony's rules (see the module's docstring); ``marker``: a marker as a token
    reference or its text."""
    channel, message, end = marker("<|channel|>"), marker("<|message|>"), marker("<|end|>")
    constrain = marker("<|constrain|>")
    # a message's body and its end: text up to <|end|>; where <|end|> is text, the first
    # one ends the body (a lazy lexeme), as a special token it is one
    body_end = (f"body_end: TEXT {end}" if end.startswith("<[") else
                f"body_end[lazy]: TEXT {end}")
    rules = [
        f"start: pre* {'(final | call)' if lazy else 'call'}",
        f'pre: {channel} ("analysis" | "commentary") {message} body_end '
        f'{marker("<|start|>")} "assistant"',
        body_end,
        'chan: "commentary" | "analysis"',
        f'con: " " {constrain} "json" | " json" | {constrain} "json"',
        "call: " + " | ".join(f"call_{i}" for i in range(len(tools))),
    ]
    for i, tool in enumerate(tools):
        to = json.dumps(f" to=functions.{tool.name}")
        rules += [f"call_{i}: ({to} {channel} chan | {channel} chan {to}) con? {message} "
                  f"args_{i}",
                  f"args_{i}: {_json(_arguments_schema(tool))}"]
    if lazy:
        rules.append(f'final: {channel} "final" {message} TEXT')
    rules.append(f"TEXT: {_TEXT}")
    return rules


def tool_guide(tools: Sequence[Tool], choice: ToolChoice, *, family: ToolFamily,
               parallel_tool_calls: bool = True,
               special_tokens: Mapping[str, int] | None = None) -> Guide | None:
    """``tool_grammar`` as the request's guide (kind "llguidance"), None for "none".
    Raises ``DataError`` where the grammar is over ``MAX_GUIDE_BYTES``."""
    text = tool_grammar(tools, choice, family=family, parallel_tool_calls=parallel_tool_calls,
                        special_tokens=special_tokens)
    return None if text is None else Guide("llguidance", text)


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}


def _json(schema: Mapping[str, Any]) -> str:
    """A Lark ``%json`` element of ``schema`` with ``JSON_OPTIONS`` (llguidance reads the
    options from the top-level schema's "x-guidance"). Keys keep their order: llguidance
    writes an object's properties in the schema's order."""
    return "%json " + json.dumps({"x-guidance": dict(JSON_OPTIONS), **schema},
                                 ensure_ascii=False)
