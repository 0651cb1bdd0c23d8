"""The OpenAI request and response shapes the server speaks.

Requests are validated strictly (pydantic, from the raw JSON): wrong types, missing or
unknown fields, values out of range and parameters we do not implement (``logit_bias``,
``best_of``, ``echo``, ``suffix``, tools, response formats) are a 400 naming the field,
never a guess. Implemented beyond the basics: ``n`` (1..16 choices, each one engine
request; with a ``seed``, choice i samples with seed + i, as vLLM), ``logprobs``
(chat: ``logprobs`` + ``top_logprobs`` 0..20; completions: ``logprobs`` 0..5; the model's
raw log-probabilities, ``decoding/logprobs.py``), ``presence_penalty`` and
``frequency_penalty`` (OpenAI's, -2..2). Extensions: ``top_k`` and ``ignore_eos`` (as
vLLM), ``repeat_penalty`` and ``repeat_last_n`` (as llama.cpp's server; the penalties'
semantics: ``decoding/penalties.py``), and a ``recallspec`` object
choosing the drafter, its options and the mode (the draft sizing, adaptive or fixed) per
request (drafter "none" turns speculation off), the response-memory tenant and whether
the request uses the memory, and asking for the generated token ids. The tenant is
``recallspec.tenant``, else OpenAI's ``user``: requests of one tenant draft from each
other's outputs, never from another tenant's. The responses' shapes: ``responses.py``.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from recallspec.decoding.sampling import MAX_LOGPROBS, SamplingParams

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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


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


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]
    name: StrictStr | None = None


class ChatRequest(_Request):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(strict=True, ge=1)] | None = None
    logprobs: StrictBool | None = None
    top_logprobs: Annotated[int, Field(strict=True, ge=0, le=MAX_LOGPROBS)] | None = None
    response_format: Any = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None
    metadata: dict[StrictStr, StrictStr] | None = None
    store: StrictBool | None = None

    def top_logprobs_asked(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def unsupported(self) -> str | None:
        if self.response_format not in (None, {"type": "text"}):
            return "response_format"
        if self.tools not in (None, []):
            return "tools"
        if self.tool_choice not in (None, "none"):
            return "tool_choice"
        return super().unsupported()


@dataclass(frozen=True)
class Submission:
    """A validated request, as the engine takes it: ``n`` engine requests, one per
    choice, of the same prompt."""

    prompt: str | list[int] | list[dict[str, str]]
    params: SamplingParams  # choice 0's (``choice_params``)
    drafter: str | None
    drafter_options: dict[str, Any]
    mode: str | None
    request_id: str
    t_submit: float  # perf_counter time the request came in
    tenant: str | None = None  # response-memory partition (None: the shared default)
    memory: bool = True  # False: this request neither drafts from nor feeds the memory
    n: int = 1  # choices

    def choice_params(self, index: int) -> SamplingParams:
        """Choice ``index``'s parameters. With a seed, choice i samples with seed + i (as
        vLLM): the choices differ, and each is the output of a single request with that
        seed (the engine takes seeds mod 2^64). Without one, each choice draws its own."""
        if index == 0 or self.params.seed is None:
            return self.params
        return dataclasses.replace(self.params, seed=self.params.seed + index)


def submission(req: CompletionRequest | ChatRequest, max_len: int, vocab_size: int) -> Submission:
    """Engine arguments of a request (raises ``ValueError`` on a bad combination)."""
    chat = isinstance(req, ChatRequest)
    prompt: str | list[int] | list[dict[str, str]]
    if isinstance(req, ChatRequest):
        prompt = [
            {"role": "system" if m.role == "developer" else m.role,
             "content": m.content if isinstance(m.content, str)
             else "".join(p.text for p in m.content)}
            for m in req.messages
        ]
        max_tokens = req.max_completion_tokens or req.max_tokens
    else:
        p = req.prompt
        prompt = p[0] if isinstance(p, list) and isinstance(p[0], str) else p
        max_tokens = req.max_tokens if req.max_tokens is not None else 16  # OpenAI's default
    ext = req.recallspec or Extension()
    bad = sorted(FILE_OPTIONS & set(ext.drafter_options))
    if bad:
        raise ValueError(f"recallspec.drafter_options: {', '.join(bad)} can only be set when "
                         "the server starts")
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if any(not s for s in stop):
        raise ValueError("stop: stop strings must not be empty")
    if isinstance(req, ChatRequest) and req.top_logprobs and not req.logprobs:
        raise ValueError("top_logprobs: needs logprobs: true")
    t = 1.0 if req.temperature is None else req.temperature  # OpenAI's default
    top_k = req.top_k or 0
    params = SamplingParams(
        temperature=max(t, MIN_TEMPERATURE) if t > 0 else 0.0,
        top_k=top_k if 0 < top_k < vocab_size else 0,
        top_p=1.0 if req.top_p is None else req.top_p,
        # No more than the KV cache can hold: the request ends at the context anyway.
        max_new_tokens=min(max_tokens or max_len, max_len),
        stop=tuple(stop), seed=req.seed, ignore_eos=req.ignore_eos,
        logprobs=req.top_logprobs_asked(),
        # The penalties the request sets; the others keep SamplingParams' defaults (off).
        **{k: getattr(req, k) for k in PENALTIES if getattr(req, k) is not None},
    )
    return Submission(prompt, params, ext.drafter, dict(ext.drafter_options), ext.mode,
                      f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", time.perf_counter(),
                      tenant=ext.tenant or req.user or None, memory=ext.memory, n=req.n or 1)
