"""The OpenAI response shapes the server sends: bodies, stream chunks, choices, usage,
logprobs, speculation figures and errors.

A response has one choice per engine request of its submission (``n``), each with its
``index``; streamed, the choices' chunks interleave, each carrying its index. Usage
counts the prompt once and the completion tokens of every choice. Responses carry the
speculation figures as ``metrics.speculative_decoding`` (vLLM's shape), of every choice
together in a body and per choice in a stream's last chunk of that choice.

Logprobs (``decoding/logprobs.py``: the model's raw log-probabilities) in OpenAI's two
shapes: chat's ``{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}`` and the
legacy completions' ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``. A
token's text is the decoding of that token alone (a piece of a multi-byte character
decodes to U+FFFD, as in vLLM); ``text_offset`` is the running sum of those texts'
lengths, as vLLM computes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from recallspec.decoding.logprobs import TokenLogprob
from recallspec.engine import RequestOutput, SpecStats

Decode = Callable[[Sequence[int]], str]


def finish_reason(reason: str | None) -> str | None:
    """Our finish reasons in OpenAI's terms ("tool_calls" is already one)."""
    return {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}.get(
        reason or "", reason)


def tool_finish_reason(reason: str | None, called: bool) -> str | None:
    """A chat choice's finish reason where its output was parsed for tool calls:
    "tool_calls" when a call was parsed and the output ended by itself (eos or a stop
    string), else ``reason``."""
    return "tool_calls" if called and reason in ("eos", "stop") else reason


def spec_metrics(spec: SpecStats) -> dict[str, Any]:
    """vLLM's ``metrics.speculative_decoding`` shape."""
    return {"speculative_decoding": {
        "mean_acceptance_length": round(spec.mean_acceptance_length, 4),
        "num_steps": spec.num_steps,
        "num_drafts": spec.num_drafts,
        "num_draft_tokens": spec.num_draft_tokens,
        "num_accepted_tokens": spec.num_accepted_tokens,
        "num_accepted_tokens_per_pos": list(spec.accepted_per_pos),
        # Under a grammar: accepted tokens it forced (drafted by the grammar), and drafter
        # tokens it forbade (cut before verification).
        "num_forced_tokens": spec.num_forced_tokens,
        "num_cut_draft_tokens": spec.num_cut_tokens,
    }}


def total_spec(specs: Sequence[SpecStats]) -> SpecStats:
    """The speculation of several requests (a response's choices) as one."""
    depth = max((len(s.accepted_per_pos) for s in specs), default=0)
    return SpecStats(
        sum(s.num_steps for s in specs), sum(s.num_step_tokens for s in specs),
        sum(s.num_drafts for s in specs), sum(s.num_draft_tokens for s in specs),
        sum(s.num_accepted_tokens for s in specs),
        tuple(sum(s.accepted_per_pos[i] for s in specs if i < len(s.accepted_per_pos))
              for i in range(depth)),
        sum(s.num_forced_tokens for s in specs), sum(s.num_cut_tokens for s in specs))


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; ``prompt_tokens_details.cached_tokens``: prompt tokens whose
    KV came from the prefix cache."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def cached_tokens(outs: Sequence[RequestOutput | None]) -> int:
    """Prompt tokens the prefix cache gave every choice (0 unless all have ended)."""
    return min((o.result.cached_tokens if o is not None and o.result is not None else 0
                for o in outs), default=0)


def logprobs(
    chat: bool, entries: Sequence[TokenLogprob], decode: Decode, offset: int = 0,
) -> tuple[dict[str, Any], int]:
    """The ``logprobs`` object of ``entries`` (chat's or completions'; ``offset``: the
    text offset of the first, completions only) and the offset after the last."""
    def text(t: int) -> str:
        return decode([t])

    if chat:
        def item(t: int, lp: float) -> dict[str, Any]:
            s = text(t)
            return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}

        return {"content": [item(e.token, e.logprob) | {
            "top_logprobs": [item(t, lp) for t, lp in e.top]} for e in entries],
            "refusal": None}, offset
    tokens = [text(e.token) for e in entries]
    offsets = []
    for s in tokens:
        offsets.append(offset)
        offset += len(s)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{text(t): lp for t, lp in e.top} if e.top else None
                             for e in entries],
            "text_offset": offsets}, offset


def choice(
    index: int, chat: bool, text: str | None, reason: str | None, token_ids: list[int] | None,
    *, delta: bool, first: bool = False, logprobs: dict[str, Any] | None = None,
    tool_calls: list[dict[str, Any]] | None = None, reasoning: str | None = None,
) -> dict[str, Any]:
    """One choice of a response (``delta``: of a stream chunk). Chat only: ``text`` None
    is a null content (a message of tool calls alone; in a delta, no content),
    ``tool_calls`` the message's calls (in a delta, call fragments:
    ``tool_calls.ToolCallDelta.to_openai``), and ``reasoning`` the message's reasoning
    (harmony's analysis channel; in a delta, a fragment of it) as ``reasoning_content``,
    llama-server's and vLLM's field: absent where there is none, so replies of families
    without reasoning keep OpenAI's shape exactly."""
    c: dict[str, Any] = {"index": index}
    if not chat:
        c["text"] = text or ""
    elif delta:
        if first:
            d: dict[str, Any] = {"role": "assistant", "content": text}
        elif text or (text is not None and reason is None and not tool_calls):
            d = {"content": text}
        else:
            d = {}
        if reasoning:
            d["reasoning_content"] = reasoning
        if tool_calls:
            d["tool_calls"] = tool_calls
        c["delta"] = d
    else:
        c["message"] = {"role": "assistant", "content": text}
        if reasoning:
            c["message"]["reasoning_content"] = reasoning
        if tool_calls:
            c["message"]["tool_calls"] = tool_calls
    c["logprobs"] = logprobs
    c["finish_reason"] = finish_reason(reason)
    if token_ids is not None:
        c["token_ids"] = token_ids
    return c


def envelope(request_id: str, model: str, chat: bool, *, chunk: bool) -> dict[str, Any]:
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    return {"id": request_id, "object": kind, "created": int(time.time()), "model": model}


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
