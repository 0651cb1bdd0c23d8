"""Self-generated corpora (SAM-Decoding's static corpus): the model's own answers to
instruction prompts, sampled (T = 0.8 in the paper) from prompt files in any format the
corpus readers know (Alpaca, ShareGPT, GSM8K, MBPP, Spec-Bench questions, ...).

Output: one JSON line per prompt, in the Spec-Bench answer shape that ``recallspec
index build`` reads as assistant text (``choices[0].turns``), plus the prompt and the
sampling settings. Runs are resumable: prompts whose id is already in the file are
skipped, and a last line cut by an interruption is dropped (complete lines are never
rewritten). Each prompt's sampling seed derives from its id, so a resumed run writes what
an uninterrupted one would have (with the same settings and drafter).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recallspec.data.corpus_files import iter_records, record_messages
from recallspec.decoding.sampling import SamplingParams
from recallspec.errors import DataError


@dataclass(frozen=True)
class SelfGenConfig:
    max_new_tokens: int = 256
    temperature: float = 0.8
    top_p: float = 1.0
    batch_size: int = 8  # prompts decoded together
    limit: int | None = None  # prompts taken in total (over all files, in order)
    per_file: int | None = None  # prompts taken from each file (its first ones), then limit
    max_prompt_tokens: int = 1024  # longer prompts are skipped
    seed: int = 0
    # Any drafter: the output distribution is the model's either way. As ``Engine.generate``
    # takes it: a registered name, or a ``DrafterSpec`` (the command line's
    # ``name:key=value:...``, parsed there). Typed loosely: data/ sits below drafters/.
    drafter: Any = "none"

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or self.batch_size < 1 or self.temperature < 0:
            raise DataError("need max_new_tokens >= 1, batch_size >= 1, temperature >= 0")
        if self.limit is not None and self.limit < 1:
            raise DataError("limit must be >= 1")
        if self.per_file is not None and self.per_file < 1:
            raise DataError("per_file must be >= 1")


def iter_prompts(
    files: Sequence[str | os.PathLike[str]], per_file: int | None = None,
) -> Iterator[tuple[str, str]]:
    """(id, first user message) of every record that has one, file by file; with
    ``per_file``, only each file's first ``per_file`` such records (a mixed corpus)."""
    for f in files:
        p = Path(f)
        if not p.is_file():
            raise DataError(f"prompt file {p} does not exist")
        taken = 0
        for i, rec in enumerate(iter_records(p)):
            if per_file is not None and taken >= per_file:
                break
            users = [m["content"] for m in record_messages(rec) if m["role"] == "user"]
            if users:
                taken += 1
                yield f"{p.name}:{i}", users[0]


def read_done(out: Path) -> set[str]:
    """Ids already answered in ``out``; drops a trailing partial line (an interrupted
    write) and refuses a file with a corrupt line elsewhere."""
    if not out.exists():
        return set()
    data = out.read_bytes()
    keep = data if data.endswith(b"\n") or not data else data[: data.rfind(b"\n") + 1]
    if len(keep) != len(data):
        with out.open("r+b") as f:
            f.truncate(len(keep))
    done = set()
    for n, line in enumerate(keep.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            done.add(str(json.loads(line)["question_id"]))
        except (json.JSONDecodeError, KeyError, TypeError):
            raise DataError(
                f"{out}:{n} is not a corpus record; move the file away or choose another --out"
            ) from None
    return done


def _seed(base: int, pid: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{base}:{pid}".encode()).digest()[:8], "little") >> 1


def generate_corpus(
    engine: Any, files: Sequence[str | os.PathLike[str]], out: Path, cfg: SelfGenConfig,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, int]:
    """Answer every prompt of ``files`` not yet in ``out``; returns counts."""
    prompts = list(iter_prompts(files, cfg.per_file))
    if cfg.limit is not None:
        prompts = prompts[: cfg.limit]
    if not prompts:
        raise DataError("no prompts found in the given files")
    done = read_done(out)
    todo = [(pid, text) for pid, text in prompts if pid not in done]
    counts = {"prompts": len(prompts), "already": len(prompts) - len(todo), "written": 0,
              "skipped": 0, "tokens": 0}
    model_id = str(engine.config.model or "default")
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a", encoding="utf-8") as f:
        for i in range(0, len(todo), cfg.batch_size):
            chunk = todo[i : i + cfg.batch_size]
            ids, params, keep = [], [], []
            for pid, text in chunk:
                chat = bool(getattr(engine.tokenizer, "has_chat_template", False))
                p = engine.encode_prompt(text, chat=chat)
                if len(p) > cfg.max_prompt_tokens:
                    counts["skipped"] += 1
                    continue
                ids.append(p)
                params.append(SamplingParams(
                    temperature=cfg.temperature, top_p=cfg.top_p,
                    max_new_tokens=cfg.max_new_tokens, seed=_seed(cfg.seed, pid)))
                keep.append((pid, text))
            results = engine.generate(ids, params, drafter=cfg.drafter) if ids else []
            for (pid, text), r in zip(keep, results, strict=True):
                if r.error:
                    counts["skipped"] += 1
                    continue
                f.write(json.dumps({
                    "question_id": pid, "prompt": text, "model_id": model_id,
                    "temperature": cfg.temperature, "max_new_tokens": cfg.max_new_tokens,
                    "choices": [{"index": 0, "turns": [r.text]}],
                }, ensure_ascii=False) + "\n")
                counts["written"] += 1
                counts["tokens"] += r.new_tokens
            f.flush()
            if progress:
                progress(len(chunk), counts["tokens"])
    return counts
