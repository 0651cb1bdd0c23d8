"""Answer files: one Spec-Bench-compatible JSON line per question and method.

Line schema (Spec-Bench's ``choices[0]`` fields plus ours)::

    {"question_id", "category", "subcategory", "answer_id", "model_id", "method", "tstamp",
     "choices": [{"index": 0,
                  "turns": [text per turn],
                  "decoding_steps": [steps per turn],       # excl. the prefill token
                  "new_tokens": [generated tokens per turn],  # EOS excluded
                  "wall_time": [seconds per turn],          # prefill included; median of repeats
                  "accept_lengths": [per step, all turns concatenated],
                  "token_ids": [[generated ids] per turn],
                  "prompt_tokens": [per turn], "finish_reason": [per turn],
                  "wall_time_repeats": [[seconds per repeat] per turn]}]}

Invariants: a line is written (and flushed to disk) only once the question is complete,
and an existing file is only ever appended to, so completed answers are never lost.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from recallspec.data.corpus_files import iter_jsonl
from recallspec.errors import DataError

_CHOICE_LISTS = ("turns", "decoding_steps", "new_tokens", "wall_time", "token_ids")


def answers_path(out_dir: Path, method: str) -> Path:
    # Method specs may carry options with paths (``sam:index=/x/y.rsidx``).
    safe = re.sub(r"[^A-Za-z0-9+._=:,-]", "_", method)
    return out_dir / "answers" / f"{safe}.jsonl"


def validate_record(rec: Any) -> str | None:
    """None if ``rec`` is a well-formed answer record, else what is wrong."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    for key in ("question_id", "category", "choices"):
        if key not in rec:
            return f"missing field {key!r}"
    ch = rec["choices"]
    if not isinstance(ch, list) or not ch or not isinstance(ch[0], dict):
        return "'choices' must be a non-empty list of objects"
    c = ch[0]
    for key in (*_CHOICE_LISTS, "accept_lengths"):
        if not isinstance(c.get(key), list):
            return f"choices[0] lacks the list {key!r}"
    n = len(c["turns"])
    if n == 0 or any(len(c[k]) != n for k in _CHOICE_LISTS):
        return "choices[0] lists disagree on the number of turns"
    if sum(c["decoding_steps"]) != len(c["accept_lengths"]):
        return "sum(decoding_steps) != len(accept_lengths)"
    return None


def read_answers(path: Path) -> list[dict[str, Any]]:
    """All records of an answer file; a malformed line raises DataError naming file and line."""
    if not path.is_file():
        raise DataError(f"answer file {path} does not exist")
    out = []
    with open(path, encoding="utf-8") as f:
        for n, rec in iter_jsonl(f, path):
            problem = validate_record(rec)
            if problem:
                raise DataError(f"{path}:{n}: bad answer record ({problem})")
            out.append(rec)
    return out


def iter_answer_files(out_dir: Path) -> Iterator[tuple[str, Path]]:
    d = out_dir / "answers"
    if d.is_dir():
        for p in sorted(d.glob("*.jsonl")):
            yield p.stem, p


class AnswerWriter:
    """Appends records to one answer file, one flushed line each."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A torn last line has already been refused by read_answers; a complete last
        # record without its newline gets one, so records never share a line.
        needs_newline = False
        if path.is_file() and path.stat().st_size > 0:
            with open(path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                needs_newline = f.read(1) != b"\n"
        self._f: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115
        if needs_newline:
            self._f.write("\n")
        self.path = path

    def write(self, record: dict[str, Any]) -> None:
        problem = validate_record(record)
        if problem:  # a bug in the runner, not user input
            raise ValueError(f"refusing to write a bad answer record: {problem}")
        self._f.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> AnswerWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
