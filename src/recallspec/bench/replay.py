"""Exact offline acceptance replay of model-free drafters against recorded ``ar`` answers.

Under greedy decoding every lossless method commits exactly the AR tokens, so for a
drafter that needs no model logits the per-step accept lengths follow from the AR
output alone (teacher forcing). ``replay_turn`` reproduces ``Engine._admit``/``_step``
step for step: the same drafter calls (start, propose with the same ``max_nodes``,
``truncate``, ``limit_depth``, observe with the committed tokens and the tree, stop),
and the accepted path = the longest tree path matching the next AR tokens, plus the
bonus token (the next AR token), cut at EOS or the length cap as the engine cuts it.
``replay_steps`` runs any ``Policy`` (how a request drafts) through the same loop and
records each step's draft size and context: what ``bench/replay_time.py`` prices.

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
from typing import Any, Protocol

import torch

from recallspec.bench.answers import read_answers
from recallspec.bench.replay_logits import TurnTopk, committed_logits
from recallspec.drafters.base import Drafter, create_drafter
from recallspec.errors import DataError
from recallspec.params import DEFAULT_SIZING, MAX_DRAFT_NODES, Sizing
from recallspec.spec.draft_sizing import draft_room
from recallspec.spec.tree import DraftTree, limit_depth


@dataclass(frozen=True)
class ReplayConfig:
    max_new_tokens: int
    max_draft_nodes: int = MAX_DRAFT_NODES  # EngineConfig.max_draft_nodes
    max_len: int = 4096  # KV positions per sequence (Engine.max_len)
    # How a method named without a sizing is sized: what it meant where its answers were
    # recorded (``bench/methods.py``'s ``recorded_sizing_default`` of the run.json).
    sizing_default: Sizing = DEFAULT_SIZING


def accepted_nodes(
    tree: DraftTree, target: Sequence[int], final_any: frozenset[int] = frozenset()
) -> list[int]:
    """The nodes of the longest root-to-node path whose tokens are a prefix of
    ``target``, root side first.

    Siblings carry distinct tokens, so the walk is unique: at each node, the child
    whose token is the next target token. ``final_any``: any of these ids matches the
    last target position (an EOS whose exact id the answer file does not record).
    """
    children = tree.children()
    toks = tree.tokens.tolist()
    node, path = -1, list[int]()
    last = len(target) - 1
    while len(path) < len(target):
        n = len(path)
        ok = final_any if (n == last and final_any) else (target[n],)
        nxt = next((c for c in children[node + 1] if toks[c] in ok), None)
        if nxt is None:
            break
        node = nxt
        path.append(nxt)
    return path


def accepted_path(
    tree: DraftTree, target: Sequence[int], final_any: frozenset[int] = frozenset()
) -> int:
    """Length of the longest root-to-node path whose tokens are a prefix of ``target``."""
    return len(accepted_nodes(tree, target, final_any))


@dataclass(frozen=True)
class StepRecord:
    """One replayed verification step."""

    committed: int  # tokens it committed: accepted draft tokens + the bonus token
    drafted: int  # draft nodes verified (the forward has 1 + drafted rows)
    context: int  # tokens cached before it (prompt + committed so far - 1)


# What replay knows of a verification's logits: the committed path as a chain and its
# rows' logits (``bench/replay_logits.py``), for drafters that learn from logits.
Known = tuple[DraftTree, torch.Tensor]


class Policy(Protocol):
    """How a replayed request drafts: a drafter alone (``FixedPolicy``), or a drafter
    with cost-aware sizing, an oracle, ... (``bench/replay_policies.py``)."""

    name: str

    def start(self, rid: int, prompt: Sequence[int], first: int, known: Known | None = None,
              ) -> None:
        """A new request; ``first`` is the token its prefill committed (``known``: the
        prefill row's logits, as an empty tree and one row)."""

    def draft(
        self, rid: int, room: int, want: int, future: Sequence[int], final_any: frozenset[int]
    ) -> DraftTree:
        """This step's tree: at most ``room`` nodes and ``want`` deep. ``future`` (the
        tokens the step will commit, ``final_any`` as ``accepted_nodes``) is there for
        oracles only; a real policy must not look at it."""

    def observe(
        self, rid: int, taken: Sequence[int], tree: DraftTree, accepted: Sequence[int],
        known: Known | None = None,
    ) -> None:
        """After verification: ``taken`` committed, ``accepted`` nodes of ``tree``."""

    def stop(self, rid: int) -> None: ...


def drafter_view(
    drafter: Drafter, tree: DraftTree, known: Known | None,
) -> tuple[DraftTree, torch.Tensor | None]:
    """The tree and logits a replayed drafter observes: the verified tree without logits,
    or for a drafter that learns from logits the committed rows replay knows."""
    if known is not None and drafter.needs_logits:
        return known
    return tree, None


class FixedPolicy:
    """A drafter's proposal cut only to the room (the engine's fixed sizing).
    Drafters that learn from verification logits get none (``logits=None``)."""

    def __init__(self, drafter: Drafter, name: str | None = None) -> None:
        self.drafter = drafter
        self.name = name or drafter.name

    def start(self, rid: int, prompt: Sequence[int], first: int, known: Known | None = None,
              ) -> None:
        self.drafter.start(rid, list(prompt))
        self.drafter.observe(rid, [first], *drafter_view(self.drafter, DraftTree.empty(), known))

    def draft(
        self, rid: int, room: int, want: int, future: Sequence[int], final_any: frozenset[int]
    ) -> DraftTree:
        return limit_depth(self.drafter.propose(rid, room).truncate(room), want)

    def observe(
        self, rid: int, taken: Sequence[int], tree: DraftTree, accepted: Sequence[int],
        known: Known | None = None,
    ) -> None:
        self.drafter.observe(rid, list(taken), *drafter_view(self.drafter, tree, known))

    def stop(self, rid: int) -> None:
        self.drafter.stop(rid)


def replay_steps(
    policy: Policy, rid: int, prompt: Sequence[int], output: Sequence[int], eos_hit: bool,
    eos_ids: Sequence[int], cfg: ReplayConfig, topk: TurnTopk | None = None, vocab: int = 0,
) -> list[StepRecord]:
    """The steps the engine would run for ``policy`` on this AR turn.

    ``output`` is the AR turn's generated ids without EOS; ``eos_hit`` says the turn
    ended on EOS (one of ``eos_ids``), which the engine commits as a token and stops.
    ``topk``/``vocab``: the model's top-k along the turn (``bench/replay_logits.py``),
    for policies whose drafter learns from logits.
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
    def known(start: int, path_tokens: list[int]) -> Known | None:
        if topk is None:
            return None
        rows = topk[start : start + len(path_tokens) + 1]
        # A path that reaches the turn's last token has no row after it in the answer
        # (the turn ends there): that last node's row is left out.
        return committed_logits(path_tokens[: len(rows) - 1], rows, vocab)

    committed = 1  # the prefill samples full[0]
    policy.start(rid, prompt, full[0], known(0, []))
    steps: list[StepRecord] = []
    try:
        while committed < len(full):
            start = len(prompt) + committed - 1  # cache holds prompt + committed[:-1]
            room = draft_room(cfg.max_len, start, cfg.max_draft_nodes)
            want = cfg.max_new_tokens - committed - 1
            future = full[committed:]
            tree = policy.draft(rid, room, want, future, final_any)
            path = accepted_nodes(tree, future, final_any)
            # The bonus token is the next AR token; when the path reaches the end of the
            # output, that end is an EOS (the depth limit keeps paths inside the length
            # cap) and the engine stops right after committing it.
            take = min(len(path) + 1, len(full) - committed)
            taken = full[committed : committed + take]
            seen = known(committed, taken[: len(path)])
            committed += take
            steps.append(StepRecord(take, len(tree), start))
            policy.observe(rid, taken, tree, path, seen)
    finally:
        policy.stop(rid)
    return steps


def replay_turn(
    drafter: Drafter, rid: int, prompt: Sequence[int], output: Sequence[int], eos_hit: bool,
    eos_ids: Sequence[int], cfg: ReplayConfig,
) -> list[int]:
    """Accept lengths the engine would record for ``drafter`` on this AR turn (fixed
    mode; see ``replay_steps``)."""
    steps = replay_steps(FixedPolicy(drafter), rid, prompt, output, eos_hit, eos_ids, cfg)
    return [s.committed for s in steps]


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
