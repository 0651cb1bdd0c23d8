"""The OpenAI request and response shapes the server speaks.

Requests are validated strictly (pydantic, from the raw JSON): wrong types, missing or
unknown fields and parameters we do not implement are a 400 naming the field, never a
guess. Extensions: ``top_k`` and ``ignore_eos`` (as vLLM), and a ``recallspec`` object
choosing the drafter, its options and the mode (the draft sizing, adaptive or fixed) per
request (drafter "none" turns speculation off), the response-memory tenant and whether
the request uses the memory, and asking for the generated token ids. The tenant is
``recallspec.tenant``, else OpenAI's ``user``: requests of one tenant draft from each
other's outputs, never from another tenant's. Responses carry the request's speculation
figures as ``metrics.speculative_decoding``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from recallspec.engine import RequestOutput, SpecStats
from recallspec.spec.sampling import SamplingParams

Finite = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Scalar = StrictStr | StrictInt | StrictFloat | StrictBool
Tenant = Annotated[str, Field(strict=True, min_length=1, max_length=256)]
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
    n: StrictInt | None = None
    # The response-memory tenant unless ``recallspec.tenant`` names one ("" = none).
    user: Annotated[str, Field(strict=True, max_length=256)] | None = None
    # Understood, not implemented: anything but the neutral value is a 400.
    logprobs: Any = None
    logit_bias: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None

    def unsupported(self) -> str | None:
        """The first parameter set to something we do not implement, if any."""
        if self.n not in (None, 1):
            return "n"
        if self.logprobs not in (None, False):
            return "logprobs"
        if self.logit_bias not in (None, {}):
            return "logit_bias"
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                return name
        return None


class CompletionRequest(_Request):
    prompt: StrictStr | Annotated[list[StrictInt], Field(min_length=1)] | Annotated[
        list[StrictStr], Field(min_length=1, max_length=1)]
    echo: StrictBool = False
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None

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
    top_logprobs: Any = None
    response_format: Any = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None
    metadata: dict[StrictStr, StrictStr] | None = None
    store: StrictBool | None = None

    def unsupported(self) -> str | None:
        if self.top_logprobs not in (None, 0):
            return "top_logprobs"
        if self.response_format not in (None, {"type": "text"}):
            return "response_format"
        if self.tools not in (None, []):
            return "tools"
        if self.tool_choice not in (None, "none"):
            return "tool_choice"
        return super().unsupported()


@dataclass(frozen=True)
class Submission:
    """A validated request, as the engine takes it."""

    prompt: str | list[int] | list[dict[str, str]]
    params: SamplingParams
    drafter: str | None
    drafter_options: dict[str, Any]
    mode: str | None
    request_id: str
    t_submit: float  # perf_counter time the request came in
    tenant: str | None = None  # response-memory partition (None: the shared default)
    memory: bool = True  # False: this request neither drafts from nor feeds the memory


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
    t = 1.0 if req.temperature is None else req.temperature  # OpenAI's default
    top_k = req.top_k or 0
    params = SamplingParams(
        temperature=max(t, MIN_TEMPERATURE) if t > 0 else 0.0,
        top_k=top_k if 0 < top_k < vocab_size else 0,
        top_p=1.0 if req.top_p is None else req.top_p,
        # No more than the KV cache can hold: the request ends at the context anyway.
        max_new_tokens=min(max_tokens or max_len, max_len),
        stop=tuple(stop), seed=req.seed, ignore_eos=req.ignore_eos,
    )
    return Submission(prompt, params, ext.drafter, dict(ext.drafter_options), ext.mode,
                      f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", time.perf_counter(),
                      tenant=ext.tenant or req.user or None, memory=ext.memory)


# ---- responses ---------------------------------------------------------------------
def finish_reason(reason: str | None) -> str | None:
    """Our finish reasons in OpenAI's terms."""
    return {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}.get(
        reason or "", reason)


def spec_metrics(spec: SpecStats) -> dict[str, Any]:
    """vLLM's ``metrics.speculative_decoding`` shape, per request."""
    return {"speculative_decoding": {
        "mean_acceptance_length": round(spec.mean_acceptance_length, 4),
        "num_steps": spec.num_steps,
        "num_drafts": spec.num_drafts,
        "num_draft_tokens": spec.num_draft_tokens,
        "num_accepted_tokens": spec.num_accepted_tokens,
        "num_accepted_tokens_per_pos": list(spec.accepted_per_pos),
    }}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; ``prompt_tokens_details.cached_tokens``: prompt tokens whose
    KV came from the prefix cache."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def cached_tokens(out: RequestOutput) -> int:
    """Prompt tokens of a finished request that the prefix cache gave (0 before its end)."""
    return out.result.cached_tokens if out.result is not None else 0


def choice(
    chat: bool, text: str, reason: str | None, token_ids: list[int] | None, *, delta: bool,
    first: bool = False,
) -> dict[str, Any]:
    """One choice of a response (``delta``: of a stream chunk)."""
    c: dict[str, Any] = {"index": 0}
    if not chat:
        c.update(text=text, logprobs=None)
    elif delta:
        c["delta"] = {"role": "assistant", "content": text} if first else (
            {"content": text} if text or reason is None else {})
        c["logprobs"] = None
    else:
        c.update(message={"role": "assistant", "content": text}, logprobs=None)
    c["finish_reason"] = finish_reason(reason)
    if token_ids is not None:
        c["token_ids"] = token_ids
    return c


def envelope(sub: Submission, model: str, chat: bool, *, chunk: bool) -> dict[str, Any]:
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    return {"id": sub.request_id, "object": kind, "created": int(time.time()), "model": model}


def final_fields(out: RequestOutput, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {"usage": usage(prompt_tokens, completion_tokens, cached_tokens(out)),
            "metrics": spec_metrics(out.spec)}


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
