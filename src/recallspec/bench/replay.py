"""Exact offline acceptance replay of model-free drafters against recorded ``ar`` answers.

Under greedy decoding every lossless method commits exactly the AR tokens, so for a
drafter that needs no model logits the per-step accept lengths follow from the AR
output alone (teacher forcing). ``replay_turn`` reproduces ``Engine._admit``/``_step``
step for step: the same drafter calls (start, propose with the same ``max_nodes``,
``truncate``, ``limit_depth``, observe with the committed tokens and the tree, stop),
and the accepted path = the longest tree path matching the next AR tokens, plus the
bonus token (the next AR token), cut at EOS or the length cap as the engine cuts it.

Exactness assumes the AR output is what the model's argmax gives on the tree rows too
(true up to floating-point ties/rounding between a 1-row and a k-row forward).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

from recallspec.bench.answers import read_answers
from recallspec.drafters.base import Drafter, create_drafter
from recallspec.errors import DataError
from recallspec.spec.tree import DraftTree, limit_depth


@dataclass(frozen=True)
class ReplayConfig:
    max_new_tokens: int
    max_draft_nodes: int = 16  # EngineConfig.max_draft_nodes
    max_len: int = 4096  # KV positions per sequence (Engine.max_len)


def accepted_path(
    tree: DraftTree, target: Sequence[int], final_any: frozenset[int] = frozenset()
) -> int:
    """Length of the longest root-to-node path whose tokens are a prefix of ``target``.

    Siblings carry distinct tokens, so the walk is unique: at each node, the child
    whose token is the next target token. ``final_any``: any of these ids matches the
    last target position (an EOS whose exact id the answer file does not record).
    """
    children = tree.children()
    toks = tree.tokens.tolist()
    node, n = -1, 0
    last = len(target) - 1
    while n < len(target):
        ok = final_any if (n == last and final_any) else (target[n],)
        nxt = next((c for c in children[node + 1] if toks[c] in ok), None)
        if nxt is None:
            break
        node, n = nxt, n + 1
    return n


def replay_turn(
    drafter: Drafter, rid: int, prompt: Sequence[int], output: Sequence[int], eos_hit: bool,
    eos_ids: Sequence[int], cfg: ReplayConfig,
) -> list[int]:
    """Accept lengths the engine would record for ``drafter`` on this AR turn.

    ``output`` is the AR turn's generated ids without EOS; ``eos_hit`` says the turn
    ended on EOS (one of ``eos_ids``), which the engine commits as a token and stops.
    """
    full = [int(t) for t in output]
    final_any: frozenset[int] = frozenset()
    if eos_hit:
        if not eos_ids:
            raise DataError("an answer ended on EOS but the EOS ids are unknown")
        final_any = frozenset(int(e) for e in eos_ids)
        full.append(min(final_any))
    if not full:
        return []
    committed = 1  # the prefill samples full[0]
    drafter.start(rid, list(prompt))
    drafter.observe(rid, full[:1], DraftTree.empty(), None)
    accepts: list[int] = []
    try:
        while committed < len(full):
            start = len(prompt) + committed - 1  # cache holds prompt + committed[:-1]
            room = max(min(cfg.max_len - start - 1, cfg.max_draft_nodes), 0)
            want = cfg.max_new_tokens - committed - 1
            tree = limit_depth(drafter.propose(rid, room).truncate(room), want)
            n = accepted_path(tree, full[committed:], final_any)
            # The bonus token is the next AR token; when the path reaches the end of the
            # output, that end is an EOS (the depth limit keeps paths inside the length
            # cap) and the engine stops right after committing it.
            take = min(n + 1, len(full) - committed)
            taken = full[committed : committed + take]
            committed += take
            accepts.append(take)
            drafter.observe(rid, taken, tree, None)
    finally:
        drafter.stop(rid)
    return accepts


def replay_answers(
    records: Sequence[dict[str, Any]], method: str, cfg: ReplayConfig,
    drafter_options: dict[str, Any] | None = None,
) -> dict[str, list[int]]:
    """question_id -> replayed accept lengths (all turns, concatenated)."""
    drafter = create_drafter(method, **(drafter_options or {}))
    if drafter.needs_logits:
        raise DataError(f"drafter {method!r} needs model logits and cannot be replayed offline")
    rids = count()
    out: dict[str, list[int]] = {}
    for rec in records:
        c = rec["choices"][0]
        prompts = c.get("prompt_ids")
        if prompts is None:
            raise DataError(
                f"answer for question {rec['question_id']} has no prompt_ids (written by an "
                "older version?); re-run the ar method"
            )
        eos = rec.get("eos_token_ids") or []
        acc: list[int] = []
        for p, toks, fin in zip(prompts, c["token_ids"], c["finish_reason"], strict=True):
            acc += replay_turn(drafter, next(rids), p, toks, fin == "eos", eos, cfg)
        out[str(rec["question_id"])] = acc
    return out


def load_ar_answers(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Records of an ``ar`` answer file and the run settings next to it (may be {})."""
    recs = read_answers(path)
    if not recs:
        raise DataError(f"{path} holds no answers")
    bad = [r for r in recs if r.get("method", "ar") != "ar"]
    if bad:
        raise DataError(
            f"{path}: replay needs answers of the ar method, found {bad[0]['method']!r}"
        )
    settings: dict[str, Any] = {}
    run = path.parent.parent / "run.json"
    if run.is_file():
        settings = json.loads(run.read_text(encoding="utf-8")).get("settings", {})
    if settings.get("temperature", 0.0) != 0.0:
        raise DataError("replay is exact only for greedy (temperature 0) ar answers")
    return recs, settings


def replay_report(
    records: Sequence[dict[str, Any]], replayed: dict[str, dict[str, list[int]]],
) -> dict[str, Any]:
    """{method: {category | "overall": {"mat", "steps", "questions"}}}."""
    cats: list[str] = []
    for r in records:
        if r["category"] not in cats:
            cats.append(r["category"])
    rep: dict[str, Any] = {}
    for m, acc in replayed.items():
        per: dict[str, Any] = {}
        for cat in [*cats, "overall"]:
            qids = [str(r["question_id"]) for r in records if cat in ("overall", r["category"])]
            pooled = [a for q in qids for a in acc[q]]
            per[cat] = {
                "questions": len(qids), "steps": len(pooled),
                "mat": statistics.fmean(pooled) if pooled else None,
            }
        rep[m] = per
    return rep


def render_replay_markdown(rep: dict[str, Any]) -> str:
    methods = list(rep)
    if not methods:
        return ""
    cats = list(rep[methods[0]])
    lines = [
        "| category | " + " | ".join(f"{m} MAT" for m in methods) + " |",
        "|---|" + "---|" * len(methods),
    ]
    for c in cats:
        cells = [
            "-" if rep[m][c]["mat"] is None else f"{rep[m][c]['mat']:.3f}" for m in methods
        ]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
