"""Turning a conversation (user turns + the method's own earlier answers) into prompt ids.

Instruct models get their chat template; models without one get a plain template.
Every method of a run gets its prompt ids from here, so peers see identical prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PLAIN_USER = "### Question:\n{text}\n\n### Answer:\n"


def conversation_text(tokenizer: Any, users: Sequence[str], answers: Sequence[str]) -> str:
    """Prompt text for answering ``users[-1]`` after ``answers`` to the earlier turns."""
    if len(answers) != len(users) - 1:
        raise ValueError("need exactly one answer per earlier user turn")
    if getattr(tokenizer, "has_chat_template", False):
        messages: list[dict[str, str]] = []
        for i, u in enumerate(users):
            messages.append({"role": "user", "content": u})
            if i < len(answers):
                messages.append({"role": "assistant", "content": answers[i]})
        return str(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    parts = []
    for i, u in enumerate(users):
        parts.append(PLAIN_USER.format(text=u))
        if i < len(answers):
            parts.append(answers[i].strip() + "\n\n")
    return "".join(parts)


def conversation_ids(tokenizer: Any, users: Sequence[str], answers: Sequence[str]) -> list[int]:
    """Prompt ids (with BOS where the model wants one, as ``Engine.encode_prompt``)."""
    return [int(t) for t in tokenizer.encode_prompt(conversation_text(tokenizer, users, answers))]
