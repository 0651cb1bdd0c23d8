"""The OpenAI request and response shapes the server speaks.

Requests are validated strictly (pydantic, from the raw JSON): wrong types, missing or
unknown fields, values out of range and parameters we do not implement (``logit_bias``,
``best_of``, ``echo``, ``suffix``) are a 400 naming the field, never a guess.
Implemented beyond the basics: ``n`` (1..16 choices, each one engine request; with a
``seed``, choice i samples with seed + i, as vLLM), ``logprobs``
(chat: ``logprobs`` + ``top_logprobs`` 0..20; completions: ``logprobs`` 0..5; the model's
raw log-probabilities, ``decoding/logprobs.py``), ``presence_penalty`` and
``frequency_penalty`` (OpenAI's, -2..2). Extensions: ``top_k`` and ``ignore_eos`` (as
vLLM), ``repeat_penalty`` and ``repeat_last_n`` (as llama.cpp's server; the penalties'
semantics: ``decoding/penalties.py``), and a ``recallspec`` object
choosing the drafter, its options and the mode (the draft sizing, adaptive or fixed) per
request (drafter "none" turns speculation off), the response-memory tenant and whether
the request uses the memory, and asking for the generated token ids. The tenant is
``recallspec.tenant``, else OpenAI's ``user``: requests of one tenant draft from each
other's outputs, never from another tenant's.

Structured outputs, on both endpoints: OpenAI's ``response_format`` (``text``;
``json_object``, with llama-server's optional ``schema``; ``json_schema`` with a
``json_schema`` object of ``name``, ``description``, ``schema``, ``strict``), llama-server's
top-level ``grammar`` (GBNF; "" is its neutral value, no grammar) and ``json_schema``,
and ``recallspec.regex``. Each becomes the request's ``Guide`` (``decoding/masks.py``),
and the engine constrains the output to it exactly. A request carries at most one guide,
and a guide excludes ``ignore_eos`` (the grammar decides where the output may end). The
schema is enforced whatever ``strict`` says (as vLLM and llama-server do); a
``json_schema`` without ``schema`` is any JSON object. ``submission`` only builds the
guide: whether it compiles is the grammar package's to say (``app.py`` asks before the
request reaches the engine). The responses' shapes: ``responses.py``.

Tool calling, on chat: ``tools``, ``tool_choice`` and ``parallel_tool_calls`` (default
true) are validated by ``server/tool_calls.py`` (``ChatRequest.tool_request``: a 400
names the tool and field); messages take the role ``tool`` (with ``tool_call_id``, which
must answer a call of an earlier assistant message) and assistant ``tool_calls`` (content
null allowed), their ``arguments`` parsed into objects for the templates (``chat_messages``:
a 400 names the message). Tools whose calls are constrained (any ``tool_choice`` but
"none") take no second guide and no ``ignore_eos``. ``submission`` keeps the tools in
``Submission.tools``; the template, the rendering and the calls' guide are the server's
(``tool_support.py``: they depend on the model's chat template), and the parsing of the
calls out of the output ``app.py``'s.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)

from recallspec.decoding.masks import Guide
from recallspec.decoding.sampling import MAX_LOGPROBS, SamplingParams
from recallspec.errors import DataError
from recallspec.server.tool_calls import Tool, ToolChoice, validate_tool_choice, validate_tools

Finite = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Scalar = StrictStr | StrictInt | StrictFloat | StrictBool
Tenant = Annotated[str, Field(strict=True, min_length=1, max_length=256)]
Penalty = Annotated[Finite, Field(ge=-2.0, le=2.0)]
MAX_N = 16  # choices per request
PENALTIES = ("presence_penalty", "frequency_penalty", "repeat_penalty", "repeat_last_n")
MAX_COMPLETION_LOGPROBS = 5  # the legacy completions API's bound
MIN_TEMPERATURE = 0.01  # 0 < t below this is taken as this (as vLLM): keeps logits / t finite
# Drafter options naming files or models are the operator's (``recallspec serve``), not a
# client's: a request may not make the server open paths.
FILE_OPTIONS = frozenset({"index", "path", "datastore", "model", "dsn", "table"})
# OpenAI's rule for a response format's name (and vLLM's, llama-server's).
SchemaName = Annotated[str, Field(strict=True, min_length=1, max_length=64,
                                  pattern=r"^[A-Za-z0-9_-]+$")]
JsonSchema = dict[StrictStr, Any]  # a JSON schema document (its content: the grammar's to judge)


class ParamError(ValueError):
    """A request's bad combination of values: a 400 naming ``param``, the field at fault
    (dotted, as pydantic's locations: ``recallspec.regex``)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JsonSchemaFormat(_Strict):
    """``response_format.json_schema``: the schema the output must satisfy. ``description``
    and ``strict`` are accepted and change nothing: the schema is enforced either way."""

    name: SchemaName
    description: StrictStr | None = None
    schema_: JsonSchema | None = Field(None, alias="schema")  # None: any JSON object
    strict: StrictBool | None = None


class ResponseFormat(_Strict):
    """OpenAI's ``response_format``: ``text`` (free text), ``json_object`` (any JSON
    object; with ``schema``, llama-server's, one satisfying it) or ``json_schema`` (its
    ``json_schema`` object required, and only there)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema_: JsonSchema | None = Field(None, alias="schema")

    @model_validator(mode="after")
    def _fields_of_type(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError('type "json_schema" needs a json_schema object')
        if self.type != "json_schema" and self.json_schema is not None:
            raise ValueError('json_schema belongs to type "json_schema" only')
        if self.type != "json_object" and self.schema_ is not None:
            raise ValueError('schema belongs to type "json_object" only (type "json_schema" '
                             "takes json_schema.schema)")
        return self

    def guide(self) -> Guide | None:
        """The output's guide (None: free text)."""
        if self.type == "json_object":
            return Guide.json_object(self.schema_)
        if self.type == "json_schema":
            assert self.json_schema is not None  # (the validator's)
            schema = self.json_schema.schema_
            return Guide.json_object() if schema is None else Guide.json_schema(schema)
        return None


class Extension(_Strict):
    """The ``recallspec`` request field."""

    drafter: StrictStr | None = None  # a registered drafter; "none" = no speculation
    drafter_options: dict[StrictStr, Scalar] = Field(default_factory=dict)
    # "adaptive" / "fixed" (draft sizing; a batch-layout word is a 400: EMS-SD's padded
    # layouts are a benchmark ablation); None: the server's --mode, else the drafter's
    # sizing (cost-aware).
    mode: StrictStr | None = None
    return_token_ids: StrictBool = False  # choices carry ``token_ids`` (deltas when streamed)
    # Response memory: the partition this request reads and feeds (default: ``user``),
    # and False to keep this request out of it (no drafts from it, its output not kept).
    tenant: Tenant | None = None
    memory: StrictBool = True
    # The output must match this regular expression (whole; llguidance's syntax, Rust's
    # regex crate without look-around and backreferences).
    regex: Annotated[str, Field(strict=True, min_length=1)] | None = None


class StreamOptions(_Strict):
    include_usage: StrictBool = False


class _Request(_Strict):
    model: StrictStr
    max_tokens: Annotated[int, Field(strict=True, ge=1)] | None = None
    temperature: Annotated[Finite, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[Finite, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(strict=True, ge=-1)] | None = None
    seed: Annotated[int, Field(strict=True, ge=-(2**63), lt=2**64)] | None = None
    stop: StrictStr | Annotated[list[StrictStr], Field(max_length=16)] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False
    recallspec: Extension | None = None
    n: Annotated[int, Field(strict=True, ge=1, le=MAX_N)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repeat_penalty: Annotated[Finite, Field(gt=0.0)] | None = None  # llama.cpp's; 1 = off
    repeat_last_n: Annotated[int, Field(strict=True, ge=-1)] | None = None  # -1: all
    # The response-memory tenant unless ``recallspec.tenant`` names one ("" = none).
    user: Annotated[str, Field(strict=True, max_length=256)] | None = None
    # Structured outputs (one guide at most; ``guide``): OpenAI's, llama-server's two.
    response_format: ResponseFormat | None = None
    grammar: StrictStr | None = None  # GBNF; "" = none (llama-server's default)
    json_schema: JsonSchema | None = None  # the output: any JSON value satisfying it
    # Understood, not implemented: anything but the neutral value is a 400.
    logit_bias: Any = None

    def unsupported(self) -> str | None:
        """The first parameter set to something we do not implement, if any."""
        if self.logit_bias not in (None, {}):
            return "logit_bias"
        return None

    def top_logprobs_asked(self) -> int | None:
        """Alternatives per token the response reports (None: no logprobs)."""
        raise NotImplementedError

    def guide(self) -> tuple[Guide, str] | None:
        """The output's guide and the field it came from (None: free text). Raises
        ``ParamError`` when two fields set a guide (naming both), or on a guide that
        ``Guide`` refuses (over ``MAX_GUIDE_BYTES``; a schema that is no JSON)."""
        ext = self.recallspec or Extension()
        given: list[tuple[str, Callable[[], Guide | None]]] = []
        if self.response_format is not None and self.response_format.type != "text":
            given.append(("response_format", self.response_format.guide))
        if self.grammar:
            given.append(("grammar", functools.partial(Guide, "gbnf", self.grammar)))
        if self.json_schema is not None:
            given.append(("json_schema", functools.partial(Guide.json_schema, self.json_schema)))
        if ext.regex is not None:
            given.append(("recallspec.regex", functools.partial(Guide, "regex", ext.regex)))
        if len(given) > 1:
            (first, _), (second, _) = given[:2]
            raise ParamError(second, f"a request takes at most one guide, and {first} and "
                                     f"{second} both set one")
        if not given:
            return None
        param, make = given[0]
        try:
            guide = make()
        except DataError as e:
            raise ParamError(param, str(e)) from None
        assert guide is not None  # (a response_format of type "text" is not given)
        return guide, param


class CompletionRequest(_Request):
    prompt: StrictStr | Annotated[list[StrictInt], Field(min_length=1)] | Annotated[
        list[StrictStr], Field(min_length=1, max_length=1)]
    # The legacy API's: the chosen token's and this many alternatives' log-probabilities.
    logprobs: Annotated[int, Field(strict=True, ge=0, le=MAX_COMPLETION_LOGPROBS)] | None = None
    echo: StrictBool = False
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None

    def top_logprobs_asked(self) -> int | None:
        return self.logprobs

    def unsupported(self) -> str | None:
        if self.echo:
            return "echo"
        if self.best_of not in (None, 1):
            return "best_of"
        if self.suffix:
            return "suffix"
        return super().unsupported()


class TextPart(_Strict):
    type: Literal["text"]
    text: StrictStr


class FunctionCall(_Strict):
    name: StrictStr
    arguments: StrictStr  # JSON text of an object (``submission`` parses it)


class MessageToolCall(_Strict):
    """A call an earlier assistant turn made (OpenAI's ``message.tool_calls`` item)."""

    id: StrictStr
    type: Literal["function"]
    function: FunctionCall


class Message(_Strict):
    """A chat message: ``content`` text (or text parts) on every role, except an
    assistant turn with ``tool_calls``, whose content may be null; a ``tool`` message
    answers an earlier call (``tool_call_id``)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart] | None = None
    name: StrictStr | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: StrictStr | None = None

    @model_validator(mode="after")
    def _fields_of_role(self) -> Message:
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("tool_calls belong to assistant messages only")
        if (self.tool_call_id is None) != (self.role != "tool"):
            raise ValueError('a message of role "tool" needs a tool_call_id, and only it '
                             "takes one")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (null only on an assistant message with "
                             "tool_calls)")
        return self

    def text(self) -> str | None:
        """The content as one string (text parts joined)."""
        if self.content is None or isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatRequest(_Request):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(strict=True, ge=1)] | None = None
    logprobs: StrictBool | None = None
    top_logprobs: Annotated[int, Field(strict=True, ge=0, le=MAX_LOGPROBS)] | None = None
    # Tool calling (``tool_request``): checked by server/tool_calls.py, which names the
    # tool and field at fault.
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None  # None: true
    metadata: dict[StrictStr, StrictStr] | None = None
    store: StrictBool | None = None

    def top_logprobs_asked(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def tool_request(self) -> ToolRequest | None:
        """The request's tools and choice, validated (None: no tools). Raises
        ``ParamError`` ("tools", "tool_choice") on a bad tool or choice."""
        try:
            tools = validate_tools(self.tools)
        except DataError as e:
            raise ParamError("tools", str(e)) from None
        try:
            choice = validate_tool_choice(self.tool_choice, tools)
        except DataError as e:
            raise ParamError("tool_choice", str(e)) from None
        if not tools:
            return None
        return ToolRequest(tools, choice, self.parallel_tool_calls is not False)


@dataclass(frozen=True)
class ToolRequest:
    """A chat request's tools: ``choice`` "none" renders them and nothing more (no
    grammar, no parsing); any other constrains the output to the calls' grammar
    (``server/tool_grammar.py``) and parses the calls out of it."""

    tools: tuple[Tool, ...]
    choice: ToolChoice
    parallel: bool = True  # ``parallel_tool_calls``: more than one call allowed

    @property
    def calls(self) -> bool:
        """Whether the output is constrained to, and parsed for, calls."""
        return self.choice.mode != "none"


def chat_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """The messages as the chat template takes them: ``developer`` as ``system``, content
    as one string, an assistant turn's ``tool_calls`` with their ``arguments`` parsed into
    objects (the templates write them with ``tojson``), a tool message's
    ``tool_call_id``. Raises ``ParamError`` naming the message for arguments that are no
    JSON object, and for a ``tool_call_id`` that no earlier assistant call has."""
    out: list[dict[str, Any]] = []
    call_ids: set[str] = set()
    for i, m in enumerate(messages):
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                             "content": m.text()}
        if m.tool_calls:
            calls = []
            for j, c in enumerate(m.tool_calls):
                where = f"messages.{i}.tool_calls.{j}.function.arguments"
                try:
                    arguments = json.loads(c.function.arguments)
                except (ValueError, RecursionError) as e:  # (nested past the parser's depth)
                    raise ParamError(where, f"not JSON: {e}") from None
                if not isinstance(arguments, dict):
                    raise ParamError(where, "must be a JSON object")
                calls.append({"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": arguments}})
                call_ids.add(c.id)
            d["tool_calls"] = calls
        if m.role == "tool":
            assert m.tool_call_id is not None  # (the validator's)
            if m.tool_call_id not in call_ids:
                raise ParamError(f"messages.{i}.tool_call_id",
                                 f"{m.tool_call_id!r} answers no tool call of an earlier "
                                 "assistant message")
            d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out


def uses_tools(prompt: Any) -> bool:
    """Whether chat messages hold tool calls or tool results (their template must render
    them: ``server/tool_support.py``)."""
    return isinstance(prompt, list) and any(
        isinstance(m, dict) and (m.get("role") == "tool" or m.get("tool_calls"))
        for m in prompt)


@dataclass(frozen=True)
class Submission:
    """A validated request, as the engine takes it: ``n`` engine requests, one per
    choice, of the same prompt."""

    prompt: str | list[int] | list[dict[str, Any]]
    params: SamplingParams  # choice 0's (``choice_params``)
    drafter: str | None
    drafter_options: dict[str, Any]
    mode: str | None
    request_id: str
    t_submit: float  # perf_counter time the request came in
    tenant: str | None = None  # response-memory partition (None: the shared default)
    memory: bool = True  # False: this request neither drafts from nor feeds the memory
    n: int = 1  # choices
    # The request field ``params.guide`` came from ("response_format", "grammar",
    # "json_schema", "recallspec.regex" or "tools"): a 400 for a guide that does not
    # compile names it.
    guide_param: str | None = None
    # A chat request's tools (None: none); the server renders them into the prompt and
    # sets their guide (``server/tool_support.py: ToolSupport.prepare``).
    tools: ToolRequest | None = None

    def choice_params(self, index: int) -> SamplingParams:
        """Choice ``index``'s parameters. With a seed, choice i samples with seed + i (as
        vLLM): the choices differ, and each is the output of a single request with that
        seed (the engine takes seeds mod 2^64). Without one, each choice draws its own."""
        if index == 0 or self.params.seed is None:
            return self.params
        return dataclasses.replace(self.params, seed=self.params.seed + index)


def submission(req: CompletionRequest | ChatRequest, max_len: int, vocab_size: int) -> Submission:
    """Engine arguments of a request (raises ``ValueError`` on a bad combination, a
    ``ParamError`` naming the field where one is at fault)."""
    chat = isinstance(req, ChatRequest)
    prompt: str | list[int] | list[dict[str, Any]]
    tools: ToolRequest | None = None
    if isinstance(req, ChatRequest):
        tools = req.tool_request()
        prompt = chat_messages(req.messages)
        max_tokens = req.max_completion_tokens or req.max_tokens
    else:
        p = req.prompt
        prompt = p[0] if isinstance(p, list) and isinstance(p[0], str) else p
        max_tokens = req.max_tokens if req.max_tokens is not None else 16  # OpenAI's default
    ext = req.recallspec or Extension()
    bad = sorted(FILE_OPTIONS & set(ext.drafter_options))
    if bad:
        raise ParamError("recallspec.drafter_options",
                         f"{', '.join(bad)} can only be set when the server starts")
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if any(not s for s in stop):
        raise ParamError("stop", "stop strings must not be empty")
    if isinstance(req, ChatRequest) and req.top_logprobs and not req.logprobs:
        raise ParamError("top_logprobs", "needs logprobs: true")
    guided = req.guide()
    if tools is not None and tools.calls:
        # The calls' grammar is the request's guide (set by the server, which knows the
        # template's family): no second one.
        if guided is not None:
            raise ParamError("tools", f"a request takes at most one guide, and tools (with "
                                      f"tool_choice {tools.choice.mode!r}) and {guided[1]} "
                                      "both set one")
        if req.ignore_eos:
            raise ParamError("ignore_eos", "cannot be combined with tools (the calls' "
                                           "grammar decides where the output may end)")
    if guided is not None and req.ignore_eos:
        raise ParamError("ignore_eos", f"cannot be combined with {guided[1]} (the grammar "
                                       "decides where the output may end)")
    t = 1.0 if req.temperature is None else req.temperature  # OpenAI's default
    top_k = req.top_k or 0
    params = SamplingParams(
        temperature=max(t, MIN_TEMPERATURE) if t > 0 else 0.0,
        top_k=top_k if 0 < top_k < vocab_size else 0,
        top_p=1.0 if req.top_p is None else req.top_p,
        # No more than the KV cache can hold: the request ends at the context anyway.
        max_new_tokens=min(max_tokens or max_len, max_len),
        stop=tuple(stop), seed=req.seed, ignore_eos=req.ignore_eos,
        logprobs=req.top_logprobs_asked(), guide=None if guided is None else guided[0],
        # The penalties the request sets; the others keep SamplingParams' defaults (off).
        **{k: getattr(req, k) for k in PENALTIES if getattr(req, k) is not None},
    )
    return Submission(prompt, params, ext.drafter, dict(ext.drafter_options), ext.mode,
                      f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", time.perf_counter(),
                      tenant=ext.tenant or req.user or None, memory=ext.memory, n=req.n or 1,
                      guide_param=None if guided is None else guided[1], tools=tools)
