"""Corpus readers: turn jsonl / json / txt / *.gz files into documents (strings).

Record formats recognised automatically (first match wins):

* Spec-Bench / MT-Bench questions: ``turns`` (list of user turns; ``reference``
  answers, when a list of strings, become assistant turns)
* model answers: ``choices[0].turns`` (assistant turns)
* ShareGPT: ``conversations`` (list of ``{"from": ..., "value": ...}``)
* Alpaca: ``instruction`` / ``input`` / ``output``
* HumanEval: ``prompt`` + ``canonical_solution``; MBPP: ``text`` + ``code``;
  GSM8K: ``question`` + ``answer``; otherwise ``text`` / ``content`` / ``article``

``field=NAME`` overrides detection and takes one field (a string, or a list of
strings joined by blank lines). Plain text files give one document per
blank-line-separated block (``txt_mode="blocks"``) or per file (``"file"``).

Each record becomes a list of chat messages; a document is either the message
contents joined by blank lines, or — with ``chat_template`` — the rendered chat.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from recallspec.errors import DataError

Message = dict[str, str]
ChatTemplate = Callable[[list[Message]], str]

_ROLE = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
         "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "system": "system"}


def _open_text(path: Path) -> TextIO:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


def _kind(path: Path) -> str:
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(".jsonl"):
        return "jsonl"
    if name.endswith(".json"):
        return "json"
    return "txt"


def iter_jsonl(lines: Iterable[str], path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank line of a JSON-lines file; a line that is
    not JSON raises DataError naming the file and the line."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None


def iter_records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield the JSON records of a .jsonl / .json (array or {key: [records]}) file."""
    p = Path(path)
    kind = _kind(p)
    try:
        with _open_text(p) as f:
            if kind == "jsonl":
                for lineno, rec in iter_jsonl(f, p):
                    if not isinstance(rec, dict):
                        raise DataError(f"{p}:{lineno}: expected a JSON object per line")
                    yield rec
            else:
                try:
                    data = json.load(f)
                except json.JSONDecodeError as e:
                    raise DataError(f"{p}: invalid JSON ({e.msg} at line {e.lineno})") from None
                if isinstance(data, dict):  # {"data": [...]} or a single record
                    lists = [v for v in data.values() if isinstance(v, list)]
                    data = lists[0] if len(lists) == 1 else [data]
                if not isinstance(data, list):
                    raise DataError(f"{p}: expected a JSON array of records")
                for i, rec in enumerate(data):
                    if not isinstance(rec, dict):
                        raise DataError(f"{p}: record {i} is not a JSON object")
                    yield rec
    except FileNotFoundError:
        raise DataError(f"{p}: corpus file does not exist") from None
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as e:
        raise DataError(f"{p}: cannot read ({e})") from None


def _text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return "\n\n".join(v)
    if v is None:
        return ""
    return json.dumps(v, ensure_ascii=False)


def record_messages(rec: dict[str, Any], field: str | None = None) -> list[Message]:
    """The chat messages a record stands for (empty list: nothing usable)."""
    def msg(role: str, content: Any) -> list[Message]:
        t = _text(content)
        return [{"role": role, "content": t}] if t.strip() else []

    if field is not None:
        if field not in rec:
            raise KeyError(field)
        return msg("user", rec[field])
    if isinstance(rec.get("turns"), list):
        refs = rec.get("reference")
        out: list[Message] = []
        for i, turn in enumerate(rec["turns"]):
            out += msg("user", turn)
            if isinstance(refs, list) and i < len(refs) and isinstance(refs[i], str):
                out += msg("assistant", refs[i])
        return out
    choices = rec.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return [m for t in choices[0].get("turns", []) for m in msg("assistant", t)]
    if isinstance(rec.get("conversations"), list):
        out = []
        for turn in rec["conversations"]:
            if isinstance(turn, dict):
                role = _ROLE.get(str(turn.get("from", turn.get("role", ""))).lower(), "user")
                out += msg(role, turn.get("value", turn.get("content")))
        return out
    if "instruction" in rec and "output" in rec:
        prompt = _text(rec["instruction"])
        if _text(rec.get("input")).strip():
            prompt += "\n\n" + _text(rec["input"])
        return msg("user", prompt) + msg("assistant", rec["output"])
    for q, a in (("prompt", "canonical_solution"), ("text", "code"), ("question", "answer")):
        if q in rec and a in rec:
            return msg("user", rec[q]) + msg("assistant", rec[a])
    for key in ("text", "content", "article", "instruction", "prompt"):
        if key in rec:
            return msg("user", rec[key])
    return []


def chat_template_of(tokenizer: Any, enabled: bool) -> ChatTemplate | None:
    """The tokenizer's chat template as a corpus renderer (``--chat-template``), or None."""
    if not enabled:
        return None
    if not getattr(tokenizer, "has_chat_template", False):
        raise DataError("--chat-template: this model's tokenizer has no chat template")
    return lambda msgs: str(tokenizer.apply_chat_template(msgs, add_generation_prompt=False))


def render(messages: list[Message], chat_template: ChatTemplate | None = None) -> str:
    if chat_template is not None:
        return chat_template(messages)
    return "\n\n".join(m["content"] for m in messages)


def iter_documents(
    path: str | os.PathLike[str],
    field: str | None = None,
    chat_template: ChatTemplate | None = None,
    txt_mode: str = "blocks",
) -> Iterator[str]:
    """Yield the documents of one corpus file (see the module doc for formats)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: corpus file does not exist")
    if _kind(p) == "txt":
        if txt_mode not in ("blocks", "file"):
            raise ValueError(f"txt_mode must be 'blocks' or 'file', got {txt_mode!r}")
        with _open_text(p) as f:
            text = f.read()
        blocks = [text] if txt_mode == "file" else text.split("\n\n")
        for b in blocks:
            if b.strip():
                yield render([{"role": "user", "content": b.strip("\n")}], chat_template)
        return
    n_records = n_docs = 0
    keys: set[str] = set()
    for rec in iter_records(p):
        n_records += 1
        keys.update(rec)
        try:
            messages = record_messages(rec, field)
        except KeyError:
            raise DataError(
                f"{p}: record {n_records - 1} has no field {field!r} "
                f"(fields: {', '.join(sorted(rec))})"
            ) from None
        if messages:
            n_docs += 1
            yield render(messages, chat_template)
    if n_records and not n_docs:
        raise DataError(
            f"{p}: no usable text in {n_records} records (fields: {', '.join(sorted(keys))}); "
            "choose one with --field NAME"
        )


def iter_corpus(
    paths: list[str | os.PathLike[str]],
    field: str | None = None,
    chat_template: ChatTemplate | None = None,
    txt_mode: str = "blocks",
) -> Iterator[str]:
    for p in paths:
        yield from iter_documents(p, field=field, chat_template=chat_template, txt_mode=txt_mode)
