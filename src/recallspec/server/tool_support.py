"""How this server renders tools and reads calls, decided once at start from the chat
template (``ToolSupport.of``), and each request with tools made ready for the engine
(``ToolSupport.prepare``).

The template that renders a request with tools (or with tool calls and results in its
history) is, in this order:

- the model's own (or ``recallspec serve --chat-template``'s) where it renders tools
  (``tool_calls.supports_tools``: llama.cpp's probe); its family (``detect_family``)
  says the call syntax;
- our ChatML template with Hermes calls (``server/templates/chatml_tools.jinja``) where
  the model's is ChatML without tools (SmolLM2): family "hermes". Requests without tools
  keep the model's own template (the two render them alike for SmolLM2; the shipped
  one's default system message is SmolLM2's);
- the model's own otherwise, family "generic": the tools are described in the system
  message, earlier calls written as the ``{"tool_calls": [...]}`` object the generic
  grammar forces and results as user turns of ``{"tool_response": ...}`` objects (as
  llama.cpp's former generic format did);
- none where the model has no chat template: a request with tools is a 400.

A tool without a description (optional in OpenAI's API) is rendered as the request gave
it, the prompt transformers' ``apply_chat_template`` makes of the same tools, except for
a template that fails on it (``tool_calls.needs_descriptions``: gpt-oss's concatenates
the description, an error on an undefined value): there every tool is rendered with a
description, "" where there is none, as llama-server renders every tool (its
common_chat_tools_parse_oaicompat reads a missing description as ""). So the request is
served, and the prompts of templates that take such a tool stay as they were.

A request with tools is rendered here (``apply_chat_template(messages, tools=...)``) and
submitted as token ids; its guide (``tool_grammar.tool_guide``, None for tool_choice
"none") names the family's markers that the tokenizer holds as special tokens by id.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from recallspec.engine.prompts import encode_text
from recallspec.errors import DataError
from recallspec.server.protocol import ParamError, Submission, uses_tools
from recallspec.server.tool_calls import (
    CHATML_TOOLS_TEMPLATE,
    Tool,
    ToolFamily,
    detect_family,
    needs_descriptions,
    shipped_template,
    supports_tools,
)
from recallspec.server.tool_grammar import special_marker_ids, tool_guide

TemplateOrigin = Literal["model", "shipped", "generic", "none"]
CHATML_MARKER = "<|im_start|>"
NO_TEMPLATE = ("tools need a chat template, and this model has none (start the server "
               "with --chat-template FILE)")


@dataclass(frozen=True)
class ToolSupport:
    """``renderer``: the tokenizer whose chat template renders requests with tools (None:
    no template); ``origin``: where that template came from; ``family``: the call syntax;
    ``special_tokens``: the family's markers that are special tokens, by id;
    ``described``: the template needs every tool to have a description (a missing one
    is rendered as "")."""

    renderer: Any | None
    origin: TemplateOrigin
    family: ToolFamily
    special_tokens: Mapping[str, int] = field(default_factory=dict)
    described: bool = False

    @classmethod
    def of(cls, tokenizer: Any) -> ToolSupport:
        """The support of ``tokenizer``'s chat template (a ``models.Tokenizer``; anything
        without a ``chat_template`` has none)."""
        source = getattr(tokenizer, "chat_template", None)
        if not isinstance(source, str) or not source:
            return cls(None, "none", "generic")

        def render(messages: Sequence[Mapping[str, Any]],
                   tools: Sequence[Mapping[str, Any]]) -> str:
            return str(tokenizer.apply_chat_template(messages, tools=tools))

        renderer = tokenizer
        origin: TemplateOrigin = "model"
        family: ToolFamily
        described = False
        if supports_tools(source, render):
            family = detect_family(source)
            described = needs_descriptions(render)
        elif CHATML_MARKER in source:
            renderer = tokenizer.with_chat_template(shipped_template())
            origin, family = "shipped", detect_family(renderer.chat_template)
        else:
            origin, family = "generic", "generic"
        lookup = getattr(tokenizer, "special_token_id", None)
        special = {} if lookup is None else special_marker_ids(family, lookup)
        return cls(renderer, origin, family, special, described)

    def describe(self) -> str:
        """A line for the server's start message."""
        if self.origin == "none":
            return "tools: none (no chat template)"
        where = {"model": "the model's template",
                 "shipped": f"the shipped {CHATML_TOOLS_TEMPLATE}",
                 "generic": "the model's template, tools in the system message"}[self.origin]
        return f"tools: {self.family} calls ({where})"

    def prepare(self, sub: Submission, tokenizer: Any) -> Submission:
        """``sub`` ready for the engine: a chat with tools, or with tool calls or results in
        its history, rendered here and encoded with ``tokenizer`` (the engine's), and its
        calls' guide set (``guide_param`` "tools"). Other submissions come back as they
        are. Raises ``ParamError`` ("tools" or "messages") where the template cannot
        render the request."""
        req = sub.tools
        if req is None and not uses_tools(sub.prompt):
            return sub
        param = "tools" if req is not None else "messages"
        if self.renderer is None:
            raise ParamError(param, NO_TEMPLATE)
        assert isinstance(sub.prompt, list)
        messages: list[dict[str, Any]] = list(sub.prompt)  # type: ignore[arg-type]
        tools = req.tools if req is not None else ()
        kwargs: dict[str, Any] = {}
        if self.origin == "generic":
            messages = generic_messages(messages, tools)
        elif tools:
            kwargs["tools"] = [t.to_openai(described=self.described) for t in tools]
        try:
            text = self.renderer.apply_chat_template(messages, add_generation_prompt=True,
                                                     **kwargs)
        except Exception as e:  # the template's own checks (roles, their order) raise
            raise ParamError("messages", f"chat template: {e}") from None
        try:
            ids = encode_text(tokenizer, text)
        except DataError as e:
            raise ParamError("messages", str(e)) from None
        params = sub.params
        guide_param = sub.guide_param
        if req is not None and req.calls:
            try:
                guide = tool_guide(req.tools, req.choice, family=self.family,
                                   parallel_tool_calls=req.parallel,
                                   special_tokens=self.special_tokens)
            except DataError as e:
                raise ParamError("tools", str(e)) from None
            params = dataclasses.replace(params, guide=guide)
            guide_param = "tools"
        return dataclasses.replace(sub, prompt=ids, params=params, guide_param=guide_param)


def tools_system_text(tools: Sequence[Tool]) -> str:
    """The tools as a generic template's system message describes them."""
    lines = "\n".join(json.dumps(t.to_openai(), ensure_ascii=False) for t in tools)
    return ("You can call these tools (each a JSON schema of its arguments):\n" + lines
            + '\n\nTo call tools, answer with only the JSON object {"tool_calls": [{"name": '
            '<the tool\'s name>, "arguments": <its arguments object>}]}. Otherwise answer '
            'with {"response": <your answer as a JSON string>}.')


def generic_messages(messages: Sequence[Mapping[str, Any]],
                     tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """A conversation with tools for a template that renders none: the tools appended to
    the system message (one is added first where there is none), each assistant turn
    with calls written as the ``{"tool_calls": [...]}`` object the generic grammar
    forces (json.dumps' separators, as the grammar's), and each run of tool results as
    one user turn of ``{"tool_response": {"name", "tool_call_id", "content"}}`` lines."""
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    results: dict[str, Any] | None = None  # the user turn the current run of results fills
    for m in messages:
        if m.get("role") == "tool":
            line = json.dumps({"tool_response": {
                "name": names.get(m["tool_call_id"]), "tool_call_id": m["tool_call_id"],
                "content": m.get("content") or ""}}, ensure_ascii=False)
            if results is None:
                results = {"role": "user", "content": line}
                out.append(results)
            else:
                results["content"] += "\n" + line
            continue
        results = None
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = c["function"]
                names[c["id"]] = fn["name"]
                calls.append({"name": fn["name"], "arguments": fn["arguments"]})
            out.append({"role": "assistant",
                        "content": json.dumps({"tool_calls": calls}, ensure_ascii=False)})
        else:
            out.append(dict(m))
    if tools:
        text = tools_system_text(tools)
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{text}".lstrip()}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out
