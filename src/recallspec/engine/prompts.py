"""Prompts in any form (text, chat messages, token ids) to checked token ids.

Every failure is a ``RecallspecError`` naming what is wrong, raised when the request is
added (a 400 for the server), never later inside a step.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from recallspec.errors import ContextLengthError, DataError

# A prompt: text, token ids, or chat messages ({"role": ..., "content": ...}).
Prompt = str | Sequence[int] | Sequence[Mapping[str, Any]]


def encode_text(tokenizer: Any, prompt: str, *, chat: bool = False) -> list[int]:
    """Token ids of a text prompt (with ``chat``, as one user turn of the template)."""
    if not isinstance(prompt, str):
        raise DataError("prompt must be text")
    if not prompt:
        raise DataError("empty prompt")
    if chat:
        return encode_chat(tokenizer, [{"role": "user", "content": prompt}])
    try:
        return list(tokenizer.encode_prompt(prompt))
    except Exception as e:  # e.g. lone surrogates, which the tokenizer cannot take
        raise DataError(f"cannot encode the prompt: {e}") from None


def encode_chat(tokenizer: Any, messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Token ids of a conversation rendered with the model's chat template."""
    if not tokenizer.has_chat_template:
        raise DataError("this model has no chat template; send plain text")
    if not messages:
        raise DataError("empty conversation")
    for m in messages:
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(
                m.get("content"), str):
            raise DataError("each chat message needs a string 'role' and 'content'")
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    except Exception as e:  # the template's own checks (roles, their order) raise
        raise DataError(f"chat template: {e}") from None
    return encode_text(tokenizer, text)


def prompt_ids(tokenizer: Any, prompt: Prompt, *, chat: bool = False) -> list[int]:
    """Token ids of any prompt form (unchecked against the model: ``check_ids``)."""
    if isinstance(prompt, str):
        return encode_text(tokenizer, prompt, chat=chat)
    if isinstance(prompt, Mapping | bytes | bytearray):
        raise DataError("a prompt is text, a list of token ids, or a list of chat messages")
    items = list(prompt.tolist() if hasattr(prompt, "tolist") else prompt)
    if items and all(isinstance(m, Mapping) for m in items):
        return encode_chat(tokenizer, items)
    if all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in items):
        return [int(t) for t in items]
    raise DataError("a prompt is text, a list of token ids, or a list of chat messages "
                    "({'role': ..., 'content': ...})")


def check_ids(ids: list[int], vocab_size: int, context_len: int, max_len: int) -> None:
    if not ids:
        raise DataError("empty prompt")
    if min(ids) < 0 or max(ids) >= vocab_size:
        raise DataError(f"prompt token ids must be in [0, {vocab_size})")
    if len(ids) >= context_len:
        raise ContextLengthError(
            f"prompt has {len(ids)} tokens but the model's context is {context_len}"
        )
    if len(ids) >= max_len:
        raise ContextLengthError(
            f"prompt has {len(ids)} tokens but the KV cache holds {max_len} per sequence "
            "(raise max_len)"
        )


def is_single(prompts: Any) -> bool:
    """Whether ``generate``'s argument is one prompt (text, ids, one conversation)
    rather than a list of prompts."""
    if isinstance(prompts, str):
        return True
    if isinstance(prompts, Mapping) or not isinstance(prompts, Sequence) or not prompts:
        return hasattr(prompts, "tolist")  # an array or tensor of ids
    return all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in prompts) or all(
        isinstance(m, Mapping) for m in prompts)
